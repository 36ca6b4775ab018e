"""Mini-batches: :class:`MiniBatch`, the staged, prefetching :class:`BatchLoader`, and
:class:`NeighborLoader` (DGL/PyG-style iteration over seed vertices)."""

from distmb.pipeline.loader import (
    DEFAULT_PREFETCH,
    BatchLoader,
    BatchSampler,
    EpochPlan,
    split_batches,
)
from distmb.pipeline.minibatch import MiniBatch
from distmb.pipeline.neighbor_loader import NeighborLoader

__all__ = [
    "DEFAULT_PREFETCH",
    "BatchLoader",
    "BatchSampler",
    "EpochPlan",
    "MiniBatch",
    "NeighborLoader",
    "split_batches",
]
