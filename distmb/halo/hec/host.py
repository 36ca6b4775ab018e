"""The C++ historical embedding cache (``distmb._C.HecCore``) behind the
:class:`~distmb.halo.hec.contract.EmbeddingCache` contract (module docstring of
:mod:`distmb.halo.hec.contract`), its lines in host memory.

How the C++ core keeps the contract:

- Ages in O(1) per :meth:`~HistoricalEmbeddingCache.advance`: the cache keeps a clock and the
  clock value at which each line was stored.
- Results and the cache state (including which slot holds which tag) are identical for every
  OpenMP thread count: search and load are parallel and read-only; store decides the slots
  serially (a row may replace the line that an earlier row of the same call wrote) and copies
  the rows in parallel, each line written once.
- Memory: the line buffer (``capacity * dim * 4`` bytes) is allocated once and not
  zero-filled, so its pages are only backed as lines get stored; bookkeeping adds 40 bytes per
  line (tag, write time, write-order list, store scratch) plus 32-64 bytes of hash map
  ``VID_o -> slot`` (open addressing, a power-of-two table of at least twice the capacity).
- All calls on one cache are serialised by a lock (a communication thread may store while the
  training thread looks up); :meth:`~HistoricalEmbeddingCache.lookup` and
  :meth:`~HistoricalEmbeddingCache.lookup_into` are atomic. ``lookup_into`` gathers straight
  into the caller's buffer (the halo rows of a layer's input) and allocates nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from distmb import _C
from distmb.halo.hec.contract import (
    COUNTER_KEYS,
    LIFESPAN_UNBOUNDED,
    EmbeddingCache,
    IndexLike,
    RowsLike,
    as_host_array,
    check_cache_shape,
    check_out,
    checked_rows,
    index_array,
)

#: Where the lines live: host memory.
_HOST = torch.device("cpu")


class HistoricalEmbeddingCache(EmbeddingCache):
    """The C++ cache: lines in host memory; slots come back as numpy arrays, rows as CPU
    tensors. See :class:`~distmb.halo.hec.contract.EmbeddingCache` for every method's contract.

    Args:
        capacity: number of lines, ``>= 1`` (the paper's default is ``1_000_000``).
        dim: width of a line (the layer's input width), ``>= 1``.
        lifespan: largest age (in iterations) at which a line still hits, ``>= 0``, or
            :data:`~distmb.halo.hec.contract.LIFESPAN_UNBOUNDED`.

    Raises:
        ValueError: a non-integer or out-of-range argument, or ``capacity * dim`` too large.
        MemoryError: the line buffer cannot be allocated.
    """

    def __init__(self, capacity: int, dim: int, lifespan: int) -> None:
        self._core = _C.HecCore(*check_cache_shape(capacity, dim, lifespan))

    # -- properties ------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return int(self._core.capacity)

    @property
    def dim(self) -> int:
        return int(self._core.dim)

    @property
    def lifespan(self) -> int:
        return int(self._core.lifespan)

    @property
    def device(self) -> torch.device:
        """Always the CPU."""
        return _HOST

    @property
    def clock(self) -> int:
        return int(self._core.clock)

    @property
    def occupied(self) -> int:
        """Lines holding a tag, expired or not (O(1))."""
        return int(self._core.occupied)

    def __len__(self) -> int:
        """Lines a search can hit (age ``<= lifespan``); O(occupied) when the life-span is
        bounded."""
        return int(self._core.live_lines)

    # -- operations --------------------------------------------------------------------------
    def search(self, tags: IndexLike) -> np.ndarray:
        """int64[n] numpy array: the slot of each tag or ``HEC_MISS``."""
        return self._core.search(index_array(tags, "tags"))

    def load(self, slots: IndexLike, out: torch.Tensor | None = None) -> torch.Tensor:
        slot_arr = index_array(slots, "slots")
        if out is None:
            out = torch.empty((slot_arr.shape[0], self.dim), dtype=torch.float32)
        else:
            check_out(out, slot_arr.shape[0], self.dim, _HOST)
        self._core.load(slot_arr, out.detach().numpy())
        return out

    def lookup(self, tags: IndexLike) -> tuple[torch.Tensor, torch.Tensor]:
        """Atomic search and load. The rows are a fresh allocation; on the hot path
        :meth:`lookup_into` writes into an existing buffer instead (a fresh buffer of tens of
        MB costs page faults every call)."""
        hit, rows = self._core.lookup(index_array(tags, "tags"))
        return torch.from_numpy(hit), torch.from_numpy(rows)

    def lookup_into(self, tags: IndexLike, out: torch.Tensor) -> torch.Tensor:
        """Atomic search and gather into ``out``; allocates nothing."""
        tag_arr = index_array(tags, "tags")
        check_out(out, tag_arr.shape[0], self.dim, _HOST)
        return torch.from_numpy(self._core.lookup_into(tag_arr, out.detach().numpy()))

    def store(self, tags: IndexLike, rows: RowsLike) -> None:
        """C-contiguous host rows are read in place; other layouts are copied."""
        tag_arr = index_array(tags, "tags")
        row_arr = as_host_array(checked_rows(rows, tag_arr.shape[0], self.dim), "rows")
        self._core.store(tag_arr, np.ascontiguousarray(row_arr))

    def advance(self) -> None:
        """Every line's age grows by one (O(1))."""
        self._core.advance()

    def clear(self) -> None:
        self._core.clear()

    # -- checkpointing ----------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        tags, ages = self.snapshot()
        if self.lifespan != LIFESPAN_UNBOUNDED:
            valid = ages <= self.lifespan
            tags, ages = tags[valid], ages[valid]
        rows = torch.empty((tags.size, self.dim))
        if tags.size:
            self.load(self.search(tags), out=rows)
        return {"tags": tags, "ages": ages, "rows": rows.numpy()}

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        tags, ages = self._core.snapshot()
        return tags, ages

    # -- statistics --------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        raw = self._core.counters()
        return {key: int(raw[key]) for key in COUNTER_KEYS}

    def reset_counters(self) -> None:
        self._core.reset_counters()
