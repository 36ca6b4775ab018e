"""Exact mini-batches across parts, DistDGL-style: the communication baseline of the HEC.

``--exact-remote`` replaces halo leaves, caches and pushes by what DistDGL does every
iteration. Each rank grows its batch one hop at a time from its seeds, output layer first:

1. the destinations of the hop (``VID_o``) go to their owners (``node_part``);
2. each owner samples their in-neighbours in its own part (its :class:`NeighborSampler`,
   keyed by ``(epoch, iteration * L + hop)``; a vertex asked for by several ranks is sampled
   once, so they all see the same neighbours) and answers with degrees and ``VID_o`` lists;
3. the hop's sources (destinations first, then the new vertices) are the next hop's
   destinations.

Finally the input features of block 0's sources are fetched from their owners. The blocks
have no halo leaves, every remote vertex is computed with the current weights and gradients
flow through it: one rank holding the whole graph would compute the same (up to which
neighbours the sampler draws). Every exchange is a synchronous all-to-all-v (counts first);
the bytes sent to other ranks are counted per epoch.
"""

from __future__ import annotations

import numpy as np
import torch

from distmb.comm import Communicator
from distmb.data.graph import csr_row_positions
from distmb.data.store import PartitionStore
from distmb.sampling import Block, NeighborSampler

#: Bytes of one vertex id or degree on the wire (int64).
ID_BYTES = 8


class ExactBatchSampler:
    """Builds exact blocks for one rank's seeds by asking the owners of remote vertices.

    Args:
        comm: the ranks (every rank calls :meth:`sample` once per iteration).
        store: this rank's part (``orig_ids``, features, ``node_part.npy``).
        sampler: the sampler of this rank's local graph.
        fanouts: per layer, input layer first (as ``--fanout``).
    """

    def __init__(
        self,
        comm: Communicator,
        store: PartitionStore,
        sampler: NeighborSampler,
        fanouts: list[int] | tuple[int, ...],
    ) -> None:
        self.comm = comm
        self.sampler = sampler
        self.fanouts = [int(f) for f in fanouts]
        self.node_part = store.node_part()
        self.orig_ids = np.asarray(store.orig_ids, dtype=np.int64)
        solid = self.orig_ids[: store.n_solid]
        self._by_orig = np.argsort(solid, kind="stable")  # VID_p sorted by VID_o
        self._sorted_orig = solid[self._by_orig]
        self.features = store.features
        #: Bytes sent to other ranks since the last :meth:`reset_stats`.
        self.bytes_sent = 0

    def reset_stats(self) -> None:
        self.bytes_sent = 0

    # -- one mini-batch --------------------------------------------------------------------
    def sample(
        self, seeds: np.ndarray, epoch: int, iteration: int
    ) -> tuple[list[Block], torch.Tensor]:
        """The blocks of one batch and the input features of ``blocks[0]``'s sources.

        Args:
            seeds: int64[batch], distinct solid VID_p of this rank.

        Returns:
            ``(blocks, x)``: ``len(fanouts)`` blocks without halo leaves whose ``src_ids`` are
            positions in the batch (``arange(n_src)``), and float32[blocks[0].n_src, F].
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
        return blocks, torch.from_numpy(self._fetch_features(dst))

    def _hop(self, dst: np.ndarray, fanout: int, epoch: int, key: int) -> tuple[Block, np.ndarray]:
        """One hop for destinations ``dst`` (int64 VID_o, distinct): the block and its
        sources (VID_o, destinations first)."""
        size = self.comm.size
        owner = self.node_part[dst]
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=size).astype(np.int64)
        req_counts, requests = self._exchange(counts, dst[order])
        # Owner side: sample every distinct requested vertex once, answer per request.
        uniq, inverse = np.unique(requests, return_inverse=True)
        if uniq.size:
            sampled = self.sampler.sample_hop(self._local(uniq), fanout, epoch, key)
            indptr = sampled.indptr.numpy()
            neighbours = self.orig_ids[sampled.src_ids.numpy()[sampled.indices.numpy()]]
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
            src_ids=torch.arange(src.size, dtype=torch.int64),
        )
        return block, src

    def _fetch_features(self, vertices: np.ndarray) -> np.ndarray:
        """float32[n, F]: the input features of ``vertices`` (VID_o), from their owners."""
        owner = self.node_part[vertices]
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=self.comm.size).astype(np.int64)
        req_counts, requests = self._exchange(counts, vertices[order])
        rows = np.take(self.features, self._local(requests), axis=0)  # float32 (PartitionStore)
        _, back = self._exchange(req_counts, rows, recv_counts=counts)
        out = np.empty_like(back)
        out[order] = back
        return out

    # -- helpers -----------------------------------------------------------------------------
    def _local(self, orig: np.ndarray) -> np.ndarray:
        """VID_p of solid vertices given as VID_o (they must be solid here)."""
        pos = np.searchsorted(self._sorted_orig, orig)
        pos = np.minimum(pos, max(self._sorted_orig.size - 1, 0))
        if orig.size and not np.array_equal(self._sorted_orig[pos], orig):
            raise RuntimeError(
                f"rank {self.comm.rank} was asked for vertices it does not own: node_part.npy "
                "disagrees with the part's orig_ids"
            )
        return self._by_orig[pos]

    def _exchange(
        self, counts: np.ndarray, send: np.ndarray, recv_counts: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`Communicator.alltoallv`, counting the bytes sent to other ranks (rows, and
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
