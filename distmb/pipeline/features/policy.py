"""Replacement policies of an out-of-core feature cache (Ginex's superbatch inspector, and LRU).

A cache of ``capacity`` row slots (slot ids ``[0, capacity)``) holds some rows of a feature
table of ``num_rows`` rows. The planners here keep only its *directory* (which row id is in
which slot) and decide, for every access, whether it hits and which slot a miss fills; an
executor that owns the rows applies the decisions. Contract of a plan, for one gather (a
segment of ids, unique within it), in the order the executor applies it:

1. every access with ``hit_slot[t] != NO_SLOT`` copies its row from that slot, as the slot
   is at the start of the gather;
2. the other rows are read from storage;
3. every missed row with ``fill_slot[t] != NO_SLOT`` is written into that slot, in access
   order (a later fill of the same gather may replace an earlier one).

Slots are filled lowest first and never freed except by ``reset()``, so the occupied slots are
``[0, cached_count)``.

- :class:`BeladyPlanner` (Ginex, "Feature Cache Policy" and "Changeset Precomputation"): the
  trainer knows the ids that the K mini-batches of a superbatch will gather (the *trace*), so
  the inspector plans Belady's MIN with bypass gather by gather, optimal in misses: since the
  executor copies a gather's hits before it writes any fill, every id cached at the start of
  a gather hits, and only then are its misses placed, in order: a miss takes a free slot; with
  none free it replaces the cached id whose next use (after this gather) is farthest, a row
  this gather already copied included, when its own next use is nearer, and is not inserted
  otherwise. The directory carries over from one superbatch to the next.
- :class:`LruPlanner`: least recently used, decided gather by gather (no look-ahead); every
  miss is inserted.

Both run in C++ (``distmb._C``, without the GIL): planning is ``O(T log capacity)`` for a trace
of ``T`` accesses, LRU ``O(1)`` per access. Memory: 12 bytes per row id (Belady; 5 for LRU),
up to 48 bytes per slot (Belady; 24 for LRU), and for a plan 24 bytes per access (8 of scratch,
16 of output).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from distmb import _C

#: Slot value meaning "miss" (``hit_slot``), "not inserted" (``fill_slot``) or "free"
#: (``slot_ids()``).
NO_SLOT: int = int(_C.CACHE_NO_SLOT)

#: Row ids: a 1-D integer numpy array, CPU tensor or sequence of integers.
IdsLike = np.ndarray | torch.Tensor | Sequence[int]


class CachePlan(NamedTuple):
    """The decisions for ``T`` accesses, both int64[T]:

    - ``hit_slot[t]``: the slot holding the id of access ``t`` at the start of its gather, or
      :data:`NO_SLOT` for a miss;
    - ``fill_slot[t]``: for a miss, the slot its row is written into after the gather's reads,
      or :data:`NO_SLOT` when it is not cached (bypass); always :data:`NO_SLOT` for a hit.
    """

    hit_slot: np.ndarray
    fill_slot: np.ndarray

    @property
    def misses(self) -> int:
        """Accesses that read storage."""
        return int(np.count_nonzero(self.hit_slot == NO_SLOT))


def _int_array(values: IdsLike, name: str) -> np.ndarray:
    """``values`` as a 1-D C-contiguous int64 numpy array (no copy when it already is one)."""
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU (got device {values.device})")
        values = values.detach().numpy()
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of integers (got shape {list(arr.shape)})")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers (got dtype {arr.dtype})")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise IndexError(f"{name} holds {int(arr.max())}, which is not a row id")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_size(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    if int(value) < 0:
        raise ValueError(f"{name} must be >= 0 (got {int(value)})")
    return int(value)


class _Directory:
    """What both planners share: sizes, ``slot_ids``, ``cached_count``, ``reset``."""

    def __init__(self, core: _C.BeladyPlanner | _C.LruCache) -> None:
        self._core = core

    @property
    def capacity(self) -> int:
        """Number of slots."""
        return int(self._core.capacity)

    @property
    def num_rows(self) -> int:
        """Row ids are in ``[0, num_rows)``."""
        return int(self._core.num_rows)

    @property
    def cached_count(self) -> int:
        """Slots holding an id (they are ``[0, cached_count)``)."""
        return int(self._core.cached_count)

    def slot_ids(self) -> np.ndarray:
        """int64[capacity]: the id held by every slot, :data:`NO_SLOT` for a free one (a new
        array)."""
        return self._core.slot_ids()

    def reset(self) -> None:
        """Empty the cache (every slot free)."""
        self._core.reset()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self.capacity}, num_rows={self.num_rows}, "
            f"cached_count={self.cached_count})"
        )


class BeladyPlanner(_Directory):
    """Belady's MIN with bypass, gather by gather, over a superbatch's known trace (Ginex's
    inspector).

    Args:
        capacity: number of slots, ``>= 0`` (0: every access misses and nothing is filled;
            ``capacity >= num_rows`` is allowed).
        num_rows: row ids are in ``[0, num_rows)``; the planner keeps 12 bytes per row id.

    Raises:
        ValueError: a negative or non-integer size, or ``capacity >= 2**31``.
    """

    def __init__(self, capacity: int, num_rows: int) -> None:
        capacity = _check_size(capacity, "capacity")
        num_rows = _check_size(num_rows, "num_rows")
        super().__init__(_C.BeladyPlanner(capacity, num_rows))

    def plan(self, trace: IdsLike, batch_ptr: IdsLike | None = None) -> CachePlan:
        """Plan the accesses ``trace`` (int64[T], in order) split into gathers by
        ``batch_ptr`` (int64[B + 1], from 0 to T, non-decreasing; gather ``b`` is
        ``trace[batch_ptr[b]:batch_ptr[b + 1]]``; None: one gather), and leave the directory
        as the executor will have it after applying the plan.

        Gather by gather: first every access whose id is cached at the start of the gather hits
        (wherever it is in the gather); then the misses, in order, each take the lowest free
        slot; with none free, let ``F`` be the farthest next use (position in this trace, after
        this gather) among the cached ids, those this gather hit or filled included, and ``N``
        that of the missed id (never used again counts as infinitely far): if ``N < F`` the id
        with next use ``F`` is replaced, else the access bypasses the cache. Among cached ids
        never used again, the one in the lowest slot is replaced first. A slot may be filled
        twice within a gather (the later fill holds). The resulting number of misses is the
        minimum that any policy changing the cache between gathers (each gather misses exactly
        its ids not cached at its start) can reach on this trace from this directory; never
        more than deciding access by access. Ids cached by an earlier plan keep their slots and
        get their next uses from this trace.

        Returns:
            :class:`CachePlan` ``(hit_slot int64[T], fill_slot int64[T])``.

        Raises:
            ValueError: a malformed ``trace`` or ``batch_ptr``, or an id repeated within a
                gather (the message names the gather and the id). The directory is unchanged.
            IndexError: an id outside ``[0, num_rows)`` (named). The directory is unchanged.
        """
        ids = _int_array(trace, "trace")
        if batch_ptr is None:
            ptr = np.array([0, ids.size], dtype=np.int64)
        else:
            ptr = _int_array(batch_ptr, "batch_ptr")
            if ptr.size == 0:
                raise ValueError("batch_ptr must hold B + 1 >= 1 entries (got an empty array)")
        hit, fill = self._core.plan(ids, ptr)
        return CachePlan(hit, fill)

    def plan_batches(self, batches: Sequence[IdsLike]) -> list[CachePlan]:
        """:meth:`plan` of the concatenated ``batches`` (one gather each, ids unique within
        one), split back into one :class:`CachePlan` per batch (views of the whole plan)."""
        arrays = [_int_array(b, f"batches[{i}]") for i, b in enumerate(batches)]
        ptr = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([a.size for a in arrays], out=ptr[1:])
        trace = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        whole = self.plan(trace, ptr)
        return [
            CachePlan(whole.hit_slot[lo:hi], whole.fill_slot[lo:hi])
            for lo, hi in zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True)
        ]


class LruPlanner(_Directory):
    """Least-recently-used replacement, decided gather by gather.

    Args:
        capacity: number of slots, ``>= 0`` (0: every access misses and nothing is filled).
        num_rows: row ids are in ``[0, num_rows)``; the cache keeps 5 bytes per row id.

    Raises:
        ValueError: a negative or non-integer size, or ``capacity >= 2**31``.
    """

    def __init__(self, capacity: int, num_rows: int) -> None:
        capacity = _check_size(capacity, "capacity")
        num_rows = _check_size(num_rows, "num_rows")
        super().__init__(_C.LruCache(capacity, num_rows))

    def access(self, ids: IdsLike) -> CachePlan:
        """Decide one gather of ``ids`` (int64[n], unique), in order: a cached id hits and
        becomes the most recently used; a miss is inserted as the most recently used into the
        lowest free slot, else into the slot of the least recently used id.

        Returns:
            :class:`CachePlan` ``(hit_slot int64[n], fill_slot int64[n])``; ``fill_slot`` is
            :data:`NO_SLOT` for a miss only when the capacity is 0.

        Raises:
            ValueError: ``ids`` not a 1-D integer array, or an id repeated (named).
            IndexError: an id outside ``[0, num_rows)`` (named). The cache is then unchanged.
        """
        hit, fill = self._core.access(_int_array(ids, "ids"))
        return CachePlan(hit, fill)
