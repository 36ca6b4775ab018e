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

Host synchronisation: exactly one per call, reading the counts (new solid sources, new
halo sources, repeated destinations, negative keys) that size the output, through
:func:`distmb.core.host_reads.host_values`; :func:`start_map` stops before it, so that a
caller reads its own values in the same sync (``torch.unique`` of the ``"torch"`` back end
adds its own, internal, for the number of distinct keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from distmb.core.host_reads import host_scalar, host_values

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
    pending = start_map(keys, n_dst, n_solid, backend, capacity)
    return pending.finish(host_values(pending.counts))  # the one host sync


def start_map(
    keys: torch.Tensor,
    n_dst: int,
    n_solid: int | None = None,
    backend: Backend = "auto",
    capacity: int | None = None,
) -> PendingMap:
    """:func:`fused_map` up to its host sync: the grouping and the counts on the device.

    A caller that reads other device values too reads them together with
    :attr:`PendingMap.counts` (one sync), then calls :meth:`PendingMap.finish`. Arguments
    and checks as :func:`fused_map` (the data checks happen in ``finish``)."""
    if keys.dim() != 1 or keys.dtype != torch.int64:
        raise ValueError(f"keys must be a 1-D int64 tensor (got {keys.dtype}, {keys.dim()}-D)")
    m = int(keys.shape[0])
    if not 0 <= n_dst <= m:
        raise ValueError(f"n_dst={n_dst} is outside [0, len(keys)={m}]")
    if m == 0:
        group = torch.zeros(0, dtype=torch.int64, device=keys.device)
        return PendingMap(keys, n_dst, n_solid, group, group.bool(), 0)
    if resolve_backend(backend, keys.device) == "triton":
        from distmb.pipeline.sample.idmap_triton import triton_groups

        group, first, n_groups = triton_groups(keys, capacity)
    else:
        group, first, n_groups = torch_groups(keys)
    return PendingMap(keys, n_dst, n_solid, group, first, n_groups)


class PendingMap:
    """A grouping of ``keys`` (group int64[m] in ``[0, n_groups)``, first bool[m]) waiting
    for its counts: :attr:`counts` is int64[4] on the device (new solid sources, new halo
    sources, repeated destinations, negative keys), :meth:`finish` takes them read back."""

    def __init__(
        self,
        keys: torch.Tensor,
        n_dst: int,
        n_solid: int | None,
        group: torch.Tensor,
        first: torch.Tensor,
        n_groups: int,
    ) -> None:
        self.keys, self.n_dst, self.n_solid = keys, n_dst, n_solid
        self.group, self.first, self.n_groups = group, first, n_groups
        new = first.clone()
        new[:n_dst] = False
        solid = torch.ones_like(new) if n_solid is None else keys < n_solid
        self.new_solid, self.new_halo = new & solid, new & ~solid
        self.rank_solid = torch.cumsum(self.new_solid, 0)
        self.rank_halo = torch.cumsum(self.new_halo, 0)
        if keys.numel():
            new_counts = [self.rank_solid[-1], self.rank_halo[-1]]
        else:
            new_counts = [torch.zeros((), dtype=torch.int64, device=keys.device)] * 2
        self.counts = torch.stack([*new_counts, (~first[:n_dst]).sum(), (keys < 0).sum()])

    def finish(self, counts: list[int]) -> MappedIds:
        """The positions, from :attr:`counts` read back (``counts``: their 4 values).

        Raises:
            RepeatedDestinationError, ValueError: as :func:`fused_map`.
        """
        keys, n_dst, first, group = self.keys, self.n_dst, self.first, self.group
        n_new_solid, n_halo, repeated, negative = counts
        if negative:
            bad = host_scalar(keys[keys < 0][0])
            raise ValueError(f"keys must be non-negative (got {bad})")
        if repeated:
            at = host_scalar(torch.nonzero(~first[:n_dst])[0, 0])
            raise RepeatedDestinationError(host_scalar(keys[at]))
        m, device = keys.shape[0], keys.device
        if m == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=device)
            return MappedIds(empty, empty.clone(), 0)
        positions = torch.arange(m, dtype=torch.int64, device=device)
        local_new = torch.where(
            self.new_solid,
            n_dst + self.rank_solid - 1,
            n_dst + n_new_solid + self.rank_halo - 1,
        )
        first_local = torch.where(positions < n_dst, positions, local_new)
        # Every group's position, written by its first occurrence; the others write to a
        # spare slot (index n_groups / n_src) that is dropped.
        group_local = torch.empty(self.n_groups + 1, dtype=torch.int64, device=device)
        group_local.scatter_(0, torch.where(first, group, self.n_groups), first_local)
        local = group_local[group]
        n_src = n_dst + n_new_solid + n_halo
        src_ids = torch.empty(n_src + 1, dtype=torch.int64, device=device)
        src_ids.scatter_(0, torch.where(first, local, n_src), keys)
        return MappedIds(src_ids[:n_src], local, int(n_halo))
