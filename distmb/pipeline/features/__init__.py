"""Input features: one protocol (:class:`FeatureSource`) for "rows of a table by id".

- :class:`ArrayFeatures`: one in-memory or memory-mapped table.
- :class:`ConcatFeatures`: two sources stacked by id.
- :class:`PartFeatures`: a part's solid rows, then its replicated halo rows, by ``VID_p``.
- :class:`CachedFeatures`: an out-of-core table (a :class:`~distmb.data.store.rowfile.RowFile`,
  one raw file read by id with ``O_DIRECT``) behind an in-memory cache with a replacement
  policy (:mod:`distmb.pipeline.features.cached`, docs/out-of-core.md).
- :class:`BeladyPlanner`, :class:`LruPlanner`: replacement policies (slot directories) of
  that cache (:mod:`distmb.pipeline.features.policy`).
- :class:`NormalizedFeatures`: another source's rows through a
  :class:`FeatureNormalization` (``--normalize-features``,
  :mod:`distmb.pipeline.features.normalize`).
"""

from distmb.pipeline.features.cached import CachedFeatures
from distmb.pipeline.features.memory import ArrayFeatures, ConcatFeatures, PartFeatures
from distmb.pipeline.features.normalize import FeatureNormalization, NormalizedFeatures
from distmb.pipeline.features.policy import NO_SLOT, BeladyPlanner, CachePlan, LruPlanner
from distmb.pipeline.features.protocol import FeatureSource

__all__ = [
    "ArrayFeatures",
    "BeladyPlanner",
    "CachePlan",
    "CachedFeatures",
    "ConcatFeatures",
    "FeatureNormalization",
    "FeatureSource",
    "LruPlanner",
    "NO_SLOT",
    "NormalizedFeatures",
    "PartFeatures",
]
