"""Mini-batches: :class:`MiniBatch` and the staged, prefetching :class:`BatchLoader`."""

from distmb.loader.loader import DEFAULT_PREFETCH, BatchLoader, BatchSampler, EpochPlan
from distmb.loader.minibatch import MiniBatch

__all__ = ["DEFAULT_PREFETCH", "BatchLoader", "BatchSampler", "EpochPlan", "MiniBatch"]
