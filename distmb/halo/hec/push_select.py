"""Which computed rows an embedding push sends: candidates, the ``nc`` cap and sampling by
in-degree.

The candidates of one push are the pairs (position ``i`` of a computed source of the block,
peer ``j``) where ``j`` holds that source as a halo vertex (the inverse send lists of
:func:`distmb.halo.hec.scheme._peers_of_solid`). Each peer keeps all of its candidates when it has
at most ``nc``, else the ``nc`` of them with the largest Efraimidis-Spirakis keys

    ``key = log(u) / max(in_degree, 1)``,
    ``u = to_unit_open(hash_chain(hash_key(call, j), VID_o))`` (:func:`push_keys`),

which draws ``nc`` of them without replacement with probability proportional to in-degree.
``u`` is counter-based (:mod:`distmb.core.rng`): ``call`` = :func:`push_call_key` of (seed,
epoch, iteration, layer, rank), so a candidate's key depends on nothing else (not on the
batch's order, the device or the thread count); among equal keys the smaller position wins.
The result is grouped by peer (rank 0's first), each peer's positions ascending.

Two implementations of the same choice:

- :func:`select_push_host`: numpy on the host (a stable radix sort by peer; keys, with torch
  on CPU tensors, only for the peers above the cap; a linear-time partition per such
  peer): the CPU path;
- :func:`select_push_device`: torch ops on the block's device (padded CSR expansion, sorts,
  no host round trip; the per-peer counts, int64[P], are the only values copied to the
  host): the GPU path.

Both compute the keys with :func:`push_keys` (torch, float64), so they choose the same rows
on the CPU; on a GPU ``log`` may round differently in the last bit, which can change a choice
only where two keys at the cap agree to one ulp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from distmb.core.host_reads import to_host
from distmb.core.rng import hash_key, hash_key_t, mix64_t, to_signed, to_unit_open
from distmb.data.graph import csr_row_positions

#: The smallest weight of a candidate (an in-degree of 0 counts as 1).
MIN_WEIGHT = 1.0


def push_call_key(seed: int, epoch: int, iteration: int, layer: int, rank: int) -> int:
    """The hash key (uint64 as a Python int) of one push: of ``(seed, epoch, iteration,
    layer, rank)``."""
    return hash_key(hash_key(seed, epoch, iteration, layer), rank)


def peer_keys(call_key: int, num_peers: int, device: torch.device) -> torch.Tensor:
    """int64[num_peers] on ``device``: ``hash_key(call_key, j)`` of every peer ``j``."""
    return hash_key_t(call_key, torch.arange(num_peers, device=device))


def push_keys(
    peer_key: int | torch.Tensor, vid_mix: torch.Tensor, degree: torch.Tensor
) -> torch.Tensor:
    """float64[n] Efraimidis-Spirakis keys (all negative) on the candidates' device.

    Args:
        peer_key: ``hash_key(call, j)`` of the candidates' peers: a Python int (one peer) or
            int64[n] (gathered from :func:`peer_keys`).
        vid_mix: int64[n], ``mix64(VID_o)`` of the candidates (:attr:`PushTables.vid_mix`).
        degree: float64[n], their in-degrees.

    Returns:
        ``log(u) / max(degree, 1)`` with ``u = to_unit_open(mix64(peer_key ^ vid_mix))``,
        i.e. ``to_unit_open(hash_chain(peer_key, VID_o))``: one splitmix64 step per
        candidate, the vertex's own step taken once per part.
    """
    peer_key = to_signed(peer_key) if isinstance(peer_key, int) else peer_key
    u = to_unit_open(mix64_t(vid_mix ^ peer_key))
    return torch.log_(u).div_(degree.clamp_min(MIN_WEIGHT))


@dataclass(frozen=True)
class PushTables:
    """What the choice reads, per solid vertex of the part (host arrays or tensors on one
    device).

    Attributes:
        peer_ptr: int64[n_solid + 1], CSR pointers of the peers holding each solid vertex.
        peer_ids: int64[n_send] (int32 allowed on the host), those peers' ranks.
        orig_ids: int64[n_local], ``VID_o`` of every local vertex (solid first): the tags.
        vid_mix: int64[n_solid], ``mix64(VID_o)`` of the solid vertices (the key's
            per-vertex hash step, computed once).
        degree: float64[n_solid], in-degrees (the sampling weights).
        max_peers: the most peers any solid vertex has (the width of the padded expansion).
    """

    peer_ptr: np.ndarray | torch.Tensor
    peer_ids: np.ndarray | torch.Tensor
    orig_ids: np.ndarray | torch.Tensor
    vid_mix: np.ndarray | torch.Tensor
    degree: np.ndarray | torch.Tensor
    max_peers: int

    @classmethod
    def on_host(
        cls, peer_ptr: np.ndarray, peer_ids: np.ndarray, orig_ids: np.ndarray, degree: np.ndarray
    ) -> PushTables:
        widths = np.diff(peer_ptr)
        solid_vid = torch.from_numpy(np.array(orig_ids[: degree.size], dtype=np.int64))
        vid_mix = mix64_t(solid_vid).numpy()
        return cls(peer_ptr, peer_ids, orig_ids, vid_mix, degree, int(widths.max(initial=0)))

    def to(self, device: torch.device, orig_ids: torch.Tensor | None = None) -> PushTables:
        """A copy on ``device`` (``orig_ids``: an int64 copy already there, reused)."""

        def put(a: np.ndarray | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            # np.array: a writable copy (the partition's arrays may be memory-mapped).
            t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.array(a))
            return t.to(device=device, dtype=dtype)

        return PushTables(
            put(self.peer_ptr, torch.int64),
            put(self.peer_ids, torch.int64),
            orig_ids if orig_ids is not None else put(self.orig_ids, torch.int64),
            put(self.vid_mix, torch.int64),
            put(self.degree, torch.float64),
            self.max_peers,
        )


def select_push_host(
    solid: np.ndarray, tables: PushTables, nc: int, num_peers: int, call_key: int
) -> tuple[np.ndarray, np.ndarray]:
    """The rows to push, on the host.

    Args:
        solid: int64[n], the block's computed sources (VID_p of solid vertices).
        tables: :class:`PushTables` of host arrays.
        nc: the most rows per peer (``>= 1``).
        num_peers: P, the number of ranks.
        call_key: :func:`push_call_key` of this push.

    Returns:
        ``(positions int64[m], counts int64[P])``: indices into ``solid``, grouped by peer
        (``counts[j]`` for peer ``j``), ascending within a peer.
    """
    starts = tables.peer_ptr[solid]
    per_src = tables.peer_ptr[solid + 1] - starts
    pos = np.repeat(np.arange(solid.size, dtype=np.int64), per_src)
    peer = tables.peer_ids[csr_row_positions(starts, per_src)]
    order = np.argsort(peer, kind="stable")
    pos, peer = pos[order], peer[order]
    counts = np.bincount(peer, minlength=num_peers).astype(np.int64)
    if counts.max(initial=0) <= nc:
        return pos, counts
    bounds = np.concatenate([[0], np.cumsum(counts)])
    keep = []
    for j in range(num_peers):
        group = pos[bounds[j] : bounds[j + 1]]
        if counts[j] > nc:
            src = solid[group]
            keys = push_keys(
                hash_key(call_key, j),
                torch.from_numpy(tables.vid_mix[src]),
                torch.from_numpy(np.asarray(tables.degree[src], dtype=np.float64)),
            )
            group = group[_largest(keys.numpy(), nc)]
            counts[j] = nc
        keep.append(group)
    return np.concatenate(keep), counts


def _largest(keys: np.ndarray, k: int) -> np.ndarray:
    """int64[k], ascending: the indices of the ``k`` largest ``keys`` (``k < keys.size``),
    the smaller indices first among keys equal to the ``k``-th largest."""
    kth = np.partition(keys, keys.size - k)[keys.size - k]
    above = np.flatnonzero(keys > kth)
    ties = np.flatnonzero(keys == kth)[: k - above.size]
    return np.sort(np.concatenate([above, ties]))


def select_push_device(
    solid: torch.Tensor, tables: PushTables, nc: int, num_peers: int, call_key: int
) -> tuple[torch.Tensor, np.ndarray]:
    """:func:`select_push_host` with torch ops on ``solid``'s device.

    Args:
        solid: int64[n] on the device of ``tables`` (tensors there).

    Returns:
        ``(positions int64[m] on the device, counts int64[P] on the host)``: the same
        choice as :func:`select_push_host` (see the module notes on ``log``). Reading the
        counts is the one host synchronisation.
    """
    n = solid.numel()
    if n == 0 or tables.max_peers == 0:
        return torch.empty(0, dtype=torch.int64, device=solid.device), np.zeros(num_peers, np.int64)
    ordered, kept = rank_candidates_device(solid, tables, nc, num_peers, call_key)
    counts = to_host(kept).numpy()
    return ordered[: int(counts.sum())] % n, counts


def rank_candidates_device(
    solid: torch.Tensor, tables: PushTables, nc: int, num_peers: int, call_key: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The device work of :func:`select_push_device`, without a host synchronisation.

    Returns:
        ``(ordered, kept)`` on the device: ``ordered`` int64[n * max_peers], the chosen
        candidates as ``peer * n + position`` ascending, then ``num_peers * n`` for the rest;
        ``kept`` int64[P], the chosen per peer (``min(candidates, nc)``).
    """
    device = solid.device
    n, width = solid.numel(), tables.max_peers
    # Padded expansion: slot (i, r) is the r-th peer of solid[i] when r < its peer count.
    starts = tables.peer_ptr[solid]
    per_src = tables.peer_ptr[solid + 1] - starts
    r = torch.arange(width, device=device)
    valid = (r < per_src[:, None]).reshape(-1)
    slot = (starts[:, None] + r).reshape(-1).clamp_max(tables.peer_ids.numel() - 1)
    peer = torch.where(valid, tables.peer_ids[slot], num_peers)  # P: no peer
    pos = torch.arange(n, device=device)[:, None].expand(n, width).reshape(-1)
    cand = torch.zeros(num_peers + 1, dtype=torch.int64, device=device)
    cand.scatter_add_(0, peer, torch.ones_like(peer))
    if nc < n:  # else no peer can have more than nc candidates (one per position)
        src = solid[pos]
        # The empty slots (peer P) get peer P - 1's keys: they are never chosen.
        keys_of_peer = peer_keys(call_key, num_peers, device)[peer.clamp_max(num_peers - 1)]
        keys = push_keys(keys_of_peer, tables.vid_mix[src], tables.degree[src])
        # By peer, then key descending; stable sorts: among equal keys the smaller position.
        order = torch.sort(keys, descending=True, stable=True).indices
        order = order[torch.sort(peer[order], stable=True).indices]
        peer, pos = peer[order], pos[order]
        first = torch.cumsum(cand, 0) - cand  # each peer's first index in the sorted order
        rank_in_peer = torch.arange(peer.numel(), device=device) - first[peer]
        valid = (peer < num_peers) & (rank_in_peer < nc)
    # The kept candidates by (peer, position); the rest after them.
    ordered = torch.sort(torch.where(valid, peer * n + pos, num_peers * n)).values
    return ordered, torch.clamp_max(cand[:num_peers], nc)
