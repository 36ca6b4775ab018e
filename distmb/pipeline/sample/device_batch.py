"""A whole mini-batch of the device sampler with one host read (the Triton path).

:class:`~distmb.pipeline.sample.device.DeviceNeighborSampler` reads the host once per layer
when it sizes each layer by the one above (:mod:`distmb.pipeline.sample.device`). Here every
layer is sized by a **bound** known before anything is read, so all layers are sampled first
and every size and error count of the batch is read back in one
:func:`~distmb.core.host_reads.host_values` at the end.

**Bounds.** The top layer's destinations are the seeds, ``D_top = n_seeds``. A layer of
``D`` destinations with fan-out ``f`` has ``m = D x (1 + f)`` Fused-Map keys (the
destinations, then ``f`` slots a row), so at most ``m`` sources; its computed sources (the
next layer's destinations) are distinct solid ids, so at most ``n_solid`` of them too:

    ``D_below = min(D x (1 + f), n_solid)``

(:func:`destination_bounds`). A layer is laid out over ``D`` rows whatever its true size:
the valid rows are a prefix, ``[0, n_valid)``, with ``n_valid`` an int64 device scalar
(the layer above's ``n_dst + n_new_solid``, never read on the host), and the rows past it
are unused rows of degree 0 whose key is ``dst[0]`` (the layer kernel's ``n_valid``,
:func:`~distmb.pipeline.sample.choose_triton.choose_layer`): Fused-Map has seen ``dst[0]``
at position 0, so an unused row is never a source, never new and never a repeat.

**Per layer, five launches** (the Triton Fused-Map; :mod:`distmb.pipeline.sample.
relabel_triton`), none of them waiting for the host:

1. the layer kernel writes the keys (``D`` destinations, then ``D x f`` slots) and the row
   sizes (0 for unused rows);
2. the hash-table insert of the keys, into the layer's table (every layer's table is cut
   from one buffer filled by one launch at the batch's start);
3. the count kernel: first occurrences, their class (destination, new solid, new halo) and
   rank within their program, per-program counts;
4. the scan, one program: the per-program counts' prefix sums and the layer's counts
   (:data:`~distmb.pipeline.sample.relabel_triton.STATS`, a row of the batch's ``stats``);
5. the relabel kernel: every key's source position, ``src_ids: int64[m + 1]`` (its first
   ``n_src`` entries), the block's ``indptr: int64[D + 1]`` (unused rows add 0) and
   ``indices: int64[D x f + 1]`` (its first ``nnz`` entries);

the next layer's destinations are the first ``D_below`` entries of ``src_ids``, their count
``n_dst + n_new_solid`` (capped at ``D_below``: ``n_next``) a view of the ``stats`` row. The
batch adds one launch, the tables' fill, and allocations (``torch.empty``, no launch). With
the torch Fused-Map
(``backend="torch"``; the sampler reads once per layer then, :func:`sample_one_read` keeps
it as a second implementation) steps 2 to 5 are
:meth:`~distmb.pipeline.sample.idmap.PendingMap.finish_on_device` and the CSR's scatter in
PyTorch ops.

Then one read takes the batch's ``stats`` (every layer's counts: new solid, new halo,
repeated destinations, negative keys, ``n_dst + n_new_solid``, edges, and destinations
outside the solid range, which in the top layer are the bad seeds); errors are raised as the
per-layer path raises them (bad seed, then per layer from the top: negative key, repeated
destination), and the blocks are views of the buffers cut to their exact sizes
(``indptr[:n_dst + 1]``, ``indices[:nnz]``, ``src_ids[:n_src]``). A bad or repeated seed
is only known at the read, after the layers below have run on its consequences (an
out-of-range id as a destination, a ``src_ids`` entry never written): the layer kernel
clamps row ids into the CSR, so nothing is read outside it, and the top layer's counts are
checked first, so the error is the seed's.

**The same blocks as the per-layer path.** The layer kernel's random words are keyed by
``(batch seed, layer, row index, step)`` and the valid rows are a prefix in both layouts, so
every valid row draws the same words; Fused-Map numbers keys by first appearance, and the
padding and unused rows only repeat ``dst[0]``, so the sources come out in the same order.
The blocks are equal (``tests/test_sampler_one_read.py``). The torch layer kernel, whose
random words depend on the row count, keeps the per-layer path, as do ``FANOUT_ALL`` layers
(their size is the data's) and the torch Fused-Map (``torch.unique`` reads its size).

**Memory and work** grow with the bounds, not the sampled sizes: the input layer of a
3-layer batch of ``B`` seeds has ``B (1 + f_3)(1 + f_2)(1 + f_1)`` keys unless ``n_solid``
caps it (fan-out 15, 10, 5 and ``B = 1024``: 1,081,344 keys, where a sampled batch holds
fewer distinct sources); each key costs the layer kernel's work (``O(f^2)`` a row),
Fused-Map's insert and a few reads and writes of the three kernels after it, sampled or
not. Above :data:`MAX_ONE_READ_KEYS` keys in any layer the sampler reads once per layer
instead (:func:`fits_one_read`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from distmb.core.host_reads import host_values
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.choose_triton import choose_layer, layer_key
from distmb.pipeline.sample.idmap import (
    Backend,
    DestinationCount,
    raise_map_errors,
    resolve_backend,
    start_map,
)
from distmb.pipeline.sample.relabel_triton import (
    BAD_DST,
    EDGES,
    N_NEXT,
    NEGATIVE,
    NEW_HALO,
    NEW_SOLID,
    REPEATED,
    STATS_WIDTH,
    Table,
    empty_tables,
    relabel_layer,
)

#: The most Fused-Map keys (``D x (1 + fanout)``, :func:`destination_bounds`) any layer of a
#: one-read batch may have (16,777,216); a batch whose bounds go above it is sampled one read
#: per layer. At the limit the largest layer holds up to about 1.7 GB until the batch's read
#: (about 57 to 100 bytes a key, :func:`fits_one_read`).
MAX_ONE_READ_KEYS = 1 << 24


def destination_bounds(n_seeds: int, fanouts: Sequence[int], n_solid: int) -> list[int]:
    """The bound on every layer's destination count (index: the layer, as ``fanouts``):
    ``n_seeds`` at the top, then ``min(D x (1 + fanout), n_solid)`` below a layer of ``D``
    destinations (module docstring). ``fanouts``: positive (no ``FANOUT_ALL``)."""
    bounds = [0] * len(fanouts)
    d = n_seeds
    for layer in range(len(fanouts) - 1, -1, -1):
        bounds[layer] = d
        d = min(d * (1 + fanouts[layer]), n_solid)
    return bounds


def fits_one_read(n_seeds: int, fanouts: Sequence[int], n_solid: int) -> bool:
    """Whether every layer's key count ``D x (1 + fanout)`` is at most
    :data:`MAX_ONE_READ_KEYS` (read at call time, so a test may lower it).

    Memory per key of a layer (the Triton Fused-Map), ``f`` its fan-out: until the batch's
    read, 57 to 89 bytes: ``keys`` and ``src_ids`` 8 each, ``indices`` with ``indptr``
    8 (+ ``8 / (1 + f)``), the first-occurrence flags 1, and the layer's hash table at 2 to
    4 slots of 16 bytes (every layer's table is cut from one buffer of the batch); while
    the layer runs, ``8 + 16 / (1 + f)`` more (the keys' slots, the row sizes and their
    in-program sums)."""
    bounds = destination_bounds(n_seeds, fanouts, n_solid)
    keys = (d * (1 + f) for d, f in zip(bounds, fanouts, strict=True))
    return max(keys, default=0) <= MAX_ONE_READ_KEYS


class BoundExceeded(RuntimeError):
    """A batch had more destinations in a layer than the rows it was launched with (bounds
    smaller than :func:`destination_bounds`; the batch must be sampled again with larger
    ones).

    Attributes:
        layer: the layer (as ``fanouts``); n_dst: its destinations; bound: its rows.
    """

    def __init__(self, layer: int, n_dst: int, bound: int) -> None:
        super().__init__(f"layer {layer}: {n_dst} destinations exceed its bound {bound}")
        self.layer, self.n_dst, self.bound = layer, n_dst, bound


@dataclass
class BoundedLayer:
    """One layer sampled by its bound ``D`` (``m = D x (1 + fanout)`` keys), before the read.

    Attributes:
        indptr: int64[D + 1], the block's CSR (unused rows add 0).
        indices: int64[D x fanout + 1], the block's edges in their first ``nnz`` entries.
        src_ids: int64[m + 1], the block's sources in their first ``n_src`` entries.
        keys: int64[m], the Fused-Map keys, and ``first``: bool[m], their first-occurrence
            flags, kept for the error messages.
        stats: int64[STATS_WIDTH] on the device, all the counts the batch reads
            (:data:`~distmb.pipeline.sample.relabel_triton.STATS`).
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    src_ids: torch.Tensor
    keys: torch.Tensor
    first: torch.Tensor
    stats: torch.Tensor

    @property
    def n_next(self) -> torch.Tensor:
        """int64 device scalar (a view of :attr:`stats`): the next layer's valid rows,
        ``n_dst + n_new_solid`` capped at the next layer's bound (:func:`launch_batch`)."""
        return self.stats[N_NEXT]


def sample_layer_bounded(
    csr_indptr: torch.Tensor,
    csr_indices: torch.Tensor,
    dst: torch.Tensor,
    n_dst: DestinationCount,
    fanout: int,
    key: int,
    n_solid: int,
    backend: Backend,
    table: Table | None = None,
    stats: torch.Tensor | None = None,
    next_bound: int | None = None,
) -> BoundedLayer:
    """One layer over the ``D`` rows of ``dst`` (int64[D] on the device, ``D >= 1``), of
    which the first ``n_dst`` are its destinations (a host int, or an int64 device scalar
    in ``[1, D]``); ``key``: the layer's random key; the CSR as the sampler's;
    ``next_bound``: the rows of the layer below (``None``: no layer below), which caps
    :attr:`BoundedLayer.n_next`.

    ``table``: the layer's empty hash table (:func:`~distmb.pipeline.sample.relabel_triton.
    empty_tables`; ``None``: allocated here), for the Triton Fused-Map (five launches,
    module docstring); ``stats``: int64[STATS_WIDTH] to write the layer's counts to
    (``None``: allocated here)."""
    if resolve_backend(backend, dst.device) != "triton":
        return _layer_bounded_torch(csr_indptr, csr_indices, dst, n_dst, fanout, key, n_solid,
                                    backend, stats, next_bound)  # fmt: skip
    n_valid = n_dst if isinstance(n_dst, torch.Tensor) else None
    chosen = choose_layer(
        csr_indptr, csr_indices, dst, dst, fanout, key, with_valid=False, n_valid=n_valid
    )
    mapped = relabel_layer(chosen.keys, chosen.count, fanout, n_dst, n_solid, table, stats,
                           next_bound=next_bound)  # fmt: skip
    return BoundedLayer(
        mapped.indptr, mapped.indices, mapped.src_ids, chosen.keys, mapped.first, mapped.stats
    )


def _layer_bounded_torch(
    csr_indptr: torch.Tensor,
    csr_indices: torch.Tensor,
    dst: torch.Tensor,
    n_dst: DestinationCount,
    fanout: int,
    key: int,
    n_solid: int,
    backend: Backend,
    stats: torch.Tensor | None,
    next_bound: int | None,
) -> BoundedLayer:
    """:func:`sample_layer_bounded` with Fused-Map by PyTorch ops
    (:meth:`~distmb.pipeline.sample.idmap.PendingMap.finish_on_device`); its counts
    stacked into ``stats``."""
    d, device = int(dst.shape[0]), dst.device
    n_valid = n_dst if isinstance(n_dst, torch.Tensor) else None
    chosen = choose_layer(csr_indptr, csr_indices, dst, dst, fanout, key, n_valid=n_valid)
    assert chosen.valid is not None  # asked for
    indptr = torch.zeros(d + 1, dtype=torch.int64, device=device)
    torch.cumsum(chosen.count, 0, out=indptr[1:])
    pending = start_map(chosen.keys, n_dst, n_solid, backend)
    mapped = pending.finish_on_device()
    spare = d * fanout
    slot = torch.arange(fanout, dtype=torch.int64, device=device)
    position = torch.where(chosen.valid, (indptr[:-1].unsqueeze(1) + slot).flatten(), spare)
    indices = torch.empty(spare + 1, dtype=torch.int64, device=device)
    indices.scatter_(0, position, mapped.local[d:])
    outside = (dst < 0) | (dst >= n_solid)
    in_dst = torch.arange(d, device=device) < n_dst  # host int or device scalar
    n_next = mapped.n_computed if next_bound is None else mapped.n_computed.clamp(max=next_bound)
    row = torch.stack(
        [*mapped.counts, mapped.n_computed, indptr[-1], (outside & in_dst).sum(), n_next]
    )
    stats = row if stats is None else stats.copy_(row)
    return BoundedLayer(indptr, indices, mapped.src_ids, chosen.keys, pending.first, stats)


@dataclass
class LaunchedBatch:
    """A mini-batch's layers launched by their bounds (:func:`launch_batch`), before its read.

    Attributes:
        bounds: every layer's destination bound (index: the layer, as ``fanouts``).
        layers: the layers, top first.
        stats: int64[n_layers, STATS_WIDTH] on the device, row ``at`` the counts of the
            ``at``-th layer from the top (its layer's :attr:`BoundedLayer.stats` are views).
    """

    bounds: list[int]
    layers: list[BoundedLayer]
    stats: torch.Tensor


def launch_batch(
    csr_indptr: torch.Tensor,
    csr_indices: torch.Tensor,
    seeds: torch.Tensor,
    fanouts: Sequence[int],
    keys: Sequence[int] | torch.Tensor,
    n_solid: int,
    backend: Backend,
    bounds: Sequence[int] | None = None,
) -> LaunchedBatch:
    """Every layer of one mini-batch, sized by its bound, launched without a host read
    (arguments as :func:`sample_one_read`; ``keys[layer]``: the layer's random key
    (:func:`~distmb.pipeline.sample.choose_triton.layer_key`), Python ints, or an int64
    tensor on the device holding them as signed words, read by the layer kernel: what
    :mod:`distmb.pipeline.sample.graphed` captures). The layers' sizes depend on
    ``seeds.shape``, ``fanouts`` and ``bounds`` only.

    ``bounds``: every layer's destination rows (index: the layer; the top one
    ``n_seeds``); ``None``: :func:`destination_bounds`, which every batch fits. Smaller
    bounds (:mod:`~distmb.pipeline.sample.graphed`'s fitted ones) do less work; a layer
    whose computed sources exceed the rows of the layer below has that layer sample a
    prefix of them (:attr:`BoundedLayer.n_next`), and :func:`batch_blocks` raises
    :class:`BoundExceeded` for the batch."""
    if bounds is None:
        bounds = destination_bounds(int(seeds.shape[0]), fanouts, n_solid)
    bounds = list(bounds)
    n_layers, device = len(fanouts), seeds.device
    top_first = range(n_layers - 1, -1, -1)
    stats = torch.empty((n_layers, STATS_WIDTH), dtype=torch.int64, device=device)
    tables: list[Table | None] = [None] * n_layers
    if resolve_backend(backend, device) == "triton":
        key_counts = [bounds[layer] * (1 + fanouts[layer]) for layer in top_first]
        tables = list(empty_tables(key_counts, device))
    layers: list[BoundedLayer] = []
    dst, n_dst = seeds, int(seeds.shape[0])
    for at, layer in enumerate(top_first):
        if layers:
            dst, n_dst = layers[-1].src_ids[: bounds[layer]], layers[-1].n_next
        key = keys[layer : layer + 1] if isinstance(keys, torch.Tensor) else keys[layer]
        bounded = sample_layer_bounded(
            csr_indptr, csr_indices, dst, n_dst, fanouts[layer], key, n_solid, backend,
            tables[at], stats[at], bounds[layer - 1] if layer else None,
        )  # fmt: skip
        layers.append(bounded)
    return LaunchedBatch(bounds, layers, stats)


def sample_one_read(
    csr_indptr: torch.Tensor,
    csr_indices: torch.Tensor,
    seeds: torch.Tensor,
    fanouts: Sequence[int],
    batch: int,
    n_solid: int,
    backend: Backend,
    raise_bad_seed: Callable[[torch.Tensor], None],
) -> list[Block]:
    """The blocks of one mini-batch (``blocks[l]`` for ``fanouts[l]``) with one host read.

    Args:
        csr_indptr, csr_indices: the part's CSR on the device (as the sampler holds it),
            with at least one edge.
        seeds: int64[n_seeds] on the device, ``n_seeds >= 1``; checked here (range,
            distinct).
        fanouts: positive fan-outs (no ``FANOUT_ALL``); the top layer is the last.
        batch: the batch's seed (:func:`~distmb.pipeline.sample.device.batch_seed`), keying
            each layer's words (:func:`~distmb.pipeline.sample.choose_triton.layer_key`).
        n_solid: rows of the CSR; sources ``>= n_solid`` are halo leaves.
        backend: Fused-Map's back end, ``"triton"`` (or ``"auto"`` resolving to it; the
            sampler's one-read configuration), or ``"torch"`` (the PyTorch-ops relabel).
        raise_bad_seed: raises the error of the first seed outside ``[0, n_solid)``.

    Raises:
        ValueError: a seed out of range (from ``raise_bad_seed``).
        RepeatedDestinationError: a repeated seed (the caller words the message).
    """
    keys = [layer_key(batch, layer) for layer in range(len(fanouts))]
    launched = launch_batch(csr_indptr, csr_indices, seeds, fanouts, keys, n_solid, backend)
    values = host_values(launched.stats)  # the read
    return batch_blocks(seeds, launched, values, raise_bad_seed)


def batch_blocks(
    seeds: torch.Tensor,
    launched: LaunchedBatch,
    values: list[list[int]],
    raise_bad_seed: Callable[[torch.Tensor], None],
) -> list[Block]:
    """The batch's errors raised, then its blocks cut to size (views of ``launched``'s
    buffers), from the values read back: every layer's
    :data:`~distmb.pipeline.sample.relabel_triton.STATS` (top first); the top layer's
    destinations outside the solid range are the bad seeds."""
    bounds, top_down = launched.bounds, launched.layers
    n_layers = len(top_down)
    if values[0][BAD_DST]:
        raise_bad_seed(seeds)
    blocks: list[Block] = []
    n_dst = int(seeds.shape[0])
    for at, layer in enumerate(top_down):
        bound = bounds[n_layers - 1 - at]
        if n_dst > bound:  # never with destination_bounds: they are an invariant
            raise BoundExceeded(n_layers - 1 - at, n_dst, bound)
        row = values[at]
        n_new_solid, n_halo, nnz = row[NEW_SOLID], row[NEW_HALO], row[EDGES]
        raise_map_errors(layer.keys, layer.first, n_dst, row[REPEATED], row[NEGATIVE])
        n_src = n_dst + n_new_solid + n_halo
        blocks.append(
            Block(
                n_dst=n_dst,
                n_src=n_src,
                n_halo=n_halo,
                indptr=layer.indptr[: n_dst + 1],
                indices=layer.indices[:nnz],
                src_ids=layer.src_ids[:n_src],
            )
        )
        n_dst += n_new_solid
    return blocks[::-1]
