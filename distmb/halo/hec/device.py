"""Device-resident historical embedding cache: the
:class:`~distmb.halo.hec.contract.EmbeddingCache` contract (module docstring of
:mod:`distmb.halo.hec.contract`) with its tables held as tensors on any torch device, and every
operation a fixed sequence of vectorised PyTorch ops.

Equal results. For the same sequence of calls, :class:`DeviceHistoricalCache` returns the
same slots, hit masks and rows (bit for bit), leaves the same tag in the same slot with the
same age, and counts the same hits, evictions and expired replacements as the C++ cache: the
C++ store's serial slot decisions are reproduced exactly, not approximated.

How a store of ``m`` rows is decided without a serial loop. The C++ cache keeps its lines in
write order and replaces the least recently *written* line; expiry never changes which line
goes (expired lines are simply the oldest). It is therefore an LRU cache over stores of
capacity ``C``, and the classical LRU characterisation applies: a line written at time ``a``
is replaced at the first later time ``b`` at which ``C`` distinct *other* tags have been
written since ``a``, unless its own tag is written again first. Over the sequence ``X`` =
the oldest ``K = min(C, m)`` resident lines in write order, a marker for the other resident
lines, then the ``m`` rows (positions ``j``, ``prev[j]`` the previous position of the same tag
or -1), the number of distinct tags in ``(a, b]`` is ``#{j <= b : prev[j] <= a}`` minus the
real positions ``<= a``: a two-dimensional dominance count. The replacement time of every
position is found at once by a descent over a merge-sort tree of ``prev`` (``log2 |X|``
levels, one sort and one ``searchsorted`` each). From it every row is classified (refresh of
its tag's line; new tag into a free line ``used, used + 1, ...``; or new tag into the line of
the entry replaced at that row), and the slot of each row follows by pointer jumping
(``log2 |X|`` gathers) along "same line as" links. Lines older than the ``K`` oldest cannot
be replaced within one store (each row replaces or refreshes at most one line). Rows with a
repeated tag resolve as in C++: the last one is kept. Costs per store: ``O(m log^2 m)`` work
for the decisions and one ``O(C log C)`` sort that rebuilds the ``tag -> slot`` index (a
sorted array searched with ``searchsorted``; the C++ cache uses a hash map).

No host round trip on the hot path: :meth:`~DeviceHistoricalCache.search`,
:meth:`~DeviceHistoricalCache.lookup_into`, :meth:`~DeviceHistoricalCache.store` and
:meth:`~DeviceHistoricalCache.advance` never wait for the device when the cache is built with
``checked=False`` (the counters, the occupancy and the clock live on the device or on the host
as plain integers that need no device value). With ``checked=True`` (the default) the inputs
are validated as the C++ cache validates them (negative tags, loads of lines that hold no
tag), which costs one synchronisation per call on a GPU and nothing extra on the CPU.
:meth:`~DeviceHistoricalCache.lookup` returns a data-dependent number of rows and therefore
synchronises; the trainer's hot-path call is ``lookup_into``.

Tags must be ``< 2**63 - 1`` (the largest int64 marks empty index entries); ``VID_o`` are
vertex ids far below it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from distmb.halo.hec.contract import (
    COUNTER_KEYS,
    HEC_MISS,
    LIFESPAN_UNBOUNDED,
    EmbeddingCache,
    IndexLike,
    RowsLike,
    check_cache_shape,
    check_index_tensor,
    check_out,
    checked_rows,
    index_array,
)

#: Largest int64: the key of an empty entry of the ``tag -> slot`` index and the write
#: sequence number of a line that holds no tag.
INT64_MAX: int = torch.iinfo(torch.int64).max
#: Position of each counter in the device tensor of counters.
_LOOKUPS, _HITS, _STORES, _EVICTIONS, _EXPIRED = range(len(COUNTER_KEYS))


class DeviceHistoricalCache(EmbeddingCache):
    """A fixed-size cache of float32 rows tagged by ``VID_o`` with its tables on ``device``;
    the contract of :class:`~distmb.halo.hec.contract.EmbeddingCache` and the results of
    :class:`~distmb.halo.hec.host.HistoricalEmbeddingCache` (see the module docstring). Slots,
    hit masks and rows come back as tensors on ``device``.

    Args:
        capacity: number of lines, ``>= 1``.
        dim: width of a line, ``>= 1``.
        lifespan: largest age (in iterations) at which a line still hits, ``>= 0``, or
            :data:`~distmb.halo.hec.contract.LIFESPAN_UNBOUNDED`.
        device: where the tables live (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
        checked: validate tags and slots as the C++ cache does (one device synchronisation
            per call on a GPU); ``False`` trusts the caller (tags ``>= 0``, loads of hits only).

    Raises:
        ValueError: a non-integer or out-of-range argument, or ``capacity * dim`` too large.
    """

    def __init__(
        self,
        capacity: int,
        dim: int,
        lifespan: int,
        device: torch.device | str = "cpu",
        checked: bool = True,
    ) -> None:
        capacity, dim, lifespan = check_cache_shape(capacity, dim, lifespan)
        self._capacity, self._dim, self._lifespan = capacity, dim, lifespan
        self.checked = bool(checked)
        # Tables of capacity + 1 entries: the last one (index capacity) is a scratch line
        # that masked writes are sent to, so that every scatter has a fixed size.
        #: float32[capacity + 1, dim]: the lines (not zero-filled, as in C++).
        self._data = torch.empty((capacity + 1, dim), dtype=torch.float32, device=device)
        #: The tables' device, with its index (``cuda:0`` where ``cuda`` was given).
        self._device = dev = self._data.device
        #: int64[capacity + 1]: the tag of each line, -1 where none.
        self._tag = torch.full((capacity + 1,), -1, dtype=torch.int64, device=dev)
        #: int64[capacity + 1]: the clock when each line was last written.
        self._written_at = torch.zeros(capacity + 1, dtype=torch.int64, device=dev)
        #: int64[capacity + 1]: global write sequence number of each line's last write
        #: (INT64_MAX where none): replacement order, oldest first.
        self._seq = torch.full((capacity + 1,), INT64_MAX, dtype=torch.int64, device=dev)
        #: int64[capacity] sorted tags (INT64_MAX padding) and int64[capacity] their slots
        #: (HEC_MISS for padding): the ``tag -> slot`` index.
        self._keys = torch.full((capacity,), INT64_MAX, dtype=torch.int64, device=dev)
        self._slots = torch.full((capacity,), HEC_MISS, dtype=torch.int64, device=dev)
        #: int64[] on the device: lines [0, used) hold a tag (the C++ ``used_``).
        self._used = torch.zeros((), dtype=torch.int64, device=dev)
        #: int64[5] on the device, in COUNTER_KEYS order.
        self._counters = torch.zeros(len(COUNTER_KEYS), dtype=torch.int64, device=dev)
        self._clock = 0
        self._next_seq = 0

    # -- properties ------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def lifespan(self) -> int:
        return self._lifespan

    @property
    def device(self) -> torch.device:
        """Where the tables live, with the index (``cuda:0`` for a cache given ``cuda``)."""
        return self._device

    @property
    def clock(self) -> int:
        return self._clock

    @property
    def occupied(self) -> int:
        """Lines holding a tag, expired or not (synchronises with the device)."""
        return int(self._used.item())

    def __len__(self) -> int:
        """Lines that a search can hit (age ``<= lifespan``); synchronises."""
        used = self.occupied
        return int(self._live(torch.arange(used, device=self.device)).sum().item())

    # -- input conversion --------------------------------------------------------------------
    def _index(self, values: IndexLike, name: str) -> torch.Tensor:
        """``values`` as int64[n] on the device (tensors of any device are copied there)."""
        if isinstance(values, torch.Tensor):
            check_index_tensor(values, name)
            return values.detach().to(self.device, torch.int64)
        return torch.from_numpy(index_array(values, name)).to(self.device)

    def _check_tags(self, tags: torch.Tensor) -> None:
        if not self.checked or tags.numel() == 0:
            return
        bad = (tags < 0) | (tags == INT64_MAX)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise ValueError(
                f"tags must be VID_o >= 0 and < 2**63 - 1 (tags[{i}] = {int(tags[i])})"
            )

    def _rows(self, rows: RowsLike, m: int) -> torch.Tensor:
        """``rows`` validated as float32[m, dim] and moved to the device."""
        rows = checked_rows(rows, m, self.dim)
        if isinstance(rows, np.ndarray):
            rows = torch.from_numpy(np.ascontiguousarray(rows))
        return rows.to(self.device)

    # -- lines -------------------------------------------------------------------------------
    def _live(self, slots: torch.Tensor) -> torch.Tensor:
        """bool[n]: whether the lines ``slots`` (each holding a tag) would hit now."""
        if self.lifespan == LIFESPAN_UNBOUNDED:
            return torch.ones(slots.shape, dtype=torch.bool, device=self.device)
        return self._clock - self._written_at[slots] <= self.lifespan

    def _find(self, tags: torch.Tensor) -> torch.Tensor:
        """int64[n]: the line holding each tag, expired or not, or HEC_MISS."""
        pos = torch.searchsorted(self._keys, tags).clamp_(max=self.capacity - 1)
        slot = self._slots[pos]
        found = (self._keys[pos] == tags) & (slot != HEC_MISS)
        return torch.where(found, slot, HEC_MISS)

    def _search(self, tags: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots int64[n] with HEC_MISS for misses, hit bool[n]); counts lookups and hits."""
        slot = self._find(tags)
        hit = (slot != HEC_MISS) & self._live(slot.clamp(min=0))
        self._counters[_LOOKUPS] += tags.numel()
        self._counters[_HITS] += hit.sum()
        return torch.where(hit, slot, HEC_MISS), hit

    # -- operations --------------------------------------------------------------------------
    def search(self, tags: IndexLike) -> torch.Tensor:
        """HECSearch: int64[n] on the device, the slot of each tag or
        :data:`~distmb.halo.hec.contract.HEC_MISS` (absent or expired). Counts lookups and
        hits."""
        tag_t = self._index(tags, "tags")
        self._check_tags(tag_t)
        return self._search(tag_t)[0]

    def load(self, slots: IndexLike, out: torch.Tensor | None = None) -> torch.Tensor:
        """HECLoad: float32[n, dim] on the device, the lines ``slots`` (hits of a search made
        since the last store or clear); written into ``out`` when given.

        Raises:
            ValueError (``checked`` caches): a slot that holds no line, or a malformed ``out``.
        """
        slot_t = self._index(slots, "slots")
        n = slot_t.numel()
        if out is None:
            out = torch.empty((n, self.dim), dtype=torch.float32, device=self.device)
        else:
            check_out(out, n, self.dim, self.device)
        if self.checked and n:
            bad = (slot_t < 0) | (slot_t >= self._used)
            if bool(bad.any()):
                i = int(torch.nonzero(bad)[0, 0])
                what = (
                    "is HEC_MISS" if int(slot_t[i]) == HEC_MISS else "is not a line holding a tag"
                )
                raise ValueError(
                    f"load: slots[{i}] = {int(slot_t[i])} {what} (load only the hits of search)"
                )
        torch.index_select(self._data, 0, slot_t, out=out)
        return out

    def lookup(self, tags: IndexLike) -> tuple[torch.Tensor, torch.Tensor]:
        """Search and load: ``(hit bool[n], rows float32[n_hits, dim])`` on the device, rows in
        the order of ``tags``. Synchronises (the number of hits sizes the result)."""
        tag_t = self._index(tags, "tags")
        self._check_tags(tag_t)
        slot, hit = self._search(tag_t)
        return hit, self._data[slot[hit]]

    def lookup_into(self, tags: IndexLike, out: torch.Tensor) -> torch.Tensor:
        """Search and gather into ``out`` float32[n, dim] (contiguous, on the device): row
        ``i`` gets the line of ``tags[i]`` on a hit and zeros on a miss.

        Returns:
            bool[n] on the device: the hit mask. Counts lookups and hits.
        """
        tag_t = self._index(tags, "tags")
        self._check_tags(tag_t)
        check_out(out, tag_t.numel(), self.dim, self.device)
        slot, hit = self._search(tag_t)
        torch.index_select(self._data, 0, slot.clamp(min=0), out=out)
        out.masked_fill_(~hit.unsqueeze(1), 0.0)
        return hit

    def store(self, tags: IndexLike, rows: RowsLike) -> None:
        """HECStore: write ``rows[i]`` under ``tags[i]`` as if one at a time in order (the C++
        rules: same tag -> its line, else a free line, else the oldest line; a repeated tag
        keeps its last row). Stored lines get age 0.

        Args:
            tags: int[m], ``VID_o >= 0``.
            rows: float32[m, dim] (numpy or a tensor on any device; no conversion from other
                dtypes).

        Raises:
            ValueError: wrong dtype, shape or width, a negative tag (``checked``), or
                different lengths. The cache is unchanged on error.
        """
        tag_t = self._index(tags, "tags")
        row_t = self._rows(rows, tag_t.numel())
        self._check_tags(tag_t)
        m = tag_t.numel()
        if m == 0:
            return
        slot, n_new, evictions, replacements = self._assign(tag_t)
        # The last row written to each line is the one kept; the others go to the scratch line.
        order = torch.sort(slot, stable=True).indices
        sorted_slot = slot[order]
        last = torch.ones(m, dtype=torch.bool, device=self.device)
        last[:-1] = sorted_slot[1:] != sorted_slot[:-1]
        dest = torch.empty_like(slot)
        dest[order] = torch.where(last, sorted_slot, self.capacity)
        old_tag = self._tag[dest]
        self._data.index_copy_(0, dest, row_t)
        self._tag.index_copy_(0, dest, tag_t)
        self._written_at.index_fill_(0, dest, self._clock)
        seq = torch.arange(self._next_seq, self._next_seq + m, device=self.device)
        self._seq.index_copy_(0, dest, seq)
        self._next_seq += m
        self._used = torch.clamp(self._used + n_new, max=self.capacity)
        self._counters[_STORES] += m
        self._counters[_EVICTIONS] += evictions
        self._counters[_EXPIRED] += replacements - evictions
        self._update_index(dest, old_tag, tag_t)

    def _update_index(self, dest: torch.Tensor, old_tag: torch.Tensor, tag: torch.Tensor) -> None:
        """Merge a store's changes into the sorted ``tag -> slot`` index in ``O(C + m log C)``
        (no sort of the whole index): row ``i`` wrote ``tag[i]`` over ``old_tag[i]`` in line
        ``dest[i]`` (int64[m] each; ``dest == capacity``: a row that was not kept).

        Entries of lines whose tag changed are removed, the new ``(tag, line)`` entries
        inserted; every remaining entry moves by the removals before it and the insertions
        below it, every inserted one by the remaining entries below it (a stable merge of two
        sorted lists, the index's first), so that one scatter writes the new index.
        """
        cap, m, dev = self.capacity, tag.numel(), self.device
        changed = (dest < cap) & (old_tag != tag)
        removed_key = torch.where(changed & (old_tag >= 0), old_tag, INT64_MAX)
        at = torch.searchsorted(self._keys, removed_key).clamp_(max=cap - 1)
        removed = torch.zeros(cap + 1, dtype=torch.bool, device=dev)
        # index_fill_ takes its value as a kernel argument; ``removed[idx] = True`` would copy
        # a CPU scalar to the device (a synchronisation on CUDA).
        removed.index_fill_(0, torch.where(removed_key != INT64_MAX, at, cap), True)
        removed = removed[:cap]
        removed_upto = torch.zeros(cap + 1, dtype=torch.int64, device=dev)
        torch.cumsum(removed, 0, out=removed_upto[1:])  # removed_upto[j]: among the first j
        new_key, order = torch.sort(torch.where(changed, tag, INT64_MAX))
        new_slot = torch.where(new_key != INT64_MAX, dest[order], HEC_MISS)

        size = cap + m + 1  # the last position receives the removed entries
        # Insertions strictly below each entry: a histogram of where the inserted keys fall,
        # summed (a remaining entry never equals an inserted key; padding is above them all).
        valid = new_key != INT64_MAX
        falls_at = torch.searchsorted(self._keys, new_key)
        inserted_below = torch.zeros(cap + 1, dtype=torch.int64, device=dev)
        inserted_below.index_add_(0, torch.where(valid, falls_at, cap), valid.long())
        inserted_below = torch.cumsum(inserted_below[:cap], 0)
        old_pos = torch.arange(cap, device=dev) - removed_upto[:cap] + inserted_below
        old_pos = torch.where(removed, size - 1, old_pos)
        below = torch.searchsorted(self._keys, new_key, right=True)
        new_pos = torch.arange(m, device=dev) + below - removed_upto[below]
        keys = torch.empty(size, dtype=torch.int64, device=dev)
        slots = torch.empty(size, dtype=torch.int64, device=dev)
        keys[old_pos] = self._keys
        slots[old_pos] = self._slots
        keys[new_pos] = new_key
        slots[new_pos] = new_slot
        self._keys, self._slots = keys[:cap].clone(), slots[:cap].clone()

    def _sorted_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``tag -> slot`` index sorted from scratch out of the lines' tags (what
        :meth:`_update_index` maintains incrementally; for tests)."""
        tag = self._tag[: self.capacity]
        keys, order = torch.sort(torch.where(tag >= 0, tag, INT64_MAX))
        return keys, torch.where(keys != INT64_MAX, order, HEC_MISS)

    def _assign(
        self, tags: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The line each of ``tags`` (int64[m], m >= 1) is written to, as the C++ serial loop
        decides it (module docstring).

        Returns:
            ``(slot int64[m], new int64[], evictions int64[], replacements int64[])``: each
            row's line; how many rows brought a tag absent from the cache and not repeated
            earlier in the call (each takes a free line while there is one); how many rows
            replaced an unexpired line of another tag; how many replaced any line of another
            tag. All on the device.
        """
        dev = self.device
        cap, m = self.capacity, tags.numel()
        k = min(cap, m)  # oldest lines that a store of m rows can reach
        n = k + 1 + m  # positions of X: k oldest lines, the marker, the rows
        never = n  # a prev that no query a < n counts, and "not replaced"
        rows_at = k + 1  # position of row 0
        used = self._used

        cur = self._find(tags)  # the line holding each tag when the call starts
        old_seq, old_slot = torch.topk(self._seq[:cap], k, largest=False, sorted=True)
        old_real = old_seq != INT64_MAX
        n_old = old_real.sum()
        cur_seq = self._seq[cur.clamp(min=0)]
        rank = torch.searchsorted(old_seq, cur_seq).clamp_(max=k - 1)
        in_old = (cur != HEC_MISS) & (old_seq[rank] == cur_seq) & old_real[rank]

        # Previous and next row of the same tag within the call.
        by_tag = torch.sort(tags, stable=True).indices
        same = tags[by_tag[1:]] == tags[by_tag[:-1]]
        prev_row = torch.full((m,), -1, dtype=torch.int64, device=dev)
        prev_row[by_tag[1:]] = torch.where(same, by_tag[:-1], -1)
        next_row = torch.full((m,), -1, dtype=torch.int64, device=dev)
        next_row[by_tag[:-1]] = torch.where(same, by_tag[1:], -1)

        # prev over X: -1 for a tag seen first; `never` for fillers and the marker.
        marker = k
        row_prev = torch.where(
            prev_row >= 0,
            prev_row + rows_at,
            torch.where(in_old, rank, torch.where(cur != HEC_MISS, marker, -1)),
        )
        prev = torch.cat(
            [
                torch.where(old_real, -1, never),
                torch.full((1,), never, dtype=torch.int64, device=dev),
                row_prev,
            ]
        )
        # next over X: the next position of the same tag, or 2n (none).
        none = 2 * n
        nxt = torch.full((n + 1,), none, dtype=torch.int64, device=dev)
        first_of_old = (prev_row < 0) & in_old
        nxt.scatter_(0, torch.where(first_of_old, rank, n), torch.arange(m, device=dev) + rows_at)
        nxt = nxt[:n]
        nxt[rows_at:] = torch.where(next_row >= 0, next_row + rows_at, none)

        real = torch.cat(
            [
                old_real,
                torch.zeros(1, dtype=torch.bool, device=dev),
                torch.ones_like(tags, dtype=torch.bool),
            ]
        )
        # Position a is replaced when the distinct tags written in (a, b] reach `need[a]`,
        # i.e. at the first b with #{j <= b : prev[j] <= a} >= need[a] + #{real j <= a}.
        need = torch.full((n,), cap, dtype=torch.int64, device=dev)
        need[:k] = cap - (used - n_old)  # the resident lines newer than the k oldest count too
        target = need + torch.cumsum(real, 0)
        replaced_at = _first_reaching(prev, target, never)
        replaced = real & (replaced_at < n) & (replaced_at < nxt)

        victim = torch.full((n + 1,), -1, dtype=torch.int64, device=dev)
        victim.scatter_(0, torch.where(replaced, replaced_at, n), torch.arange(n, device=dev))
        victim = victim[rows_at:n]

        # Classify the rows.
        new = row_prev == -1
        refresh_resident = row_prev == marker
        prev_replaced = replaced[row_prev.clamp(min=0)]
        refresh_row = (row_prev >= 0) & ~refresh_resident & ~prev_replaced
        new_before = torch.cumsum(new, 0) - new.long()
        free_slot = used + new_before
        takes_free = new & (free_slot < cap)
        takes_victim = ~refresh_resident & ~refresh_row & ~takes_free

        # "Same line as" links, resolved by pointer jumping; roots carry their line.
        pos = torch.arange(n, device=dev)
        parent = pos.clone()
        parent[rows_at:] = torch.where(
            refresh_row, row_prev, torch.where(takes_victim, victim, pos[rows_at:])
        )
        line = torch.zeros(n, dtype=torch.int64, device=dev)
        line[:k] = old_slot
        line[rows_at:] = torch.where(refresh_resident, cur, torch.where(takes_free, free_slot, 0))
        for _ in range(max(1, math.ceil(math.log2(n)))):
            parent = parent[parent]
        slot = line[parent][rows_at:]

        live = torch.ones(n, dtype=torch.bool, device=dev)
        live[:k] = self._live(old_slot) | ~old_real
        evictions = (takes_victim & live[victim.clamp(min=0)]).sum()
        return slot, new.sum(), evictions, takes_victim.sum()

    def advance(self) -> None:
        """One training iteration has passed: every line's age grows by one (O(1), host)."""
        self._clock += 1

    def clear(self) -> None:
        """Drop every line. The clock and the counters are kept."""
        self._tag.fill_(-1)
        self._seq.fill_(INT64_MAX)
        self._keys.fill_(INT64_MAX)
        self._slots.fill_(HEC_MISS)
        self._used.zero_()

    # -- checkpointing ----------------------------------------------------------------------
    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """``(tags, ages)``, int64[occupied] numpy arrays indexed by slot (expired lines
        included); synchronises."""
        used = self.occupied
        tags = self._tag[:used].cpu().numpy()
        ages = (self._clock - self._written_at[:used]).cpu().numpy()
        return tags, ages

    def state(self) -> dict[str, np.ndarray]:
        """The valid lines in slot order as numpy arrays ``tags`` int64[v], ``ages`` int64[v],
        ``rows`` float32[v, dim], copied to the host; counts ``v`` lookups and hits."""
        tags, ages = self.snapshot()
        slots = np.arange(tags.size)
        if self.lifespan != LIFESPAN_UNBOUNDED:
            valid = ages <= self.lifespan
            tags, ages, slots = tags[valid], ages[valid], slots[valid]
        self._counters[_LOOKUPS] += tags.size
        self._counters[_HITS] += tags.size
        rows = self._data[torch.from_numpy(slots).to(self.device)].cpu().numpy()
        return {"tags": tags, "ages": ages, "rows": rows}

    # -- statistics --------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        """The counts, copied from the device (synchronises)."""
        values = self._counters.cpu().tolist()
        return dict(zip(COUNTER_KEYS, (int(v) for v in values), strict=True))

    def reset_counters(self) -> None:
        self._counters.zero_()


def _first_reaching(prev: torch.Tensor, target: torch.Tensor, never: int) -> torch.Tensor:
    """For every position ``a`` of ``prev`` (int64[n], values in ``[-1, never]``), the first
    ``b`` with ``#{j <= b : prev[j] <= a} >= target[a]``, or a value ``>= n`` where there is
    none.

    A Fenwick-style descent over a merge-sort tree: at level ``l`` (blocks of ``2**l``
    positions, each block's ``prev`` sorted and offset by ``block * (never + 2)`` so that the
    whole level is one sorted array), the count of ``prev <= a`` in the block starting at the
    current position is one ``searchsorted``; the block is skipped while the running count
    stays below the target. ``O(n log^2 n)`` work in ``log2 n`` rounds of vectorised ops.
    """
    dev = prev.device
    n = prev.numel()
    levels = max(1, math.ceil(math.log2(n + 1)))
    size_all = 1 << levels  # > n: the last position is padding, never counted
    padded = torch.full((size_all,), never, dtype=torch.int64, device=dev)
    padded[:n] = prev
    width = never + 2
    a = torch.arange(n, device=dev)
    pos = torch.zeros(n, dtype=torch.int64, device=dev)
    acc = torch.zeros(n, dtype=torch.int64, device=dev)
    for level in range(levels - 1, -1, -1):
        size = 1 << level
        blocks = size_all >> level
        sorted_prev = padded.view(blocks, size).sort(dim=1).values if size > 1 else padded
        offsets = torch.arange(blocks, device=dev) * width
        keys = (sorted_prev.view(blocks, size) + 1 + offsets.unsqueeze(1)).reshape(-1)
        block = pos >> level
        count = torch.searchsorted(keys, block * width + a + 1, right=True) - block * size
        take = acc + count < target
        acc = torch.where(take, acc + count, acc)
        pos = torch.where(take, pos + size, pos)
    return pos
