"""The halo scheme of one rank, from the configuration."""

from __future__ import annotations

import torch

from distmb.comm import RankGroup, SingleProcess
from distmb.config.train import TrainConfig
from distmb.data.store.store import PartitionStore
from distmb.halo.exact.scheme import ExactRemote
from distmb.halo.hec.scheme import HistoricalEmbeddingScheme
from distmb.halo.scheme import DropHalo, HaloScheme


def make_halo_scheme(
    comm: RankGroup,
    store: PartitionStore,
    config: TrainConfig,
    cache_device: torch.device | None = None,
) -> HaloScheme:
    """The scheme of one rank of ``comm`` on part ``store``: nothing to do on one rank;
    else by ``config.halo_scheme``: ``--exact-remote``, ``--no-hec`` or the historical cache
    (the default), its tables on ``cache_device`` when given (the device path's training
    device: :class:`~distmb.halo.hec.device.DeviceHistoricalCache`), else the C++ cache."""
    if comm.size == 1:
        return HaloScheme()
    scheme = config.halo_scheme
    if scheme == "exact":
        return ExactRemote(comm, store, config.fanout)
    if scheme == "drop":
        return DropHalo()
    return HistoricalEmbeddingScheme(
        comm, store, config.hec, config.seed, cache_device=cache_device
    )
