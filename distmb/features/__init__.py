"""Input features: one protocol (:class:`FeatureSource`) for "rows of a table by id".

- :class:`ArrayFeatures`: one in-memory or memory-mapped table.
- :class:`ConcatFeatures`: two sources stacked by id.
- :class:`PartFeatures`: a part's solid rows, then its replicated halo rows, by ``VID_p``.
- :class:`RemoteFeatures`: rows fetched from their owners by ``VID_o`` (``--exact-remote``).
- :class:`BeladyPlanner`, :class:`LruPlanner`: replacement policies (slot directories) of an
  out-of-core feature cache (:mod:`distmb.features.policy`).
- :class:`RowFile`: an out-of-core table, one raw file read by id with ``O_DIRECT``
  (:func:`write_row_file` writes it; layout in :mod:`distmb.features.rowfile`).
"""

from distmb.features.base import FeatureSource
from distmb.features.memory import ArrayFeatures, ConcatFeatures, PartFeatures
from distmb.features.policy import NO_SLOT, BeladyPlanner, CachePlan, LruPlanner
from distmb.features.remote import RemoteFeatures
from distmb.features.rowfile import (
    DIRECT_IO_ALIGN,
    RowFile,
    evict_page_cache,
    row_file_size,
    row_stride,
    write_row_file,
)

__all__ = [
    "ArrayFeatures",
    "BeladyPlanner",
    "CachePlan",
    "ConcatFeatures",
    "DIRECT_IO_ALIGN",
    "FeatureSource",
    "LruPlanner",
    "NO_SLOT",
    "PartFeatures",
    "RemoteFeatures",
    "RowFile",
    "evict_page_cache",
    "row_file_size",
    "row_stride",
    "write_row_file",
]
