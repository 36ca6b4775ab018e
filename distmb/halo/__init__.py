"""Halo schemes: what a rank does about the halo leaves of its mini-batches.

- :class:`HaloScheme`: no halo leaves to fill (one rank); the base of the others.
- :class:`DropHalo`: ``--no-hec``, halo leaves lose their edges.
- :class:`HistoricalEmbeddingScheme`: the default with P > 1, historical embedding caches
  filled by asynchronous embedding pushes (DistGNN-MB).
- :class:`ExactRemote`: ``--exact-remote``, exact batches sampled and gathered across ranks.

:func:`distmb.engine.build.make_halo_scheme` picks one from the configuration.
"""

from __future__ import annotations

from distmb.halo.exact.scheme import ExactRemote
from distmb.halo.hec.scheme import HistoricalEmbeddingScheme
from distmb.halo.scheme import LAYER_COUNTERS, SECOND_COUNTERS, DropHalo, HaloScheme

__all__ = [
    "LAYER_COUNTERS",
    "SECOND_COUNTERS",
    "DropHalo",
    "ExactRemote",
    "HaloScheme",
    "HistoricalEmbeddingScheme",
]
