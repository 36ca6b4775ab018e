"""Exact mini-batches across parts, DistDGL-style: the communication baseline of the HEC.

``--exact-remote`` replaces halo leaves, caches and pushes by what DistDGL does every
iteration. Each rank grows its batch one hop at a time from its seeds, output layer first:

1. the destinations of the hop (``VID_o``) go to their owners (``node_part``);
2. each owner samples their in-neighbours in its own part (its :class:`NeighborSampler`,
   keyed by ``(epoch, iteration * L + hop)``; a vertex asked for by several ranks is sampled
   once, so they all see the same neighbours) and answers with degrees and ``VID_o`` lists;
3. the hop's sources (destinations first, then the new vertices) are the next hop's
   destinations.

The input features of block 0's sources are fetched from their owners by the BatchLoader's
gather stage (:class:`~distmb.halo.exact.remote.RemoteFeatures`): here ``src_ids`` are ``VID_o``,
the
ids that feature source reads. The blocks have no halo leaves, every remote vertex is
computed with the current weights and gradients flow through it: one rank holding the whole
graph would compute the same (up to which neighbours the sampler draws). Every exchange is a
synchronous all-to-all-v (counts first); the bytes sent to other ranks are counted per epoch.
"""

from __future__ import annotations

import numpy as np
import torch

from distmb.comm import RankGroup
from distmb.core.units import ID_BYTES
from distmb.data.graph import csr_row_positions
from distmb.data.owners import VertexOwners
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.host import NeighborSampler
from distmb.pipeline.sample.protocol import BatchSampler


class ExactBatchSampler(BatchSampler):
    """Builds exact blocks for one rank's seeds by asking the owners of remote vertices.

    Args:
        comm: the ranks (every rank calls :meth:`sample` once per iteration).
        owners: the owner table and this part's ``VID_o -> VID_p`` map.
        sampler: the sampler of this rank's local graph.
        fanouts: per layer, input layer first (as ``--fanout``).
    """

    #: Every hop is an all-to-all-v: sampling must run on the training thread, in step order.
    uses_collectives = True

    def __init__(
        self,
        comm: RankGroup,
        owners: VertexOwners,
        sampler: NeighborSampler,
        fanouts: list[int] | tuple[int, ...],
    ) -> None:
        self.comm = comm
        self.owners = owners
        self.sampler = sampler
        self.fanouts = [int(f) for f in fanouts]
        self.orig_ids = owners.orig_ids
        #: Bytes sent to other ranks since the last :meth:`reset_stats`.
        self.bytes_sent = 0

    def reset_stats(self) -> None:
        self.bytes_sent = 0

    # -- one mini-batch --------------------------------------------------------------------
    def sample(self, seeds: np.ndarray, epoch: int, iteration: int) -> list[Block]:
        """The blocks of one batch.

        Args:
            seeds: int64[batch], distinct solid VID_p of this rank.

        Returns:
            ``len(fanouts)`` blocks without halo leaves whose ``src_ids`` are the sources'
            ``VID_o`` (destinations first; ``blocks[-1].dst_ids`` are the seeds' ``VID_o``).
        """
        num_layers = len(self.fanouts)
        dst = self.orig_ids[np.asarray(seeds, dtype=np.int64)]
        blocks: list[Block] = []
        for hop in range(num_layers):
            fanout = self.fanouts[num_layers - 1 - hop]
            key = iteration * num_layers + hop
            block, dst = self._hop(dst, fanout, epoch, key)
            blocks.append(block)
        blocks.reverse()
        return blocks

    def _hop(self, dst: np.ndarray, fanout: int, epoch: int, key: int) -> tuple[Block, np.ndarray]:
        """One hop for destinations ``dst`` (int64 VID_o, distinct): the block and its
        sources (VID_o, destinations first)."""
        size = self.comm.size
        owner = self.owners.owner(dst)
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=size).astype(np.int64)
        req_counts, requests = self._exchange(counts, dst[order])
        # Owner side: sample every distinct requested vertex once, answer per request.
        uniq, inverse = np.unique(requests, return_inverse=True)
        if uniq.size:
            sampled = self.sampler.sample_hop(self.owners.local(uniq), fanout, epoch, key)
            # The GPU path's sampler answers with device blocks: the exchange runs on the host.
            indptr = sampled.indptr.cpu().numpy()
            neighbours = self.orig_ids[sampled.src_ids.cpu().numpy()[sampled.indices.cpu().numpy()]]
        else:
            indptr, neighbours = np.zeros(1, dtype=np.int64), np.empty(0, dtype=np.int64)
        degree = np.diff(indptr)[inverse]
        answer = neighbours[csr_row_positions(indptr[:-1][inverse], degree)]
        requester = np.repeat(np.arange(size), req_counts)
        answer_counts = np.bincount(requester, weights=degree, minlength=size).astype(np.int64)
        _, degree_back = self._exchange(req_counts, degree, recv_counts=counts)
        answers_per_owner = np.bincount(
            np.repeat(np.arange(size), counts), weights=degree_back, minlength=size
        ).astype(np.int64)
        _, answer_back = self._exchange(answer_counts, answer, recv_counts=answers_per_owner)
        # Requester side: the answers come in owner order; put them back in dst order.
        deg = np.empty_like(degree_back)
        deg[order] = degree_back
        start = np.empty_like(degree_back)
        start[order] = np.cumsum(degree_back) - degree_back
        edge_src = answer_back[csr_row_positions(start, deg)]
        new = np.setdiff1d(edge_src, dst)  # sorted, distinct
        src = np.concatenate([dst, new])
        sorter = np.argsort(src, kind="stable")
        indices = sorter[np.searchsorted(src, edge_src, sorter=sorter)]
        block_indptr = np.zeros(dst.size + 1, dtype=np.int64)
        np.cumsum(deg, out=block_indptr[1:])
        block = Block(
            n_dst=int(dst.size),
            n_src=int(src.size),
            n_halo=0,
            indptr=torch.from_numpy(block_indptr),
            indices=torch.from_numpy(indices.astype(np.int64)),
            src_ids=torch.from_numpy(src.astype(np.int64)),
        )
        return block, src

    def _exchange(
        self, counts: np.ndarray, send: np.ndarray, recv_counts: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`RankGroup.alltoallv`, counting the bytes sent to other ranks (rows, and
        the per-peer counts when they have to be exchanged). An answer's ``recv_counts`` are
        the request's ``counts``, so answers skip the count exchange."""
        exchanged_counts = recv_counts is None
        recv_counts, received = self.comm.alltoallv(counts, send, recv_counts)
        row_bytes = send.itemsize * int(np.prod(send.shape[1:], dtype=np.int64))
        remote = int(counts.sum() - counts[self.comm.rank])
        self.bytes_sent += remote * row_bytes
        if exchanged_counts:
            self.bytes_sent += (self.comm.size - 1) * ID_BYTES
        return recv_counts, received
