"""Halo schemes: what a rank does about the halo leaves of its mini-batches.

- :class:`HaloScheme`: no halo leaves to fill (one rank); the base of the others.
- :class:`DropHalo`: ``--no-hec``, halo leaves lose their edges.
- :class:`HistoricalCache`: the default with P > 1, historical embedding caches filled by
  asynchronous embedding pushes (DistGNN-MB).
- :class:`ExactRemote`: ``--exact-remote``, exact batches sampled and gathered across ranks.

:func:`make_halo_scheme` picks one from the configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distmb.halo.exact.scheme import ExactRemote
from distmb.halo.hec.scheme import HistoricalCache
from distmb.halo.scheme import LAYER_COUNTERS, SECOND_COUNTERS, DropHalo, HaloScheme

if TYPE_CHECKING:
    import torch

    from distmb.comm.mpi import RankGroup
    from distmb.config.train import TrainConfig
    from distmb.data.store.store import PartitionStore

__all__ = [
    "LAYER_COUNTERS",
    "SECOND_COUNTERS",
    "DropHalo",
    "ExactRemote",
    "HaloScheme",
    "HistoricalCache",
    "make_halo_scheme",
]


def make_halo_scheme(
    comm: RankGroup,
    store: PartitionStore,
    config: TrainConfig,
    cache_device: torch.device | None = None,
) -> HaloScheme:
    """The scheme of one rank of ``comm`` on part ``store``: nothing to do on one rank;
    else by ``config.halo_scheme``: ``--exact-remote``, ``--no-hec`` or the historical cache
    (the default), its tables on ``cache_device`` when given (the GPU path's training
    device: :class:`~distmb.halo.hec.device.DeviceHistoricalCache`), else the C++ cache."""
    if comm.size == 1:
        return HaloScheme()
    scheme = config.halo_scheme
    if scheme == "exact":
        return ExactRemote(comm, store, config.fanout)
    if scheme == "drop":
        return DropHalo()
    return HistoricalCache(comm, store, config.hec, config.seed, cache_device=cache_device)
