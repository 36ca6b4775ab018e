"""Input features fetched from the ranks that own them (the exact baseline's gather)."""

from __future__ import annotations

import numpy as np
import torch

from distmb.comm import RankGroup
from distmb.core.units import FLOAT32_BYTES, ID_BYTES
from distmb.data.owners import VertexOwners
from distmb.pipeline.features.protocol import FeatureSource


class RemoteFeatures(FeatureSource):
    """Rows of the whole graph's feature table by ``VID_o``: each rank asks the owners
    (``node_part``) for the rows it needs and answers its peers' requests from ``local``, one
    synchronous all-to-all-v of ids and one of rows (a collective: every rank gathers once
    per call, in the same order).

    Args:
        comm: the ranks.
        owners: the owner table and this part's ``VID_o -> VID_p`` map.
        local: this part's features by ``VID_p`` (solid rows are read).
        num_nodes: vertices of the whole graph.

    Attributes:
        bytes_sent: bytes sent to other ranks (ids and rows) since the last reset.
    """

    uses_collectives = True

    def __init__(
        self, comm: RankGroup, owners: VertexOwners, local: FeatureSource, num_nodes: int
    ) -> None:
        super().__init__(num_nodes, local.dim)
        self.comm = comm
        self.owners = owners
        self.local = local
        self.bytes_sent = 0

    def counters(self) -> dict[str, int]:
        return {**super().counters(), "bytes_sent": self.bytes_sent}

    def reset_counters(self) -> None:
        super().reset_counters()
        self.bytes_sent = 0

    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        size, rank = self.comm.size, self.comm.rank
        owner = self.owners.owner(ids)
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=size).astype(np.int64)
        req_counts, requests = self.comm.alltoallv(counts, ids[order])
        # The answers are sent from where ``local`` holds them: the GPU path's device cache
        # answers on its device, which NCCL sends from (--comm torch); MPI copies to the host.
        rows = self.local.gather(self.owners.local(requests))
        self.bytes_read += rows.shape[0] * self.dim * FLOAT32_BYTES
        _, back = self.comm.alltoallv(req_counts, rows, recv_counts=counts)
        out[torch.from_numpy(order)] = back.to(out.device)
        self.bytes_sent += int(counts.sum() - counts[rank]) * ID_BYTES + (size - 1) * ID_BYTES
        self.bytes_sent += int(req_counts.sum() - req_counts[rank]) * self.dim * FLOAT32_BYTES
