"""Message-flow-graph blocks: one layer of a mini-batch as a bipartite CSR graph."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Block:
    """One layer of a mini-batch: a bipartite graph from ``n_src`` sources to ``n_dst``
    destinations.

    Attributes:
        n_dst: number of destinations (outputs of this layer).
        n_src: number of sources (inputs of this layer), ``n_src >= n_dst``.
        n_halo: the last ``n_halo`` sources are halo leaves (their input comes from the
            historical embedding cache, not from the previous layer).
        indptr: int64[n_dst + 1], CSR over destinations.
        indices: int64[num_edges], source position in ``[0, n_src)`` of every edge.
        src_ids: int64[n_src], VID_p of every source; ``src_ids[:n_dst]`` are the
            destinations.
    """

    n_dst: int
    n_src: int
    n_halo: int
    indptr: torch.Tensor
    indices: torch.Tensor
    src_ids: torch.Tensor

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def n_computed(self) -> int:
        """Sources whose input is computed by the previous layer (or read from features)."""
        return self.n_src - self.n_halo

    @property
    def dst_ids(self) -> torch.Tensor:
        """int64[n_dst]: VID_p of the destinations."""
        return self.src_ids[: self.n_dst]

    def dst_of_edges(self) -> torch.Tensor:
        """int64[num_edges]: destination position of every edge (CSR expanded)."""
        return edge_destinations(self.indptr, self.num_edges)

    def structure_key(self) -> tuple[int, int, int, int, int]:
        """What a structure derived from the CSR (a cached transposed CSR) was built from:
        ``indptr``'s and ``indices``' identities and in-place versions, and ``n_src``; a
        cache compares it to tell a stale entry (tensors replaced or modified in place)."""
        return (
            id(self.indptr),
            self.indptr._version,
            id(self.indices),
            self.indices._version,
            self.n_src,
        )

    @property
    def device(self) -> torch.device:
        """Where the block's index tensors live."""
        return self.indptr.device

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Block:
        """The block with its index tensors on ``device`` (itself when they are there)."""
        device = torch.device(device)
        if self.indptr.device == device and self.src_ids.device == device:
            return self
        return Block(
            self.n_dst,
            self.n_src,
            self.n_halo,
            self.indptr.to(device, non_blocking=non_blocking),
            self.indices.to(device, non_blocking=non_blocking),
            self.src_ids.to(device, non_blocking=non_blocking),
        )

    def drop_sources(self, keep: torch.Tensor) -> Block:
        """The block without the edges whose source has ``keep[src] == False``.

        Used for halo leaves that miss in the cache: their edges are removed before
        aggregation, so mean and softmax normalise over the edges that remain. Source
        numbering is unchanged (dropped sources simply have no edges).

        Args:
            keep: bool[n_src].
        """
        edge_keep = keep[self.indices]
        counts = torch.zeros(self.n_dst + 1, dtype=torch.int64, device=self.device)
        counts[1:] = torch.cumsum(
            torch.zeros(self.n_dst, dtype=torch.int64, device=self.device).index_add_(
                0, self.dst_of_edges(), edge_keep.to(torch.int64)
            ),
            0,
        )
        return Block(
            self.n_dst, self.n_src, self.n_halo, counts, self.indices[edge_keep], self.src_ids
        )


def edge_destinations(indptr: torch.Tensor, num_edges: int) -> torch.Tensor:
    """int64[num_edges]: the row of every entry of the CSR ``indptr`` (int64[n_rows + 1]).
    The output size is given, so a GPU does not read the counts' sum back."""
    counts = indptr[1:] - indptr[:-1]
    rows = torch.arange(indptr.numel() - 1, dtype=torch.int64, device=indptr.device)
    return torch.repeat_interleave(rows, counts, output_size=num_edges)


def transposed_indptr(indices: torch.Tensor, n_src: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The transposed CSR's row pointers and edge order of a CSR whose column indices are
    ``indices`` (int64[E] in ``[0, n_src)``): ``(t_indptr int64[n_src + 1], order
    int64[E])``, ``order`` the stable sort of ``indices``, so source ``u``'s edges are
    ``order[t_indptr[u]:t_indptr[u + 1]]`` in CSR order. A sort and a binary search, not
    ``bincount``, whose output size (the maximum index) a GPU would read back."""
    sorted_indices, order = torch.sort(indices, stable=True)
    bounds = torch.arange(n_src + 1, dtype=indices.dtype, device=indices.device)
    return torch.searchsorted(sorted_indices, bounds), order
