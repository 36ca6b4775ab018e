"""Mini-batches: :class:`MiniBatch`, the staged, prefetching :class:`BatchLoader`, and
:class:`NeighborLoader` (DGL/PyG-style iteration over seed vertices)."""

from distmb.pipeline.loader import DEFAULT_PREFETCH, BatchLoader
from distmb.pipeline.minibatch import MiniBatch
from distmb.pipeline.neighbor_loader import NeighborLoader
from distmb.pipeline.plan import EpochPlan, shuffled, split_batches
from distmb.pipeline.sample.protocol import BatchSampler

__all__ = [
    "DEFAULT_PREFETCH",
    "BatchLoader",
    "BatchSampler",
    "EpochPlan",
    "MiniBatch",
    "NeighborLoader",
    "shuffled",
    "split_batches",
]
