"""Fused-Map: unique + relabel of sampled ids into block positions (FastGL, section 4.3).

Input: ``keys = concat(dst, sampled)`` (int64[m], the ``n_dst`` destinations first, then
the sampled in-neighbours in edge order). Output: the block's source list ``src_ids`` --
the destinations in their order, then the new sources in order of first appearance, split
into solid ones (``key < n_solid``) and then halo ones, as the block contract requires
(:mod:`distmb.pipeline.sample.host`) -- and ``local: int64[m]``, the position of every key
in ``src_ids``.

Two grouping back ends find, for every key, its group (one id per distinct key) and whether
it is the first occurrence of that key:

- ``"triton"`` (:mod:`distmb.pipeline.sample.idmap_triton`): one pass over a device hash table with
  atomic compare-and-swap and linear probing; each insert also records the smallest input
  position of its key (atomic min), so first appearances come out of the same pass. No sort.
- ``"torch"``: ``torch.unique(return_inverse=True)`` + a scatter-min of positions (sort
  based); the baseline and the fallback where Triton is absent.

The relabel after the grouping is shared: two prefix sums over the first-appearance flags
(solid and halo) give every new source its position, written once per group and read back
by every key (gathers, no probing). Unlike FastGL's atomic counter, which numbers keys in
the order threads happen to win, the numbering is deterministic and equals the C++
sampler's.

Host synchronisation: exactly one per call, reading three counts (new solid sources, new
halo sources, repeated destinations) that size the output (``torch.unique`` of the
``"torch"`` back end adds its own, internal, for the number of distinct keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

#: The grouping back ends; ``"auto"`` is Triton when it is importable and the keys are on a
#: CUDA device (or ``TRITON_INTERPRET=1`` is set), else torch.
Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")


class RepeatedDestinationError(ValueError):
    """A destination id occurs twice in ``keys[:n_dst]``; :attr:`key` is the id."""

    def __init__(self, key: int) -> None:
        super().__init__(f"destinations must be distinct; id {key} occurs more than once")
        self.key = key


@dataclass
class MappedIds:
    """Result of :func:`fused_map`.

    Attributes:
        src_ids: int64[n_dst + n_new_solid + n_halo], the block's sources (see module doc).
        local: int64[m], ``src_ids[local[i]] == keys[i]``.
        n_halo: number of new sources with ``key >= n_solid`` (the last ones of ``src_ids``).
    """

    src_ids: torch.Tensor
    local: torch.Tensor
    n_halo: int


def torch_groups(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Group keys with ``torch.unique``: (group int64[m], first bool[m], n_groups)."""
    m = keys.shape[0]
    uniq, inverse = torch.unique(keys, return_inverse=True)
    n_groups = int(uniq.shape[0])
    positions = torch.arange(m, dtype=torch.int64, device=keys.device)
    first_pos = torch.full((n_groups,), m, dtype=torch.int64, device=keys.device)
    first_pos.scatter_reduce_(0, inverse, positions, reduce="amin")
    return inverse, first_pos[inverse] == positions, n_groups


def resolve_backend(backend: str, device: torch.device) -> str:
    """``"triton"`` or ``"torch"`` for ``backend`` on ``device``.

    Raises:
        ValueError: an unknown back end, or ``"triton"`` where it cannot run.
    """
    from distmb.pipeline.sample import idmap_triton

    if backend not in BACKENDS:
        raise ValueError(f"Fused-Map back end {backend!r}: expected one of {BACKENDS}")
    usable, why = idmap_triton.usable(device)
    if backend == "auto":
        return "triton" if usable else "torch"
    if backend == "triton" and not usable:
        raise ValueError(f"Fused-Map back end 'triton' cannot run on {device}: {why}")
    return backend


def fused_map(
    keys: torch.Tensor,
    n_dst: int,
    n_solid: int | None = None,
    backend: Backend = "auto",
    capacity: int | None = None,
) -> MappedIds:
    """Unique + relabel ``keys`` into block positions (see the module docstring).

    Args:
        keys: int64[m], non-negative ids on any device; ``keys[:n_dst]`` are the
            destinations and must be distinct.
        n_dst: number of destinations at the front of ``keys``.
        n_solid: ids ``>= n_solid`` are halo leaves, placed after the new solid sources;
            ``None``: no split (plain first-appearance order).
        backend: ``"auto"``, ``"triton"`` or ``"torch"`` (see :data:`BACKENDS`).
        capacity: hash-table slots for the Triton back end (a power of two ``>= m``;
            default the smallest power of two ``>= 2 m``). Ignored by ``"torch"``.

    Returns:
        :class:`MappedIds` on the device of ``keys``.

    Raises:
        RepeatedDestinationError: a destination occurs twice (a ValueError naming it).
        ValueError: keys not a 1-D int64 tensor, ``n_dst`` outside ``[0, m]``, a negative key,
            a bad ``capacity`` or back end.
    """
    if keys.dim() != 1 or keys.dtype != torch.int64:
        raise ValueError(f"keys must be a 1-D int64 tensor (got {keys.dtype}, {keys.dim()}-D)")
    m = int(keys.shape[0])
    if not 0 <= n_dst <= m:
        raise ValueError(f"n_dst={n_dst} is outside [0, len(keys)={m}]")
    device = keys.device
    if m == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return MappedIds(empty, empty.clone(), 0)
    if resolve_backend(backend, device) == "triton":
        from distmb.pipeline.sample.idmap_triton import triton_groups

        group, first, n_groups = triton_groups(keys, capacity)
    else:
        group, first, n_groups = torch_groups(keys)
    return _relabel(keys, n_dst, n_solid, group, first, n_groups)


def _relabel(
    keys: torch.Tensor,
    n_dst: int,
    n_solid: int | None,
    group: torch.Tensor,
    first: torch.Tensor,
    n_groups: int,
) -> MappedIds:
    """Positions from a grouping: group int64[m] in ``[0, n_groups)``, first bool[m]."""
    m, device = keys.shape[0], keys.device
    new = first.clone()
    new[:n_dst] = False
    solid = torch.ones_like(new) if n_solid is None else keys < n_solid
    new_solid, new_halo = new & solid, new & ~solid
    rank_solid = torch.cumsum(new_solid, 0)
    rank_halo = torch.cumsum(new_halo, 0)
    counts = torch.stack([rank_solid[-1], rank_halo[-1], (~first[:n_dst]).sum(), (keys < 0).sum()])
    n_new_solid, n_halo, repeated, negative = counts.tolist()  # the one host sync
    if negative:
        bad = int(keys[keys < 0][0])
        raise ValueError(f"keys must be non-negative (got {bad})")
    if repeated:
        at = int(torch.nonzero(~first[:n_dst])[0, 0])
        raise RepeatedDestinationError(int(keys[at]))
    positions = torch.arange(m, dtype=torch.int64, device=device)
    local_new = torch.where(new_solid, n_dst + rank_solid - 1, n_dst + n_new_solid + rank_halo - 1)
    first_local = torch.where(positions < n_dst, positions, local_new)
    # Every group's position, written by its first occurrence; the others write to a spare
    # slot (index n_groups / n_src) that is dropped.
    group_local = torch.empty(n_groups + 1, dtype=torch.int64, device=device)
    group_local.scatter_(0, torch.where(first, group, n_groups), first_local)
    local = group_local[group]
    n_src = n_dst + n_new_solid + n_halo
    src_ids = torch.empty(n_src + 1, dtype=torch.int64, device=device)
    src_ids.scatter_(0, torch.where(first, local, n_src), keys)
    return MappedIds(src_ids[:n_src], local, int(n_halo))
