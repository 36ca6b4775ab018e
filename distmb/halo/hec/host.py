"""Historical Embedding Cache (HEC, DistGNN-MB section 3.2): delayed embeddings of halo
vertices, one cache per GNN layer on every rank.

Contract (the project design notes, docs/design.md; made precise here):

- A cache has ``capacity`` lines of ``dim`` float32 values. A line is tagged by the
  ``VID_o`` (int64, ``>= 0``) of the vertex whose embedding it holds.
- Ages are counted in training iterations: :meth:`HistoricalEmbeddingCache.advance` is
  called once per iteration and adds one to every age (in O(1): the cache keeps a clock and
  the clock value at which each line was stored). A stored line has age 0.
- **Expiry.** A line *hits* while ``age <= lifespan`` and misses once ``age > lifespan``;
  with ``lifespan = 0`` a line only hits in the iteration it was stored. With
  :data:`LIFESPAN_UNBOUNDED` lines never expire (layer 0 holds input features, which never
  go stale). Expired lines are not removed eagerly: they miss, and are the first lines to be
  replaced (they are always the oldest).
- **Store** behaves as if the rows were stored one at a time in order. For each
  ``(tag, row)``: the line holding ``tag`` is overwritten (also when it has expired: it is
  refreshed to age 0); else a free line is taken; else the *oldest* line is replaced
  (oldest-cache-line-first, OCF). Lines of equal age (stored in the same iteration) are
  replaced in the order they were stored. Consequently, when a tag occurs several times in
  one call, its **last** row is kept. Replacing an unexpired line of another tag counts as an
  eviction, replacing an expired one as an ``expired_replacement``.
- Results and the cache state (including which slot holds which tag) are identical for every
  OpenMP thread count: search and load are parallel and read-only; store decides the slots
  serially (a row may replace the line that an earlier row of the same call wrote) and
  copies the rows in parallel, each line written once.
- Memory: the line buffer (``capacity * dim * 4`` bytes) is allocated once and not
  zero-filled, so its pages are only backed as lines get stored; bookkeeping adds 40 bytes
  per line (tag, write time, write-order list, store scratch) plus 32-64 bytes of hash map
  ``VID_o -> slot`` (open addressing, a power-of-two table of at least twice the capacity).
- All calls on one cache are serialised by a lock (a communication thread may store while
  the training thread looks up); :meth:`~HistoricalEmbeddingCache.lookup` and
  :meth:`~HistoricalEmbeddingCache.lookup_into` are atomic. ``lookup_into`` gathers straight
  into the caller's buffer (the halo rows of a layer's input) and allocates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from distmb import _C

#: Slot returned by :meth:`HistoricalEmbeddingCache.search` for an absent or expired tag.
HEC_MISS: int = int(_C.HEC_MISS)
#: Life-span of a cache whose lines never expire.
LIFESPAN_UNBOUNDED: int = int(_C.LIFESPAN_UNBOUNDED)
#: Keys of :meth:`HistoricalEmbeddingCache.counters`, in order.
COUNTER_KEYS: tuple[str, ...] = ("lookups", "hits", "stores", "evictions", "expired_replacements")

#: Tags and slots: a numpy array, a CPU tensor or a sequence of integers.
IndexLike = np.ndarray | torch.Tensor | Sequence[int]
#: Rows: a float32 numpy array or CPU tensor.
RowsLike = np.ndarray | torch.Tensor


def _as_numpy(values: IndexLike, name: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU (got device {values.device})")
        return values.detach().numpy()
    return np.asarray(values)


def _index_array(values: IndexLike, name: str) -> np.ndarray:
    """``values`` as a 1-D C-contiguous int64 array (no copy when it already is one)."""
    arr = _as_numpy(values, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (got shape {list(arr.shape)})")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers (got dtype {arr.dtype})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_int(value: int, name: str, minimum: int, allow: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    value = int(value)
    if value < minimum and value != allow:
        extra = f" or {allow}" if allow is not None else ""
        raise ValueError(f"{name} must be >= {minimum}{extra} (got {value})")
    return value


class HistoricalEmbeddingCache:
    """A fixed-size cache of float32 rows tagged by ``VID_o``; see the module docstring for
    the replacement and expiry contract.

    Args:
        capacity: number of lines, ``>= 1`` (the paper's default is ``1_000_000``).
        dim: width of a line (the layer's input width), ``>= 1``.
        lifespan: largest age (in iterations) at which a line still hits, ``>= 0``, or
            :data:`LIFESPAN_UNBOUNDED`.

    Raises:
        ValueError: a non-integer or out-of-range argument, or ``capacity * dim`` too large.
        MemoryError: the line buffer cannot be allocated.
    """

    def __init__(self, capacity: int, dim: int, lifespan: int) -> None:
        capacity = _check_int(capacity, "capacity", 1)
        dim = _check_int(dim, "dim", 1)
        lifespan = _check_int(lifespan, "lifespan", 0, allow=LIFESPAN_UNBOUNDED)
        self._core = _C.HecCore(capacity, dim, lifespan)

    # -- properties ------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Number of lines."""
        return int(self._core.capacity)

    @property
    def dim(self) -> int:
        """Width of a line (float32 values)."""
        return int(self._core.dim)

    @property
    def lifespan(self) -> int:
        """Largest age that still hits, or :data:`LIFESPAN_UNBOUNDED`."""
        return int(self._core.lifespan)

    @property
    def clock(self) -> int:
        """Number of :meth:`advance` calls so far (not reset by :meth:`clear`)."""
        return int(self._core.clock)

    @property
    def occupied(self) -> int:
        """Lines holding a tag, expired or not (O(1))."""
        return int(self._core.occupied)

    def __len__(self) -> int:
        """Number of valid lines: those holding a tag whose age is ``<= lifespan`` (the lines a
        search can hit). O(occupied) when the life-span is bounded."""
        return int(self._core.live_lines)

    def __bool__(self) -> bool:
        """Always True: a cache object is not "false" because it is empty (``if cache:``
        tests presence, as with ``None``); use ``len(cache)`` for its contents."""
        return True

    def __repr__(self) -> str:
        ls = "unbounded" if self.lifespan == LIFESPAN_UNBOUNDED else str(self.lifespan)
        return (
            f"HistoricalEmbeddingCache(capacity={self.capacity}, dim={self.dim}, lifespan={ls}, "
            f"occupied={self.occupied}, clock={self.clock})"
        )

    # -- operations --------------------------------------------------------------------------
    def search(self, tags: IndexLike) -> np.ndarray:
        """HECSearch: the slot of every tag.

        Args:
            tags: int[n] (any integer dtype; converted to int64), ``VID_o >= 0``.

        Returns:
            int64[n]: the slot holding each tag, or :data:`HEC_MISS` where the tag is absent or
            its line has expired. Counts ``n`` lookups and the hits.

        Raises:
            ValueError: not 1-D, not integers, or a negative tag.
        """
        return self._core.search(_index_array(tags, "tags"))

    def load(self, slots: IndexLike, out: torch.Tensor | None = None) -> torch.Tensor:
        """HECLoad: gather lines.

        Args:
            slots: int[n], hits of a :meth:`search` made after the last :meth:`store` or
                :meth:`clear` (never :data:`HEC_MISS`).
            out: optional float32[n, dim] contiguous CPU tensor to write into (e.g. the halo
                rows of a layer's input); allocated when omitted.

        Returns:
            float32[n, dim]: the rows (``out`` when given).

        Raises:
            ValueError: a slot that holds no line, or a malformed ``out``.
        """
        slot_arr = _index_array(slots, "slots")
        if out is None:
            out = torch.empty((slot_arr.shape[0], self.dim), dtype=torch.float32)
        else:
            self._check_out(out, slot_arr.shape[0])
        self._core.load(slot_arr, out.detach().numpy())
        return out

    def lookup(self, tags: IndexLike) -> tuple[torch.Tensor, torch.Tensor]:
        """Search and load in one atomic call (what the trainer needs for halo leaves).

        The rows are a fresh allocation; on the hot path :meth:`lookup_into` writes into an
        existing buffer instead (a fresh buffer of tens of MB costs page faults every call).

        Args:
            tags: int[n], ``VID_o >= 0``.

        Returns:
            ``(hit_mask, rows)``: bool[n] (True where the tag hits) and float32[n_hits, dim],
            the rows of the hits in the order of ``tags``. Counts lookups and hits like
            :meth:`search`.
        """
        hit, rows = self._core.lookup(_index_array(tags, "tags"))
        return torch.from_numpy(hit), torch.from_numpy(rows)

    def lookup_into(self, tags: IndexLike, out: torch.Tensor) -> torch.Tensor:
        """Search and gather straight into a caller's buffer, in one atomic call and without
        allocating: the trainer passes the halo rows of a layer's input.

        Args:
            tags: int[n], ``VID_o >= 0``.
            out: float32[n, dim] contiguous CPU tensor. Row ``i`` receives the line of
                ``tags[i]`` on a hit and zeros on a miss.

        Returns:
            bool[n]: the hit mask. Counts lookups and hits like :meth:`search`.
        """
        tag_arr = _index_array(tags, "tags")
        self._check_out(out, tag_arr.shape[0])
        return torch.from_numpy(self._core.lookup_into(tag_arr, out.detach().numpy()))

    def _check_out(self, out: torch.Tensor, n: int) -> None:
        if not isinstance(out, torch.Tensor) or out.device.type != "cpu":
            raise ValueError("out must be a CPU torch tensor")
        if out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError(f"out must be contiguous float32 (got {out.dtype})")
        if tuple(out.shape) != (n, self.dim):
            raise ValueError(f"out has shape {list(out.shape)}, expected [{n}, {self.dim}]")

    def store(self, tags: IndexLike, rows: RowsLike) -> None:
        """HECStore: write ``rows[i]`` under ``tags[i]``; see the module docstring for which
        line each row takes. A repeated tag keeps its last row. Stored lines get age 0.

        Args:
            tags: int[m], ``VID_o >= 0``.
            rows: float32[m, dim], numpy array or CPU tensor (read in place when
                C-contiguous; a tensor that requires grad is detached).

        Raises:
            ValueError: wrong dtype (no silent conversion from float64), shape or width, a
                negative tag, or different lengths. The cache is unchanged on error.
        """
        tag_arr = _index_array(tags, "tags")
        row_arr = _as_numpy(rows, "rows")
        if row_arr.dtype != np.float32:
            raise ValueError(f"rows must be float32 (got {row_arr.dtype})")
        if row_arr.ndim != 2 or row_arr.shape[1] != self.dim:
            raise ValueError(f"rows must have shape [m, {self.dim}] (got {list(row_arr.shape)})")
        if row_arr.shape[0] != tag_arr.shape[0]:
            raise ValueError(
                f"{tag_arr.shape[0]} tags but {row_arr.shape[0]} rows: they must match"
            )
        self._core.store(tag_arr, np.ascontiguousarray(row_arr))

    def advance(self) -> None:
        """One training iteration has passed: every line's age grows by one (O(1))."""
        self._core.advance()

    def clear(self) -> None:
        """Drop every line. The clock and the counters are kept."""
        self._core.clear()

    # -- checkpointing ----------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """The valid lines (age ``<= lifespan``): ``tags`` int64[v], ``ages`` int64[v],
        ``rows`` float32[v, dim]. Expired lines are left out: they can never hit again. The
        row read counts ``v`` lookups and hits."""
        tags, ages = self.snapshot()
        if self.lifespan != LIFESPAN_UNBOUNDED:
            valid = ages <= self.lifespan
            tags, ages = tags[valid], ages[valid]
        rows = torch.empty((tags.size, self.dim))
        if tags.size:
            self.load(self.search(tags), out=rows)
        return {"tags": tags, "ages": ages, "rows": rows.numpy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Replace the contents by ``state`` (from :meth:`state`): the same tags, rows and
        ages. Lines are stored oldest first with :meth:`advance` between age groups, so the
        clock moves on by the largest age; slot positions may differ from the saved cache.

        Raises:
            ValueError: arrays of the wrong shape or dtype, or a negative age.
        """
        replay_state(self, state)

    # -- statistics --------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        """Counts since creation or :meth:`reset_counters`: ``lookups`` (tags searched),
        ``hits``, ``stores`` (rows stored), ``evictions`` (unexpired lines of another tag
        replaced) and ``expired_replacements`` (expired lines of another tag replaced)."""
        raw = self._core.counters()
        return {key: int(raw[key]) for key in COUNTER_KEYS}

    def reset_counters(self) -> None:
        """Set every counter to zero (e.g. at the start of an epoch)."""
        self._core.reset_counters()

    def hit_rate(self) -> float:
        """``hits / lookups`` since the last reset; 0.0 when nothing was looked up."""
        c = self._core.counters()
        return float(c["hits"]) / c["lookups"] if c["lookups"] else 0.0

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """``(tags, ages)``, int64[occupied] each: the tag and age of every line holding a tag,
        indexed by slot (expired lines included). For tests and diagnostics."""
        tags, ages = self._core.snapshot()
        return tags, ages


class Replayable(Protocol):
    """What :func:`replay_state` needs of a cache (the C++-backed one and the device one)."""

    def clear(self) -> None: ...

    def store(self, tags: np.ndarray, rows: np.ndarray) -> None: ...

    def advance(self) -> None: ...


def replay_state(cache: Replayable, state: dict[str, np.ndarray]) -> None:
    """Replace the contents of ``cache`` by ``state`` (``tags`` int64[v], ``ages`` int64[v],
    ``rows`` float32[v, dim], as :meth:`HistoricalEmbeddingCache.state` returns them): clear,
    then store the lines oldest first, with :meth:`advance` between age groups, so that the
    clock moves on by the largest age. The one restore procedure of every HEC variant: the
    same state restored into either leaves the same tags in the same slots.

    Raises:
        ValueError: arrays of the wrong shape or dtype, or a negative age.
    """
    tags = _index_array(state["tags"], "tags")
    ages = _index_array(state["ages"], "ages")
    rows = np.asarray(state["rows"])
    if ages.shape != tags.shape or (ages.size and int(ages.min()) < 0):
        raise ValueError("ages must be non-negative and match tags in length")
    cache.clear()
    if tags.size == 0:
        return
    order = np.argsort(-ages, kind="stable")
    tags, ages, rows = tags[order], ages[order], rows[order]
    bounds = np.flatnonzero(np.diff(ages)) + 1
    starts = np.concatenate([[0], bounds]).astype(np.int64)
    ends = np.concatenate([bounds, [tags.size]]).astype(np.int64)
    for start, end in zip(starts, ends, strict=True):
        cache.store(tags[start:end], rows[start:end])
        next_age = int(ages[end]) if end < tags.size else 0
        for _ in range(int(ages[start]) - next_age):
            cache.advance()
