"""What a run will hold in memory, estimated from its flags before anything is allocated.

A flag that asks for more memory than the machine has (``--batch-size 10**9`` on a big graph,
``--prefetch 10**6``, ``--hidden 10**8``) must be a one-line error naming the flags, not an
allocator failure deep inside PyTorch or C++ half an hour into the run, and not the kernel's
OOM killer taking the whole job. :func:`estimate_memory` bounds each part a rank holds from
the flags and the rank's graph (vertex counts, largest in-degree); :func:`check_memory`
compares their sum with the machine's physical memory.

The bounds are upper bounds built from quantities known before sampling: a layer's sampled
in-edges are at most ``n_dst * min(fanout, max in-degree)``, its inputs at most
``min(n_local, n_dst + edges)``. They are tight for the large batches the check is for (a
batch that covers the graph) and loose, never low, for small ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distmb.config.train import TrainConfig, flag_of
from distmb.core import machine
from distmb.core.errors import InputError
from distmb.core.units import FLOAT32_BYTES
from distmb.nn.models import parameter_count, stack_widths
from distmb.pipeline.features.storage import STORAGE_DTYPES

#: float32 values per parameter during training: weights, gradients, Adam's two moments.
TRAINING_VALUES_PER_PARAMETER = 4
#: Bytes per sampled edge of a block: its source position (int64) and the CSR's share (int64).
BLOCK_BYTES_PER_EDGE = 16
#: Bytes per destination or source of a block: ids and pointers (int64 each).
BLOCK_BYTES_PER_VERTEX = 16
#: float32 values a layer keeps per destination and input width for the backward pass
#: (aggregated input, self input) and per output width (pre-activation, dropout mask,
#: output), doubled for their gradients.
ACTIVATION_VALUES_PER_INPUT_WIDTH = 2 * 2
ACTIVATION_VALUES_PER_OUTPUT_WIDTH = 3 * 2
#: float32 values GAT keeps per sampled edge and head (logits, softmax, dropout, gradients).
GAT_VALUES_PER_EDGE_HEAD = 4
#: Batches the BatchLoader holds beyond ``--prefetch``: the one training, and the one being
#: made (:class:`distmb.pipeline.BatchLoader` reuses at most ``prefetch + 2`` buffers).
LOADER_EXTRA_BATCHES = 2
#: Tables layer-wise evaluation holds at once: one layer's inputs and its outputs.
EVALUATION_TABLES = 2


@dataclass(frozen=True)
class MemoryItem:
    """One part of a rank's memory.

    Args:
        what: what is held, in words.
        options: the options (:class:`TrainConfig` fields) that size it.
        nbytes: the bound, in bytes.
    """

    what: str
    options: tuple[str, ...]
    nbytes: int

    @property
    def flags(self) -> tuple[str, ...]:
        """The options as written on the command line (``--batch-size``, ...)."""
        return tuple(flag_of(name) for name in self.options)


@dataclass(frozen=True)
class GraphShape:
    """The counts of one rank's graph that the estimate needs.

    Args:
        n_solid: vertices this rank owns.
        n_local: solid + halo vertices.
        n_train: training vertices of this rank.
        feat_dim: input features per vertex.
        num_classes: output classes.
        max_in_degree: the largest in-degree of a solid vertex.
        n_send: rows in this rank's send lists (0 on one rank).
    """

    n_solid: int
    n_local: int
    n_train: int
    feat_dim: int
    num_classes: int
    max_in_degree: int
    n_send: int = 0

    @classmethod
    def of(cls, local) -> GraphShape:
        """From a :class:`distmb.data.local.LocalGraph` (reads ``indptr`` once)."""
        degrees = np.diff(np.asarray(local.indptr))
        store = local.store
        return cls(
            n_solid=int(local.n_solid),
            n_local=int(local.n_local),
            n_train=int(np.asarray(local.train_idx).size),
            feat_dim=int(local.feat_dim),
            num_classes=int(local.num_classes),
            max_in_degree=int(degrees.max()) if degrees.size else 0,
            n_send=int(store.send_ids.size) if store is not None else 0,
        )


def layer_widths(config: TrainConfig, feat_dim: int, num_classes: int) -> list[tuple[int, int]]:
    """``(input width, output width)`` of every layer, input layer first (GAT: all heads)."""
    heads = config.heads if config.model == "gat" else 1
    return stack_widths(feat_dim, config.hidden * heads, num_classes * heads, config.layers)


def sampled_sizes(
    batch: int, fanout: Sequence[int], n_local: int, max_in_degree: int
) -> list[tuple[int, int, int]]:
    """Upper bounds of ``(n_dst, n_edges, n_src)`` of every block of one mini-batch of
    ``batch`` seeds, input layer first (fan-out ``-1`` = every in-neighbour)."""
    sizes = []
    n_dst = batch
    for f in reversed(list(fanout)):
        per_dst = max_in_degree if f < 0 else min(f, max_in_degree)
        edges = n_dst * per_dst
        n_src = min(n_local, n_dst + edges)
        sizes.append((n_dst, edges, n_src))
        n_dst = n_src
    return sizes[::-1]


def estimate_memory(
    config: TrainConfig, graph: GraphShape, num_ranks: int, params: int | None = None
) -> list[MemoryItem]:
    """What one rank holds for ``config`` on ``graph``, item by item (bytes, upper bounds).

    Args:
        params: the model's parameter count when it is already built (a user's model);
            default: counted from the flags for the built-in ``config.model``.
    """
    f32 = FLOAT32_BYTES
    widths = layer_widths(config, graph.feat_dim, graph.num_classes)
    model_options = ("hidden", "layers") + (("heads",) if config.model == "gat" else ())
    if params is None:
        params = parameter_count(
            config.model,
            graph.feat_dim,
            config.hidden,
            graph.num_classes,
            config.layers,
            config.heads,
            config.aggr,
            config.gin_train_eps,
        )
    items = [
        MemoryItem(
            f"the {config.model} model ({params:,} parameters): weights, gradients, Adam state",
            model_options,
            params * TRAINING_VALUES_PER_PARAMETER * f32,
        )
    ]
    batch = min(config.batch_size, max(graph.n_train, 1))
    sizes = sampled_sizes(batch, config.fanout, graph.n_local, graph.max_in_degree)
    block_bytes = sum(
        e * BLOCK_BYTES_PER_EDGE + (d + s) * BLOCK_BYTES_PER_VERTEX for d, e, s in sizes
    )
    input_bytes = sizes[0][2] * graph.feat_dim * f32
    steps = -(-graph.n_train // max(config.batch_size, 1))  # batches per epoch
    in_flight = min(config.prefetch, steps) + LOADER_EXTRA_BATCHES
    items.append(
        MemoryItem(
            f"{in_flight} mini-batches in flight: sampled blocks and gathered input features",
            ("batch_size", "fanout", "prefetch"),
            in_flight * (block_bytes + input_bytes),
        )
    )
    activations = sum(
        d * (ACTIVATION_VALUES_PER_INPUT_WIDTH * w_in + ACTIVATION_VALUES_PER_OUTPUT_WIDTH * w_out)
        for (d, _, _), (w_in, w_out) in zip(sizes, widths, strict=True)
    )
    if config.model == "gat":
        activations += sum(e * config.heads * GAT_VALUES_PER_EDGE_HEAD for _, e, _ in sizes)
    items.append(
        MemoryItem(
            "one mini-batch's activations and their gradients",
            ("batch_size", "fanout", "hidden") + model_options[2:],
            activations * f32,
        )
    )
    features = config.features or "mmap"
    if features == "ooc" and config.cache_policy == "belady":
        items.append(
            MemoryItem(
                f"a superbatch of {min(config.superbatch, steps)} sampled mini-batches "
                "(belady inspector)",
                ("superbatch", "batch_size", "fanout"),
                min(config.superbatch, steps) * block_bytes,
            )
        )
    if features != "ooc" and config.feature_dtype != "float32":
        # --feature-dtype: the table converted into RAM, whether --features is memory or mmap
        items.append(
            MemoryItem(
                f"the feature table stored as {config.feature_dtype} in memory",
                ("feature_dtype", "features"),
                graph.n_local * graph.feat_dim * STORAGE_DTYPES[config.feature_dtype].itemsize,
            )
        )
    elif features == "memory":
        items.append(
            MemoryItem(
                "the feature table loaded into memory",
                ("features",),
                graph.n_local * graph.feat_dim * f32,
            )
        )
    widest = max(max(w_in, w_out) for w_in, w_out in widths)
    eval_block = sampled_sizes(
        min(config.eval_batch_size, graph.n_solid), [-1], graph.n_local, graph.max_in_degree
    )[0]
    items.append(
        MemoryItem(
            "exact evaluation: one layer's inputs and outputs for every vertex, and a block",
            ("hidden", "eval_batch_size"),
            EVALUATION_TABLES * graph.n_local * widest * f32
            + eval_block[1] * BLOCK_BYTES_PER_EDGE
            + eval_block[2] * widest * f32,
        )
    )
    if num_ranks > 1 and config.halo_scheme == "hec":
        n_halo = graph.n_local - graph.n_solid
        lines = min(config.hec_size, n_halo)
        cached = [w_in for w_in, _ in widths[1:]]  # layers >= 1 read halo embeddings
        items.append(
            MemoryItem(
                f"historical embedding caches ({lines:,} lines per layer)",
                ("hec_size",),
                lines * sum(cached) * f32,
            )
        )
        rows_per_push = min(config.hec_nc * (num_ranks - 1), graph.n_send)
        pushes = min(config.hec_delay, steps) + 1
        items.append(
            MemoryItem(
                f"{pushes} embedding pushes in flight (sent and received rows)",
                ("hec_nc", "hec_delay"),
                2 * pushes * rows_per_push * sum(w + 2 for w in cached) * f32,
            )
        )
    return items


def check_memory(
    config: TrainConfig, graph: GraphShape, num_ranks: int, params: int | None = None
) -> list[MemoryItem]:
    """Refuse, naming the flags of the largest parts, a run whose estimate exceeds this
    machine's physical memory; returns the items (nothing is checked where the memory size
    is unknown). ``params``: as in :func:`estimate_memory`."""
    items = estimate_memory(config, graph, num_ranks, params)
    have = machine.physical_memory_bytes()
    need = sum(item.nbytes for item in items)
    if have is None or need <= have:
        return items
    largest = sorted(items, key=lambda item: item.nbytes, reverse=True)
    parts = "; ".join(
        f"{item.what}: {item.nbytes / 2**30:.1f} GiB ({_flags(config, item.options)})"
        for item in largest
        if item.nbytes >= need / 100
    )
    raise InputError(
        f"{_flags(config, largest[0].options)}: this run needs about {need / 2**30:.1f} GiB per "
        f"rank and this machine has {have / 2**30:.1f} GiB of memory. {parts}. Lower the flags "
        "of the largest part"
    )


def _flags(config: TrainConfig, options: Sequence[str]) -> str:
    """``--batch-size 1000 --fanout 5,10,15``: ``options`` with this run's values."""
    out = []
    for name in options:
        value = getattr(config, name)
        if isinstance(value, tuple | list):
            value = ",".join(str(v) for v in value)
        out.append(f"{flag_of(name)} {value}")
    return " ".join(out)


__all__ = [
    "GraphShape",
    "MemoryItem",
    "check_memory",
    "estimate_memory",
    "layer_widths",
    "sampled_sizes",
]
