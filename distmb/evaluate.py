"""Exact evaluation: layer-wise full-neighbour inference (no sampling, no dropout)."""

from __future__ import annotations

import numpy as np
import torch

from distmb.data.local import LocalGraph
from distmb.sampling import NeighborSampler

#: Destinations per full-neighbour block during inference.
DEFAULT_EVAL_BATCH = 4096


@torch.no_grad()
def layerwise_inference(
    model: torch.nn.Module,
    local: LocalGraph,
    sampler: NeighborSampler,
    batch_size: int = DEFAULT_EVAL_BATCH,
) -> torch.Tensor:
    """Outputs of ``model`` for every solid vertex, computed layer by layer over all
    in-neighbours (as DGL's and PyG's ``inference`` do), so the result is exact.

    Returns:
        float32[n_solid, num_classes] logits.
    """
    was_training = model.training
    model.eval()
    h: np.ndarray | torch.Tensor = local.features  # may be a read-only memory map
    try:
        for layer in range(model.num_layers):
            out: torch.Tensor | None = None
            for start in range(0, local.n_solid, batch_size):
                dst = torch.arange(start, min(start + batch_size, local.n_solid))
                block = sampler.full_block(dst)
                y = model.forward_layer(layer, block, gather_rows(h, block.src_ids))
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


def accuracy(logits: torch.Tensor, labels: np.ndarray, idx: np.ndarray) -> float:
    """Share of ``idx`` whose arg-max class equals the label (nan for an empty split)."""
    if idx.size == 0:
        return float("nan")
    index = torch.from_numpy(np.array(idx, dtype=np.int64))  # small; the source may be read-only
    pred = logits[index].argmax(dim=1)
    correct = int((pred == torch.from_numpy(np.asarray(labels)[idx])).sum())
    return correct / idx.size
