"""``--exact-remote``: no halo leaves at all (the DistDGL-like exact baseline).

The scheme replaces the loader's stages: remote neighbours are sampled at their owners
(:class:`~distmb.halo.exact.sampler.ExactBatchSampler`) and block 0's input features are fetched
from their owners (:class:`~distmb.halo.exact.remote.RemoteFeatures`), every iteration, on the
training thread. Its blocks have no halo leaves, so the per-iteration hooks do nothing.
"""

from __future__ import annotations

import numpy as np

from distmb.comm import RankGroup
from distmb.data.owners import VertexOwners
from distmb.data.store.store import PartitionStore
from distmb.halo.exact.remote import RemoteFeatures
from distmb.halo.exact.sampler import ExactBatchSampler
from distmb.halo.scheme import HaloScheme
from distmb.pipeline.features.protocol import FeatureSource
from distmb.pipeline.sample.host import NeighborSampler


class ExactRemote(HaloScheme):
    """Exact batches across parts (see the module docstring).

    Args:
        comm: the ranks.
        store: this rank's part (``orig_ids``, ``node_part.npy``).
        fanouts: per layer, input layer first (``--fanout``).
    """

    name = "exact"

    def describe(self) -> str:
        return "none (exact remote sampling and feature fetch)"

    def __init__(self, comm: RankGroup, store: PartitionStore, fanouts: tuple[int, ...]) -> None:
        super().__init__()
        self.comm = comm
        self.owners = VertexOwners(store)
        self.num_nodes = int(store.meta["num_nodes"])
        self.fanouts = tuple(fanouts)
        self.sampler: ExactBatchSampler | None = None
        self.features: RemoteFeatures | None = None

    def batch_sampler(self, local: NeighborSampler) -> ExactBatchSampler:
        self.sampler = ExactBatchSampler(self.comm, self.owners, local, self.fanouts)
        return self.sampler

    def feature_source(self, local: FeatureSource) -> RemoteFeatures:
        self.features = RemoteFeatures(self.comm, self.owners, local, self.num_nodes)
        return self.features

    def stats(self) -> dict[str, np.ndarray]:
        out = super().stats()
        sent = self.sampler.bytes_sent if self.sampler is not None else 0
        sent += self.features.bytes_sent if self.features is not None else 0
        out["bytes_exact_remote"][0] = sent
        return out

    def reset_stats(self) -> None:
        super().reset_stats()
        if self.sampler is not None:
            self.sampler.reset_stats()
        if self.features is not None:
            self.features.reset_counters()
