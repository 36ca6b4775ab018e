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

**Without reading the counts** (:meth:`PendingMap.finish_on_device`): the number of
destinations may be an int64 device scalar (positions ``< n_dst`` are destinations), and the
outputs are sized by the key count ``m`` instead of the source count: ``src_ids:
int64[m + 1]`` whose first ``n_src`` entries are the sources (the rest unspecified, slot
``m`` the spare that non-first keys write to), with ``n_src`` and the other counts left on
the device. A caller that maps several layers reads all their counts in one sync and checks
them with :func:`raise_map_errors` (:mod:`distmb.pipeline.sample.device_batch`). With the
Triton back end the grouping needs no host value either (its group ids are hash slots, their
number the table's capacity). The one-read sampler's Triton path numbers the keys in Triton
kernels instead of this module's PyTorch ops, with the same numbering and counts
(:mod:`distmb.pipeline.sample.relabel_triton`).
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


#: The number of destinations: a host int, or an int64 device scalar (0-d or one element)
#: that is never read on the host.
DestinationCount = int | torch.Tensor


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


@dataclass
class BoundedIds:
    """Result of :meth:`PendingMap.finish_on_device`: sized by the key count ``m``, no host
    read.

    Attributes:
        src_ids: int64[m + 1], the block's sources in their first ``n_src`` entries (module
            doc), the rest unspecified.
        local: int64[m], ``src_ids[local[i]] == keys[i]``.
        n_computed: int64 device scalar, ``n_dst + n_new_solid`` (sources that are not
            halo leaves).
        counts: int64[4] on the device: new solid sources, new halo sources, repeated
            destinations, negative keys (:attr:`PendingMap.counts`).
    """

    src_ids: torch.Tensor
    local: torch.Tensor
    n_computed: torch.Tensor
    counts: torch.Tensor


def torch_groups(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Group keys with ``torch.unique``: (group int64[m], first bool[m], n_groups)."""
    m = keys.shape[0]
    uniq, inverse = torch.unique(keys, return_inverse=True)
    n_groups = int(uniq.shape[0])
    positions = torch.arange(m, dtype=torch.int64, device=keys.device)
    first_pos = torch.full((n_groups,), m, dtype=torch.int64, device=keys.device)
    first_pos.scatter_reduce_(0, inverse, positions, reduce="amin")
    return inverse, first_pos[inverse] == positions, n_groups


def resolve_backend(backend: str, device: torch.device, what: str = "Fused-Map back end") -> str:
    """``"triton"`` or ``"torch"`` for ``backend`` (one of :data:`BACKENDS`) on ``device``:
    ``"auto"`` is Triton where it can run. ``what`` names the choice in errors (the device
    sampler's layer kernel resolves its back end here too).

    Raises:
        ValueError: an unknown back end, or ``"triton"`` where it cannot run.
    """
    from distmb.pipeline.sample import idmap_triton

    if backend not in BACKENDS:
        raise ValueError(f"{what} {backend!r}: expected one of {BACKENDS}")
    usable, why = idmap_triton.usable(device)
    if backend == "auto":
        return "triton" if usable else "torch"
    if backend == "triton" and not usable:
        raise ValueError(f"{what} 'triton' cannot run on {device}: {why}")
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
    n_dst: DestinationCount,
    n_solid: int | None = None,
    backend: Backend = "auto",
    capacity: int | None = None,
) -> PendingMap:
    """:func:`fused_map` up to its host sync: the grouping and the counts on the device.

    A caller that reads other device values too reads them together with
    :attr:`PendingMap.counts` (one sync), then calls :meth:`PendingMap.finish`; or it
    relabels without reading, :meth:`PendingMap.finish_on_device`. Arguments and checks as
    :func:`fused_map` (the data checks happen in ``finish``, or by :func:`raise_map_errors`
    on the counts read back), except that ``n_dst`` may be an int64 device scalar
    (:data:`DestinationCount`), which is not checked: the caller keeps it in ``[0, m]``."""
    if keys.dim() != 1 or keys.dtype != torch.int64:
        raise ValueError(f"keys must be a 1-D int64 tensor (got {keys.dtype}, {keys.dim()}-D)")
    m = int(keys.shape[0])
    if isinstance(n_dst, torch.Tensor):
        if n_dst.dtype != torch.int64 or n_dst.numel() != 1 or n_dst.device != keys.device:
            raise ValueError(
                f"n_dst as a tensor must be one int64 value on the keys' device (got "
                f"{n_dst.dtype}, {n_dst.numel()} elements, on {n_dst.device})"
            )
        n_dst = n_dst.reshape(())
    elif not 0 <= n_dst <= m:
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
    sources, repeated destinations, negative keys), :meth:`finish` takes them read back;
    :meth:`finish_on_device` relabels without them."""

    def __init__(
        self,
        keys: torch.Tensor,
        n_dst: DestinationCount,
        n_solid: int | None,
        group: torch.Tensor,
        first: torch.Tensor,
        n_groups: int,
    ) -> None:
        self.keys, self.n_dst, self.n_solid = keys, n_dst, n_solid
        self.group, self.first, self.n_groups = group, first, n_groups
        self._positions: torch.Tensor | None = None
        self._is_dst: torch.Tensor | None = None
        if isinstance(n_dst, torch.Tensor):  # a device scalar: positions < n_dst, no read
            self._positions = torch.arange(keys.shape[0], dtype=torch.int64, device=keys.device)
            self._is_dst = self._positions < n_dst
            # On bools, a > b is a & ~b in one op: first occurrences past the destinations,
            # and destinations that are not first occurrences.
            new = first > self._is_dst
            repeated = (self._is_dst > first).sum()
        else:
            new = first.clone()
            new[:n_dst] = False
            repeated = (~first[:n_dst]).sum()
        solid = torch.ones_like(new) if n_solid is None else keys < n_solid
        self.new_solid, self.new_halo = new & solid, new & ~solid
        self.rank_solid = torch.cumsum(self.new_solid, 0)
        self.rank_halo = torch.cumsum(self.new_halo, 0)
        if keys.numel():
            new_counts = [self.rank_solid[-1], self.rank_halo[-1]]
        else:
            new_counts = [torch.zeros((), dtype=torch.int64, device=keys.device)] * 2
        self.counts = torch.stack([*new_counts, repeated, (keys < 0).sum()])

    def finish(self, counts: list[int]) -> MappedIds:
        """The positions, from :attr:`counts` read back (``counts``: their 4 values), for a
        host ``n_dst``.

        Raises:
            RepeatedDestinationError, ValueError: as :func:`fused_map`.
            TypeError: ``n_dst`` is a device scalar (use :meth:`finish_on_device`).
        """
        keys, n_dst = self.keys, self.n_dst
        if isinstance(n_dst, torch.Tensor):
            raise TypeError("finish needs n_dst on the host; with a device n_dst, finish_on_device")
        n_new_solid, n_halo, repeated, negative = counts
        raise_map_errors(keys, self.first, n_dst, repeated, negative)
        m, device = keys.shape[0], keys.device
        if m == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=device)
            return MappedIds(empty, empty.clone(), 0)
        n_src = n_dst + n_new_solid + n_halo
        local, src_ids = self._relabel(n_dst + n_new_solid, n_src)
        return MappedIds(src_ids[:n_src], local, int(n_halo))

    def finish_on_device(self) -> BoundedIds:
        """The positions without a host read, sized by the key count (module docstring).

        The data checks are the caller's: it reads :attr:`counts` (with its own values)
        and passes them to :func:`raise_map_errors` before it trusts the result."""
        n_computed = self.n_dst + self.counts[0]  # destinations + new solid sources
        local, src_ids = self._relabel(n_computed, int(self.keys.shape[0]))
        return BoundedIds(src_ids, local, n_computed, self.counts)

    def _relabel(
        self, n_computed: int | torch.Tensor, spare: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(local int64[m], src_ids int64[spare + 1])``: every key's position, and the
        sources written by their first occurrences (the others write to slot ``spare``);
        ``n_computed``: ``n_dst`` + the new solid sources (where the halo ones start)."""
        keys, n_dst, first, group = self.keys, self.n_dst, self.first, self.group
        m, device = keys.shape[0], keys.device
        positions, is_dst = self._positions, self._is_dst
        if positions is None or is_dst is None:
            positions = torch.arange(m, dtype=torch.int64, device=device)
            is_dst = positions < n_dst
        local_new = torch.where(
            self.new_solid,
            n_dst + self.rank_solid - 1,
            n_computed + self.rank_halo - 1,
        )
        first_local = torch.where(is_dst, positions, local_new)
        # Every group's position, written by its first occurrence; the others write to a
        # spare slot (index n_groups / spare) that is dropped.
        group_local = torch.empty(self.n_groups + 1, dtype=torch.int64, device=device)
        group_local.scatter_(0, torch.where(first, group, self.n_groups), first_local)
        local = group_local[group]
        src_ids = torch.empty(spare + 1, dtype=torch.int64, device=device)
        src_ids.scatter_(0, torch.where(first, local, spare), keys)
        return local, src_ids


def raise_map_errors(
    keys: torch.Tensor, first: torch.Tensor, n_dst: int, repeated: int, negative: int
) -> None:
    """Raise :func:`fused_map`'s data errors from the counts read back (``repeated``
    destinations, ``negative`` keys), naming the first bad key (a host read, on the error
    path only); ``first``: the grouping's first-occurrence flags, bool[m].

    Raises:
        ValueError: a negative key.
        RepeatedDestinationError: a destination that occurs twice in ``keys[:n_dst]``.
    """
    if negative:
        bad = host_scalar(keys[keys < 0][0])
        raise ValueError(f"keys must be non-negative (got {bad})")
    if repeated:
        at = host_scalar(torch.nonzero(~first[:n_dst])[0, 0])
        raise RepeatedDestinationError(host_scalar(keys[at]))
