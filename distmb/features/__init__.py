"""Input features: one protocol (:class:`FeatureSource`) for "rows of a table by id".

- :class:`ArrayFeatures`: one in-memory or memory-mapped table.
- :class:`ConcatFeatures`: two sources stacked by id.
- :class:`PartFeatures`: a part's solid rows, then its replicated halo rows, by ``VID_p``.
- :class:`RemoteFeatures`: rows fetched from their owners by ``VID_o`` (``--exact-remote``).
- :class:`CachedFeatures`: an out-of-core table (a :class:`~distmb.data.rowfile.RowFile`,
  one raw file read by id with ``O_DIRECT``) behind an in-memory cache with a replacement
  policy (:mod:`distmb.features.cached`, docs/out-of-core.md).
- :class:`BeladyPlanner`, :class:`LruPlanner`: replacement policies (slot directories) of
  that cache (:mod:`distmb.features.policy`).
- :class:`NormalizedFeatures`: another source's rows through a
  :class:`FeatureNormalization` (``--normalize-features``, :mod:`distmb.features.normalize`).
"""

from distmb.features.base import FeatureSource
from distmb.features.cached import CachedFeatures
from distmb.features.memory import ArrayFeatures, ConcatFeatures, PartFeatures
from distmb.features.normalize import FeatureNormalization, NormalizedFeatures
from distmb.features.policy import NO_SLOT, BeladyPlanner, CachePlan, LruPlanner
from distmb.features.remote import RemoteFeatures

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
    "RemoteFeatures",
]
