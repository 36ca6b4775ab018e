"""Per-epoch counters of a run's data path: the caches the trainer resets at the start of an
epoch and reports in its record, behind one protocol.

:func:`epoch_counters` lists the owners a run has (none for in-memory features and graph on
the C++ path); the trainer iterates over that list without asking which kinds they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from distmb.comm import RankGroup, SingleProcess
from distmb.config.train import TrainConfig
from distmb.data.store.neighborfile import NeighborFile
from distmb.engine.build.adjacency import neighbor_cache_stats
from distmb.engine.build.device_stages import DeviceStages
from distmb.engine.build.features import FeatureSources
from distmb.engine.stats import cache_record, device_cache_record
from distmb.pipeline.features.cached import CachedFeatures
from distmb.pipeline.features.device import DeviceFeatures


class EpochCounters(Protocol):
    """A part of the data path that counts its work per epoch."""

    def reset_epoch_counters(self) -> None:
        """Start counting a new epoch (what evaluation read since the last epoch is not
        counted)."""

    def epoch_stats(self, comm: RankGroup) -> dict[str, Any]:
        """This epoch's entries of the record, over all ranks (a collective: every rank calls
        it in the same order)."""


@dataclass
class FeatureCacheCounters:
    """``--features ooc``: the out-of-core feature cache's record, ``feature_cache``.

    Attributes:
        cache: the cache.
        policy: ``--cache-policy``, reported with the counters.
    """

    cache: CachedFeatures
    policy: str

    def reset_epoch_counters(self) -> None:
        self.cache.reset_counters()

    def epoch_stats(self, comm: RankGroup) -> dict[str, Any]:
        return {"feature_cache": {**cache_record(comm, self.cache.stats()), "policy": self.policy}}


@dataclass
class NeighborCacheCounters:
    """``--graph-layout ooc``: the neighbour-list cache's record, ``neighbor_cache``.

    Attributes:
        adjacency: the out-of-core neighbour lists.
        order: ``--neighbor-cache-order``, reported with the counters.
    """

    adjacency: NeighborFile
    order: str

    def reset_epoch_counters(self) -> None:
        self.adjacency.reset_counters()

    def epoch_stats(self, comm: RankGroup) -> dict[str, Any]:
        record = cache_record(comm, neighbor_cache_stats(self.adjacency))
        return {"neighbor_cache": {**record, "policy": self.order}}


@dataclass
class DeviceCacheCounters:
    """The device path's feature cache: its record, ``device_cache``.

    Attributes:
        features: the device feature cache.
        policy: ``--device-cache-policy``, reported with the counters.
    """

    features: DeviceFeatures
    policy: str

    def reset_epoch_counters(self) -> None:
        self.features.reset_counters()

    def epoch_stats(self, comm: RankGroup) -> dict[str, Any]:
        counters = {**self.features.counters(), "memory_bytes": self.features.memory_bytes}
        return {"device_cache": device_cache_record(comm, counters, self.policy)}


def epoch_counters(
    config: TrainConfig,
    feature_sources: FeatureSources,
    adjacency: object,
    device_stages: DeviceStages | None,
) -> list[EpochCounters]:
    """The owners of per-epoch counters among a run's parts, in the order their records are
    reported: the out-of-core feature cache, the out-of-core neighbour lists, the device
    feature cache (each where the run has it). The same list on every rank (the flags and
    the partition's layout decide)."""
    owners: list[EpochCounters] = []
    if feature_sources.cache is not None:
        owners.append(FeatureCacheCounters(feature_sources.cache, config.cache_policy))
    if isinstance(adjacency, NeighborFile):
        owners.append(NeighborCacheCounters(adjacency, config.neighbor_cache_order))
    if device_stages is not None:
        owners.append(DeviceCacheCounters(device_stages.device_cache, config.device_cache_policy))
    return owners
