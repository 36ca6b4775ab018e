"""Exact evaluation: layer-wise full-neighbour inference (no sampling, no dropout)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from distmb.data.local import LocalGraph
from distmb.sampling import NeighborSampler

#: Destinations per full-neighbour block during inference.
DEFAULT_EVAL_BATCH = 4096

#: ``halo_rows(layer, h_solid) -> float32[n_halo, dim]``: the layer's input rows of the halo
#: vertices, given this rank's rows of its solid vertices (multi-rank: a halo exchange).
HaloRows = Callable[[int, np.ndarray | torch.Tensor], np.ndarray]


@torch.no_grad()
def layerwise_inference(
    model: torch.nn.Module,
    local: LocalGraph,
    sampler: NeighborSampler,
    batch_size: int = DEFAULT_EVAL_BATCH,
    halo_rows: HaloRows | None = None,
) -> torch.Tensor:
    """Outputs of ``model`` for every solid vertex, computed layer by layer over all
    in-neighbours (as DGL's and PyG's ``inference`` do), so the result is exact.

    Args:
        halo_rows: supplies each layer's halo input rows when the part has halo vertices.

    Returns:
        float32[n_solid, num_classes] logits.
    """
    was_training = model.training
    model.eval()
    h: np.ndarray | torch.Tensor = local.features  # may be a read-only memory map
    try:
        for layer in range(model.num_layers):
            table = h if halo_rows is None else concat_rows(h, halo_rows(layer, h))
            out: torch.Tensor | None = None
            for start in range(0, local.n_solid, batch_size):
                dst = torch.arange(start, min(start + batch_size, local.n_solid))
                block = sampler.full_block(dst)
                y = model.forward_layer(layer, block, gather_rows(table, block.src_ids))
                if out is None:
                    out = torch.empty((local.n_solid, y.shape[1]), dtype=y.dtype)
                out[start : start + dst.numel()] = y
            assert out is not None
            h = out
    finally:
        model.train(was_training)
    return h


def gather_rows(table: np.ndarray | torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of a tensor, or of a (possibly read-only, memory-mapped) numpy array,
    as a new float tensor."""
    if isinstance(table, np.ndarray):
        return torch.from_numpy(np.take(table, ids.numpy(), axis=0))
    return table[ids]


def concat_rows(solid: np.ndarray | torch.Tensor, halo: np.ndarray) -> np.ndarray | torch.Tensor:
    """Solid rows followed by halo rows (``VID_p`` order), in the type of ``solid``."""
    if not halo.size:
        return solid
    if isinstance(solid, np.ndarray):
        return np.concatenate([np.asarray(solid), halo])
    return torch.cat([solid, torch.from_numpy(halo)])


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
