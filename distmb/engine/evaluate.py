"""Exact evaluation: layer-wise full-neighbour inference (no sampling, no dropout)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from distmb.comm import RankGroup
from distmb.core.progress import ProgressSettings, meter
from distmb.data.local import LocalGraph
from distmb.pipeline.features.memory import ArrayFeatures, PartFeatures
from distmb.pipeline.features.protocol import FeatureSource
from distmb.pipeline.sample.host import NeighborSampler

#: Destinations per full-neighbour block during inference.
DEFAULT_EVAL_BATCH = 4096

#: ``layer_table(layer, solid) -> source``: the layer's input rows by ``VID_p`` (solid, then
#: halo vertices), given this rank's rows of its solid vertices (multi-rank: a halo exchange).
LayerTable = Callable[[int, FeatureSource], FeatureSource]

#: ``on_layer(layer, out)``: called with every layer's output, float32[n_solid, width of the
#: layer's output] by solid ``VID_p``, once that layer is complete (the last call's ``out``
#: is the returned logits).
LayerOutput = Callable[[int, torch.Tensor], None]


@torch.no_grad()
def layerwise_inference(
    model: torch.nn.Module,
    features: FeatureSource,
    sampler: NeighborSampler,
    batch_size: int = DEFAULT_EVAL_BATCH,
    layer_table: LayerTable | None = None,
    on_layer: LayerOutput | None = None,
    progress: ProgressSettings | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Outputs of ``model`` for every solid vertex, computed layer by layer over all
    in-neighbours (as DGL's and PyG's ``inference`` do), so the result is exact.

    Args:
        features: the input features by ``VID_p`` (solid rows at least).
        sampler: this part's sampler (its ``full_block``).
        layer_table: supplies each layer's halo input rows when the part has halo vertices.
        on_layer: sees each layer's output as soon as it is complete (hidden embeddings for
            ``distmb.predict --embeddings``); it may use collectives, every rank calls it for
            the same layers in the same order.
        progress: how to report each layer's progress (this part's vertices done; default
            :func:`distmb.core.progress.settings`).
        device: where the model's parameters are (default: the CPU): each block and its input
            rows go there, each layer's output comes back to host memory (whole-graph layer
            outputs are kept on the host, whatever the device's memory).

    Returns:
        float32[n_solid, num_classes] logits.
    """
    was_training = model.training
    model.eval()
    n_solid = sampler.n_solid
    source = features
    out: torch.Tensor | None = None
    try:
        for layer in range(model.num_layers):
            table = source if layer_table is None else layer_table(layer, source)
            out = None
            label = f"evaluation layer {layer + 1}/{model.num_layers}"
            bar = meter(label, n_solid, "vertices", options=progress)
            for start in range(0, n_solid, batch_size):
                dst = torch.arange(start, min(start + batch_size, n_solid))
                block = sampler.full_block(dst)
                x = table.gather(block.src_ids)
                if device is not None:
                    block, x = block.to(device), x.to(device)
                y = model.forward_layer(layer, block, x)
                if out is None:
                    out = torch.empty((n_solid, y.shape[1]), dtype=y.dtype)
                out[start : start + dst.numel()] = y.cpu()
                bar.update(dst.numel())
            bar.close()
            assert out is not None
            if on_layer is not None:
                on_layer(layer, out)
            source = ArrayFeatures(out)
    finally:
        model.train(was_training)
    assert out is not None
    return out


class HaloExchange:
    """The :data:`LayerTable` of one rank of several: layer 0 reads the replicated halo
    features when the partition has them; otherwise, and for every later layer, one
    synchronous halo exchange (:meth:`RankGroup.halo_exchange`) supplies the halo rows.

    Args:
        comm: the ranks (every rank evaluates, layer by layer).
        send_ptr, send_ids, halo_owner: this part's send lists and halo owners.
        features: this part's input features (with halo rows when replicated).
        replicated: whether the *partition* replicates halo features. The same on every
            rank (a part without halo vertices still has an empty replicated table), so every
            rank skips, or joins, the layer-0 exchange alike.
    """

    def __init__(
        self,
        comm: RankGroup,
        send_ptr: np.ndarray,
        send_ids: np.ndarray,
        halo_owner: np.ndarray,
        features: PartFeatures,
        replicated: bool,
    ) -> None:
        self.comm = comm
        self.send_ptr = np.asarray(send_ptr)
        self.send_ids = np.asarray(send_ids, dtype=np.int64)
        self.halo_owner = np.asarray(halo_owner)
        self.features = features
        self.replicated = replicated

    def __call__(self, layer: int, solid: FeatureSource) -> FeatureSource:
        if layer == 0 and self.replicated:
            return self.features
        send_rows = solid.gather(self.send_ids).numpy()
        halo = self.comm.halo_exchange(send_rows, self.send_ptr, self.halo_owner)
        return PartFeatures(solid, halo)


def part_layer_table(
    comm: RankGroup, local: LocalGraph, features: PartFeatures
) -> HaloExchange | None:
    """The :data:`LayerTable` of exact inference on ``local``: ``None`` on one rank (a whole
    graph, or the only part: no halo vertices), else a :class:`HaloExchange` over the part's
    send lists (training's evaluation and ``distmb.predict`` both use it).

    Args:
        comm: the ranks.
        local: this rank's graph (a part of a partition when ``comm.size > 1``).
        features: this part's input features (its halo rows too when replicated).
    """
    store = local.store
    if comm.size == 1 or store is None:
        return None
    return HaloExchange(
        comm,
        store.send_ptr,
        store.send_ids,
        store.halo_owner,
        features,
        replicated=store.replicated,
    )


def split_accuracies(
    comm: RankGroup,
    logits: torch.Tensor,
    labels: np.ndarray,
    splits: dict[str, np.ndarray],
) -> dict[str, float]:
    """Accuracy of every split over all ranks: each rank counts its own vertices (its
    ``logits`` and ``labels`` by solid ``VID_p``, ``splits`` of solid ``VID_p``), one
    ``Allreduce SUM`` of the counts. An empty split gives nan.

    Returns:
        ``{name: share of the split's vertices whose arg-max class equals the label}``.
    """
    counts = np.array(
        [c for idx in splits.values() for c in correct_counts(logits, labels, idx)],
        dtype=np.int64,
    )
    total = comm.allreduce_sum(counts)
    return {
        name: float(total[2 * i] / total[2 * i + 1]) if total[2 * i + 1] else float("nan")
        for i, name in enumerate(splits)
    }


def correct_counts(logits: torch.Tensor, labels: np.ndarray, idx: np.ndarray) -> tuple[int, int]:
    """(vertices of ``idx`` whose arg-max class equals the label, ``len(idx)``)."""
    if idx.size == 0:
        return 0, 0
    index = torch.from_numpy(np.array(idx, dtype=np.int64))  # small; the source may be read-only
    pred = logits[index].argmax(dim=1)
    return int((pred == torch.from_numpy(np.asarray(labels)[idx])).sum()), int(idx.size)


def accuracy(logits: torch.Tensor, labels: np.ndarray, idx: np.ndarray) -> float:
    """Share of ``idx`` whose arg-max class equals the label (nan for an empty split)."""
    correct, total = correct_counts(logits, labels, idx)
    return correct / total if total else float("nan")
