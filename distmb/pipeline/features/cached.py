"""Out-of-core feature rows: a :class:`~distmb.data.store.rowfile.RowFile` on disk behind a
fixed-size in-memory cache with a replacement policy (Ginex's superbatch Belady cache,
FGNN/GNNLab's PreSC static cache, a degree-ordered static cache, LRU, or none).

Every policy returns exactly the rows of the file: a cache only decides which rows are read
from disk and which are copied from memory, never a value (training is bit-identical to
``--features memory``).

Policies (``--cache-policy``):

- ``belady``: the BatchLoader samples a superbatch (``--superbatch K`` batches) ahead and hands
  the inspector (:meth:`CachedFeatures.inspect`) every row its gathers will request, in order;
  the planner (:class:`~distmb.pipeline.features.policy.BeladyPlanner`) decides gather by gather:
  the
  rows cached at a gather's start hit, then each miss fills a slot (evicting the row whose
  next use is farthest, possibly one this gather just copied, or bypassing the cache when the
  missed row's own next use is farther still). The executor
  (:meth:`CachedFeatures._read_into`) then serves each gather as planned. The cache carries
  over between superbatches and epochs.
- ``presc``: static, the rows pre-sampling (``--presample-epochs``) visited most
  (:func:`distmb.pipeline.features.presample.presample_counts`, its own random stream).
- ``degree``: static, the rows of the highest in-degree vertices.
- ``lru``: dynamic, least recently used row out.
- ``none``: every row from disk.

Rows in two bytes (``--feature-dtype bfloat16``, ``dtype``): the cache holds its rows as
bfloat16, twice the rows per MiB. Every row served is then the file's row, normalised
(``transform``) and rounded once, whether it comes from the cache or from disk: a missed row
is normalised and rounded as it is read, before it is served or cached, so values still never
depend on the policy (training bit-identical to ``--features memory`` with the same dtype).

Counters (per epoch, under the names every cache uses): ``lookups`` (rows requested),
``hits``, ``rows_read`` and ``bytes_read`` (from disk, whole aligned blocks), ``read_time``
and ``inspect_time`` (seconds), ``memory_bytes`` (the cache's rows and directory).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

from distmb.core.units import FLOAT32_BYTES
from distmb.data.store.rowfile import RowFile
from distmb.pipeline.features.normalize import FeatureNormalization
from distmb.pipeline.features.policy import NO_SLOT, BeladyPlanner, LruPlanner
from distmb.pipeline.features.protocol import FeatureSource
from distmb.pipeline.features.storage import CONVERT_CHUNK_ROWS, RowTransform

#: Replacement policies of the out-of-core feature cache (``--cache-policy``).
CACHE_POLICIES: tuple[str, ...] = ("belady", "presc", "degree", "lru", "none")

#: The dtypes the cache may hold its rows in (``--feature-dtype``): float16's range cannot
#: be checked before a row is read, so a two-byte cache is bfloat16 (float32's range).
CACHE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
#: Policies whose cache never changes after it is filled (they need ``hot_ids``).
STATIC_POLICIES: tuple[str, ...] = ("presc", "degree")
#: Bytes of directory per row id of the table and per cache slot, by policy (the planners'
#: own accounting, :mod:`distmb.pipeline.features.policy`; static caches keep an int32 per row id),
#: counted in ``memory_bytes``.
DIRECTORY_BYTES: dict[str, tuple[int, int]] = {
    "belady": (12, 48),
    "lru": (5, 24),
    "presc": (4, 0),
    "degree": (4, 0),
    "none": (0, 0),
}


def cache_rows(cache_mb: float, dim: int, num_rows: int, itemsize: int = FLOAT32_BYTES) -> int:
    """Rows a cache of ``cache_mb`` MiB holds (rows of ``dim`` values of ``itemsize`` bytes,
    float32 by default), at most the table."""
    if cache_mb < 0:
        raise ValueError(f"cache size must be >= 0 MiB, got {cache_mb}")
    return int(min(num_rows, (cache_mb * 2**20) // (max(dim, 1) * itemsize)))


class CachedFeatures(FeatureSource):
    """A :class:`RowFile`'s rows through an in-memory cache (see the module docstring).

    Args:
        rows: the feature file (float32 rows; ids are its row numbers).
        policy: one of :data:`CACHE_POLICIES`.
        capacity: rows the cache holds (0: no cache; clamped to the table's rows).
        hot_ids: for ``presc``/``degree``: row ids in decreasing priority; the first
            ``capacity`` are read once and cached for good.
        dtype: the dtype the cache holds its rows in: float32, or bfloat16 (every row served
            is then rounded to it, see the module docstring).
        transform: with a two-byte ``dtype``, applied to every row read from disk (float32)
            before it is rounded: ``--normalize-features``. None: rows as in the file.

    Attributes:
        wants_trace: the loader must call :meth:`inspect` with a superbatch's gathers before
            making them (``belady``).
    """

    def __init__(
        self,
        rows: RowFile,
        policy: str,
        capacity: int,
        *,
        hot_ids: np.ndarray | None = None,
        dtype: torch.dtype = torch.float32,
        transform: RowTransform | None = None,
    ) -> None:
        if policy not in CACHE_POLICIES:
            raise ValueError(f"cache policy must be one of {CACHE_POLICIES}, got {policy!r}")
        if dtype not in CACHE_DTYPES:
            raise ValueError(f"cache dtype must be one of {CACHE_DTYPES}, got {dtype}")
        if transform is not None and dtype == torch.float32:
            raise ValueError("CachedFeatures: a transform applies to rows stored in two bytes")
        super().__init__(rows.num_rows, rows.dim)
        self.file = rows
        self.policy = policy
        self.capacity = max(0, min(int(capacity), self.num_rows)) if policy != "none" else 0
        self.wants_trace = policy == "belady" and self.capacity > 0
        self.table = torch.empty((self.capacity, self.dim), dtype=dtype)
        self.finish = RowFinish(dtype, transform)
        self._planned: deque[tuple[np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._belady = BeladyPlanner(self.capacity, self.num_rows) if policy == "belady" else None
        self._lru = LruPlanner(self.capacity, self.num_rows) if policy == "lru" else None
        self._slot_of: np.ndarray | None = None  # static policies: id -> slot
        self._planned_dir: np.ndarray | None = None  # belady: directory() while no plan runs
        if policy in STATIC_POLICIES:
            if hot_ids is None:
                raise ValueError(f"cache policy {policy!r} needs hot_ids")
            self._fill_static(np.asarray(hot_ids, dtype=np.int64))
        self.reset_counters()  # the static fill is not the first epoch's reading

    # -- counters ------------------------------------------------------------------------------
    def reset_counters(self) -> None:
        super().reset_counters()
        self.lookups = 0
        self.hits = 0
        self.rows_read = 0
        self.inspect_time = 0.0
        self.file.reset_counters()

    def counters(self) -> dict[str, int]:
        return {
            "rows_served": self.rows_served,
            "lookups": self.lookups,
            "hits": self.hits,
            "rows_read": self.rows_read,
            "bytes_read": int(self.file.bytes_read),
        }

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the cache: its rows and its directory."""
        if not self.capacity:
            return 0
        per_row, per_slot = DIRECTORY_BYTES[self.policy]
        row_bytes = self.dim * self.table.element_size()
        return self.capacity * (row_bytes + per_slot) + self.num_rows * per_row

    def normalization_on_read(
        self, normalization: FeatureNormalization | None
    ) -> FeatureNormalization | None:
        """What a reader of this cache's rows applies of ``normalization``: all of it, or
        None where the cache normalises the rows it reads itself (a two-byte cache, before it
        rounds them)."""
        return None if self.finish.transform is not None else normalization

    def stats(self) -> dict[str, float]:
        """This epoch's counters for the record (see the module docstring)."""
        return {
            "lookups": float(self.lookups),
            "hits": float(self.hits),
            "rows_read": float(self.rows_read),
            "bytes_read": float(self.file.bytes_read),
            "read_time": float(self.file.read_seconds),
            "inspect_time": float(self.inspect_time),
            "memory_bytes": float(self.memory_bytes),
        }

    # -- filling ------------------------------------------------------------------------------
    def _fill_static(self, hot_ids: np.ndarray) -> None:
        """Read the ``capacity`` first ``hot_ids`` into the cache, in id order (sequential
        reads); the directory maps each to its slot."""
        if hot_ids.ndim != 1 or (
            hot_ids.size and (hot_ids.min() < 0 or hot_ids.max() >= self.num_rows)
        ):
            raise ValueError(f"hot_ids must be 1-D ids in [0, {self.num_rows})")
        chosen = np.sort(hot_ids[: self.capacity])
        if np.unique(chosen).size != chosen.size:
            raise ValueError("hot_ids must not repeat an id")
        self.capacity = int(chosen.size)
        self.table = self.table[: self.capacity]
        self._slot_of = np.full(self.num_rows, NO_SLOT, dtype=np.int32)
        self._slot_of[chosen] = np.arange(chosen.size, dtype=np.int32)
        if self.table.dtype == torch.float32:
            if chosen.size:
                self.file.read_into(chosen, self.table)
            return
        for start in range(0, chosen.size, CONVERT_CHUNK_ROWS):  # read as float32, stored
            part = chosen[start : start + CONVERT_CHUNK_ROWS]
            rows = torch.empty((part.size, self.dim), dtype=torch.float32)
            self.file.read_into(part, rows)
            self.finish(rows, np.arange(part.size, dtype=np.int64))
            self.table[start : start + part.size] = rows

    # -- the inspector -------------------------------------------------------------------------
    def inspect(self, traces: Sequence[np.ndarray]) -> None:
        """Plan the next ``len(traces)`` gathers: ``traces[i]`` are the ids (int64, unique)
        the i-th next gather will request, in order. Only ``belady`` plans; the gathers must
        then come in exactly this order (a gather that differs raises)."""
        if self._belady is None or not traces:
            return
        if self._planned:
            # Gathers planned earlier were never made (an epoch closed early): the planner's
            # directory counts fills that did not happen, so start again from an empty cache.
            self._drop_plans()
        start = time.perf_counter()
        arrays = [np.ascontiguousarray(t, dtype=np.int64) for t in traces]
        ptr = np.zeros(len(arrays) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([a.size for a in arrays])
        self._planned_dir = None
        hit_slot, fill_slot = self._belady.plan(np.concatenate(arrays), ptr)
        for i, ids in enumerate(arrays):
            self._planned.append(
                (ids, hit_slot[ptr[i] : ptr[i + 1]], fill_slot[ptr[i] : ptr[i + 1]])
            )
        self.inspect_time += time.perf_counter() - start

    # -- the executor --------------------------------------------------------------------------
    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        self.lookups += ids.size
        if self._planned:
            planned, hit_slot, fill_slot = self._planned.popleft()
            if not np.array_equal(planned, ids):
                self._drop_plans()
                raise RuntimeError(
                    "CachedFeatures: a gather differs from the one the inspector planned "
                    f"({ids.size} ids, {planned.size} planned); gathers must follow inspect()"
                )
            try:
                self._serve(ids, hit_slot, fill_slot, out)
            except BaseException:
                self._drop_plans()  # the cache's rows may now disagree with its directory
                raise
        elif self._lru is not None and self.capacity:
            unique, inverse = np.unique(ids, return_inverse=True)
            if unique.size == ids.size:
                hit_slot, fill_slot = self._lru.access(ids)
                self._serve(ids, hit_slot, fill_slot, out)
            else:
                rows = torch.empty((unique.size, self.dim), dtype=torch.float32)
                hit_slot, fill_slot = self._lru.access(unique)
                self._serve(unique, hit_slot, fill_slot, rows)
                self.lookups -= unique.size  # counted once, as requested
                torch.index_select(rows, 0, torch.from_numpy(inverse.reshape(-1)), out=out)
        else:
            self._serve(ids, self._lookup(ids), None, out)

    def _drop_plans(self) -> None:
        """Forget the plans not yet served and empty the cache (its directory already holds
        their fills): later gathers stay exact, only colder."""
        self._planned.clear()
        self._planned_dir = None
        if self._belady is not None:
            self._belady.reset()

    def directory(self) -> np.ndarray:
        """int32[num_rows]: the slot holding each row now, or :data:`NO_SLOT`."""
        if self._slot_of is not None:
            return self._slot_of
        if self._planned:
            # The planner's directory already holds the fills of gathers not served yet: it
            # runs ahead of the rows. An unplanned reader must not trust it: start again.
            self._drop_plans()
        if self._planned_dir is not None:
            return self._planned_dir
        slot_of = np.full(self.num_rows, NO_SLOT, dtype=np.int32)
        planner = self._belady if self._belady is not None else self._lru
        if planner is not None and self.capacity:
            held = planner.slot_ids()
            used = np.flatnonzero(held != NO_SLOT)
            slot_of[held[used]] = used
        if self._belady is not None:
            # Unchanged until the next plan (or drop): unplanned gathers do not rebuild it.
            self._planned_dir = slot_of
        return slot_of

    def _lookup(self, ids: np.ndarray) -> np.ndarray:
        """int64[n]: the slot holding each id now, or :data:`NO_SLOT` (no change)."""
        if not self.capacity:
            return np.full(ids.size, NO_SLOT, dtype=np.int64)
        return self.directory()[ids].astype(np.int64)

    def _serve(
        self,
        ids: np.ndarray,
        hit_slot: np.ndarray,
        fill_slot: np.ndarray | None,
        out: torch.Tensor,
    ) -> None:
        """Copy the hits from their slots (the cache as it was before this gather), read the
        misses from disk, then write each miss with a fill slot into it (in access order: a
        slot filled twice keeps the later row)."""
        miss_pos = serve_from(self.table, self.file, ids, hit_slot, out, self.finish)
        self.hits += ids.size - miss_pos.size
        self.rows_read += miss_pos.size
        if fill_slot is None or not miss_pos.size:
            return
        fills = fill_slot[miss_pos]
        keep = np.flatnonzero(fills != NO_SLOT)
        if not keep.size:
            return
        slots = fills[keep]
        # The last write of each slot wins: keep the last occurrence of every slot.
        last_rev = np.unique(slots[::-1], return_index=True)[1]
        last = keep[keep.size - 1 - last_rev]
        rows = torch.index_select(out, 0, torch.from_numpy(miss_pos[last]))
        # Served rows are already rounded: the cast to the cache's dtype is exact.
        self.table.index_copy_(0, torch.from_numpy(fills[last]), rows.to(self.table.dtype))

    # -- other readers ------------------------------------------------------------------------
    def lookup_only(self) -> FeatureSource:
        """A source over the same file and cache that serves hits from the cache as it
        stands and reads misses from disk, without changing the cache or consuming a plan
        (for evaluation between epochs). Its ``bytes_read`` counts its own reads."""
        return _LookupView(self)

    def __repr__(self) -> str:
        return (
            f"CachedFeatures({str(self.file.path)!r}, policy={self.policy}, "
            f"capacity={self.capacity}/{self.num_rows} rows)"
        )


class _LookupView(FeatureSource):
    """:meth:`CachedFeatures.lookup_only`: the cache's current rows, no changes."""

    def __init__(self, cached: CachedFeatures) -> None:
        super().__init__(cached.num_rows, cached.dim)
        self.cached = cached
        self.slot_of = cached.directory()  # a snapshot: the cache does not change meanwhile

    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        # The cache's own file: its counters are reset at the next epoch's start; this
        # view counts its share.
        file = self.cached.file
        before = file.bytes_read
        slots = self.slot_of[ids].astype(np.int64)
        serve_from(self.cached.table, file, ids, slots, out, self.cached.finish)
        self.bytes_read += int(file.bytes_read - before)


class RowFinish:
    """What becomes of rows read from disk before they are served or cached: nothing for a
    float32 cache; for a two-byte one, ``transform`` (float32) then one rounding to
    ``dtype``, in place in the float32 rows served."""

    def __init__(self, dtype: torch.dtype, transform: RowTransform | None) -> None:
        self.dtype = dtype
        self.transform = transform

    def __call__(self, out: torch.Tensor, positions: np.ndarray) -> None:
        """Finish rows ``positions`` (int64[m], ascending) of ``out`` (float32[n, F])."""
        if self.dtype == torch.float32 or not positions.size:
            return
        if positions.size == out.shape[0]:
            rows = out
        else:
            rows = torch.index_select(out, 0, torch.from_numpy(positions))
        if self.transform is not None:
            rows = self.transform(rows)
        rounded = rows.to(self.dtype).to(torch.float32)
        if positions.size == out.shape[0]:
            out.copy_(rounded)
        else:
            out.index_copy_(0, torch.from_numpy(positions), rounded)


def serve_from(
    table: torch.Tensor,
    file: RowFile,
    ids: np.ndarray,
    hit_slot: np.ndarray,
    out: torch.Tensor,
    finish: RowFinish | None = None,
) -> np.ndarray:
    """``out[i]`` = row ``ids[i]``: from ``table[hit_slot[i]]`` where it is not
    :data:`NO_SLOT` (widened to float32 from a two-byte table), else read from ``file``
    straight into place and ``finish``-ed. Returns the positions read (int64[m],
    ascending)."""
    hit = hit_slot != NO_SLOT
    hit_pos = np.flatnonzero(hit)
    if hit_pos.size:
        rows = torch.index_select(table, 0, torch.from_numpy(hit_slot[hit_pos]))
        out.index_copy_(0, torch.from_numpy(hit_pos), rows.to(out.dtype))
    if hit_pos.size == ids.size:
        return np.zeros(0, dtype=np.int64)
    if not hit_pos.size:
        file.read_into(ids, out)
        miss_pos = np.arange(ids.size, dtype=np.int64)
    else:
        miss_pos = np.flatnonzero(~hit)
        file.read_into(ids[miss_pos], out, positions=miss_pos)
    if finish is not None:
        finish(out, miss_pos)
    return miss_pos
