"""Message-flow-graph blocks and the thread-parallel neighbour sampler (C++).

Contract (docs/design.md, "Sampler and blocks"):

- ``fanouts`` are listed from the input layer to the output layer (DGL's order): with
  ``[5, 10, 15]`` the seeds sample 15 in-neighbours each, those sample 10, then 5.
- ``sample(...)`` returns ``L`` blocks, ``blocks[0]`` feeding the first layer and
  ``blocks[L-1]`` producing the seeds.
- In every block the destinations are a prefix of the sources (``src_ids[:n_dst]``), followed
  by the other solid sources, followed by the ``n_halo`` halo leaves. The solid sources of
  block ``l`` (``src_ids[:n_src - n_halo]``) are exactly the destinations of block ``l-1``.
- Halo vertices (``VID_p >= n_solid``) are never expanded: they have no local in-edges.
- Sampling is uniform without replacement (all neighbours when the degree is at most the
  fan-out; :data:`FANOUT_ALL` takes every neighbour) and deterministic for a given
  ``(seed, epoch, iteration)`` whatever the thread count.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from distmb import _C
from distmb.core.errors import PartitionError
from distmb.data.store.neighborfile import NeighborFile
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.protocol import PartSampler

#: Fan-out meaning "every in-neighbour" (exact, full-neighbour blocks for evaluation).
FANOUT_ALL = -1

#: Exclusive upper bound of ``seed``, ``epoch`` and ``iteration`` (they are uint64 in C++).
_UINT64_END = 1 << 64


def _index_array(values: np.ndarray | torch.Tensor, name: str) -> np.ndarray:
    """``values`` as a 1-D contiguous int64 numpy array (no copy when it already is one)."""
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU tensor (got device {values.device})")
        values = values.detach().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (got shape {list(arr.shape)})")
    if arr.dtype.kind not in "iu" and arr.size > 0:
        raise ValueError(f"{name} must hold integers (got dtype {arr.dtype})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_counter(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    if not 0 <= int(value) < _UINT64_END:
        raise ValueError(f"{name} must be in [0, 2**64) (got {value})")
    return int(value)


class NeighborSampler(PartSampler):
    """Thread-parallel uniform neighbour sampler over one part's local in-edge CSR.

    The graph arrays are borrowed, not copied (memory-mapped arrays of a
    :class:`~distmb.data.PartitionStore` are read in place) and validated once here. With a
    :class:`~distmb.data.store.neighborfile.NeighborFile` in place of ``indices`` (out-of-core
    adjacency, ``--graph-layout ooc``) every layer fetches its destinations' lists from it
    (its cache, else one coalesced batch of reads from disk, checked per fetch) and the blocks
    are identical to those of the in-memory sampler over the same CSR. The
    sampler keeps an ``int32[n_local]`` scratch table that every call reuses, so create one
    sampler per part and keep it. Calls on one sampler from several Python threads are safe
    but serialised; the C++ kernel uses the OpenMP thread count of the calling thread
    (``distmb._C.set_num_threads``). See the module docstring for the block contract.

    Args:
        indptr: int64[n_solid + 1], CSR row pointers of the solid vertices' in-edges.
        indices: int32 or int64[indptr[-1]], sources as VID_p in ``[0, n_local)``; VID_p
            ``>= n_solid`` are halo vertices (leaves). Or a
            :class:`~distmb.data.store.neighborfile.NeighborFile` over the same CSR (same
            ``indptr``, ``n_solid`` and ``n_local``): the lists are then read through it.
        n_solid: number of solid vertices (rows of the CSR).
        n_local: number of local vertices, solid and halo.
        fanouts: per layer, from the input layer to the output layer: a positive count or
            :data:`FANOUT_ALL`.
        seed: base random seed in ``[0, 2**64)``.

    Raises:
        ValueError: malformed CSR (wrong dtype or length, decreasing ``indptr``, an index
            outside ``[0, n_local)``), a neighbour file of another CSR, empty fan-out list,
            fan-out 0 or below -1.
    """

    def __init__(
        self,
        indptr: np.ndarray,
        indices: np.ndarray | NeighborFile,
        n_solid: int,
        n_local: int,
        fanouts: Sequence[int],
        seed: int,
    ) -> None:
        self.fanouts = self._check_fanouts(fanouts)
        self.seed = _check_counter(seed, "seed")
        indptr = np.asarray(indptr)
        if indptr.dtype != np.int64:
            raise ValueError(f"indptr must be int64 (got {indptr.dtype})")
        #: The neighbour file the lists are read through, or None (``indices`` in memory).
        self.neighbor_file: NeighborFile | None = None
        if isinstance(indices, NeighborFile):
            self.neighbor_file = indices
            if indices.closed:
                raise ValueError(f"NeighborSampler: {indices!r} is closed")
            graph: object = indices._core
        else:
            indices = np.asarray(indices)
            if indices.dtype not in (np.int32, np.int64):
                raise ValueError(f"indices must be int32 or int64 (got {indices.dtype})")
            graph = np.ascontiguousarray(indices)
        # Contiguous views pass through unchanged; only a strided view is copied.
        self._core = _C.NeighborSamplerCore(
            np.ascontiguousarray(indptr), graph, int(n_solid), int(n_local)
        )

    @staticmethod
    def _check_fanouts(fanouts: Sequence[int]) -> list[int]:
        values = [int(f) for f in fanouts]
        if not values:
            raise ValueError("fanouts must list at least one layer")
        bad = [f for f in values if f == 0 or f < FANOUT_ALL]
        if bad:
            raise ValueError(
                f"fanouts {values}: every fan-out must be positive or FANOUT_ALL (-1), got {bad}"
            )
        return values

    @property
    def n_solid(self) -> int:
        return int(self._core.n_solid)

    @property
    def n_local(self) -> int:
        return int(self._core.n_local)

    def sample(self, seeds: torch.Tensor | np.ndarray, epoch: int, iteration: int) -> list[Block]:
        """Sample the blocks of one mini-batch.

        Args:
            seeds: int64[batch] (any integer dtype is converted), distinct solid VID_p.
            epoch, iteration: in ``[0, 2**64)``; with ``seed`` they fix the random draws, so
                the same triple gives the same blocks whatever the thread count.

        Returns:
            ``len(fanouts)`` blocks, ``blocks[0]`` feeding the input layer and
            ``blocks[-1].dst_ids`` equal to ``seeds``. Tensors are zero-copy views of the
            C++ outputs.

        Raises:
            ValueError: a seed that is a halo vertex, out of range or repeated; a block of
                ``2**31 - 1`` or more destinations + edges (the scratch entries are 32-bit).
            PartitionError: with a neighbour file, a short read or an entry outside
                ``[0, n_local)`` (the message names the file).
        """
        return self._run(seeds, self.fanouts, epoch, iteration)

    def sample_hop(
        self, dst_ids: torch.Tensor | np.ndarray, fanout: int, epoch: int, iteration: int
    ) -> Block:
        """One block: up to ``fanout`` (or :data:`FANOUT_ALL`) in-neighbours of every
        ``dst_ids`` entry (int64[n], distinct solid VID_p), drawn like one layer of
        :meth:`sample` keyed by ``(epoch, iteration)``. For samplers that grow a mini-batch one
        hop at a time across parts (:mod:`distmb.halo.exact.sampler`)."""
        return self._run(dst_ids, self._check_fanouts([fanout]), epoch, iteration)[0]

    def full_block(self, dst_ids: torch.Tensor | np.ndarray) -> Block:
        """One exact block: every in-neighbour of ``dst_ids`` (int64[n], distinct solid VID_p).

        Meant for layer-wise full-neighbour evaluation in batches of destinations.
        """
        return self._run(dst_ids, [FANOUT_ALL], 0, 0)[0]

    def _run(
        self, seeds: torch.Tensor | np.ndarray, fanouts: list[int], epoch: int, iteration: int
    ) -> list[Block]:
        seed_arr = _index_array(seeds, "seeds")
        args = (
            seed_arr,
            np.asarray(fanouts, dtype=np.int64),
            self.seed,
            _check_counter(epoch, "epoch"),
            _check_counter(iteration, "iteration"),
        )
        if self.neighbor_file is None:
            raw = self._core.sample(*args)
        else:
            try:
                raw = self._core.sample(*args)
            except RuntimeError as exc:  # a short read or a corrupt list, naming the file
                raise PartitionError(str(exc)) from None
        return [
            Block(
                n_dst=int(n_dst),
                n_src=int(src_ids.shape[0]),
                n_halo=int(n_halo),
                indptr=torch.from_numpy(indptr),
                indices=torch.from_numpy(indices),
                src_ids=torch.from_numpy(src_ids),
            )
            for n_dst, n_halo, indptr, indices, src_ids in raw
        ]
