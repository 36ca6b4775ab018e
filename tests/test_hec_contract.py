"""The historical embedding cache contract (distmb.halo.hec.contract), one set of tests run
against every implementation: the C++ cache (host), the device cache on CPU tensors and, under
``pytest -m cuda``, on a GPU. Behaviour is checked against :class:`ReferenceCache`, the
contract written with a dict, a list of lines and an ``OrderedDict`` of lines in write order,
on random traces (fixed seeds) and on traces worked out by hand."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pytest
import torch

from distmb.halo.hec.contract import (
    CACHE_STATE_KEYS,
    COUNTER_KEYS,
    HEC_MISS,
    LIFESPAN_UNBOUNDED,
    EmbeddingCache,
)
from distmb.halo.hec.device import DeviceHistoricalCache
from distmb.halo.hec.host import HistoricalEmbeddingCache

#: Every implementation: the C++ cache, the device cache on the CPU, on a GPU under -m cuda.
IMPLEMENTATIONS = [
    pytest.param("host", id="host"),
    pytest.param("device-cpu", id="device-cpu"),
    pytest.param("device-cuda", id="device-cuda", marks=pytest.mark.cuda),
]
LIFESPANS = [0, 1, 3, LIFESPAN_UNBOUNDED]

#: Builds a cache of one implementation: ``(capacity, dim, lifespan) -> cache``.
CacheFactory = Callable[[int, int, int], EmbeddingCache]


def make_cache(implementation: str, capacity: int, dim: int, lifespan: int) -> EmbeddingCache:
    if implementation == "host":
        return HistoricalEmbeddingCache(capacity, dim, lifespan)
    return DeviceHistoricalCache(
        capacity, dim, lifespan, device=implementation.removeprefix("device-")
    )


@pytest.fixture(params=IMPLEMENTATIONS)
def new_cache(request: pytest.FixtureRequest) -> CacheFactory:
    """A factory of caches of one implementation (each test runs once per implementation)."""
    implementation = request.param

    def build(capacity: int, dim: int, lifespan: int) -> EmbeddingCache:
        return make_cache(implementation, capacity, dim, lifespan)

    return build


# -- the reference ------------------------------------------------------------------------------
class ReferenceCache:
    """The contract in plain Python: no hashing, no merge-sort trees, no device.

    Lines ``[0, occupied)`` are Python lists (tag, row, clock at the write); ``slot_of`` maps a
    resident tag to its line; ``write_order`` holds the lines least recently written first, so
    a new tag in a full cache replaces its first entry. A line hits while
    ``clock - written_at <= lifespan``.
    """

    def __init__(self, capacity: int, dim: int, lifespan: int) -> None:
        self.capacity, self.dim, self.lifespan = capacity, dim, lifespan
        self.clock = 0
        self.counters = dict.fromkeys(COUNTER_KEYS, 0)
        self.clear()

    def clear(self) -> None:
        self.tag_at: list[int] = []
        self.row_at: list[np.ndarray] = []
        self.written_at: list[int] = []
        self.slot_of: dict[int, int] = {}
        self.write_order: OrderedDict[int, None] = OrderedDict()

    @property
    def occupied(self) -> int:
        return len(self.tag_at)

    def age(self, slot: int) -> int:
        return self.clock - self.written_at[slot]

    def is_live(self, slot: int) -> bool:
        return self.lifespan == LIFESPAN_UNBOUNDED or self.age(slot) <= self.lifespan

    def live_lines(self) -> int:
        return sum(self.is_live(slot) for slot in range(self.occupied))

    def search(self, tags: np.ndarray) -> np.ndarray:
        """int64[n]: the slot of each tag, HEC_MISS where absent or expired; counts."""
        slots = []
        for tag in np.asarray(tags).tolist():
            slot = self.slot_of.get(tag)
            slots.append(slot if slot is not None and self.is_live(slot) else HEC_MISS)
        out = np.array(slots, dtype=np.int64)
        self.counters["lookups"] += out.size
        self.counters["hits"] += int((out != HEC_MISS).sum())
        return out

    def store(self, tags: np.ndarray, rows: np.ndarray) -> None:
        for tag, row in zip(np.asarray(tags).tolist(), rows, strict=True):
            slot = self.slot_of.get(tag)
            if slot is None:
                if self.occupied < self.capacity:
                    slot = self.occupied
                    self.tag_at.append(tag)
                    self.row_at.append(row)
                    self.written_at.append(self.clock)
                else:
                    slot = next(iter(self.write_order))
                    replaced = "evictions" if self.is_live(slot) else "expired_replacements"
                    self.counters[replaced] += 1
                    del self.slot_of[self.tag_at[slot]]
                    self.tag_at[slot] = tag
                self.slot_of[tag] = slot
            self.row_at[slot] = np.array(row, dtype=np.float32)
            self.written_at[slot] = self.clock
            self.write_order.pop(slot, None)
            self.write_order[slot] = None
        self.counters["stores"] += len(tags)

    def advance(self) -> None:
        self.clock += 1

    def rows(self, slots: np.ndarray) -> np.ndarray:
        return np.array([self.row_at[s] for s in slots], dtype=np.float32).reshape(-1, self.dim)

    def state(self) -> dict[str, np.ndarray]:
        """The valid lines in slot order; reading them counts as lookups that hit."""
        valid = [slot for slot in range(self.occupied) if self.is_live(slot)]
        self.counters["lookups"] += len(valid)
        self.counters["hits"] += len(valid)
        return {
            "tags": np.array([self.tag_at[s] for s in valid], dtype=np.int64),
            "ages": np.array([self.age(s) for s in valid], dtype=np.int64),
            "rows": self.rows(np.array(valid, dtype=np.int64)),
        }


# -- comparisons --------------------------------------------------------------------------------
def host(values: torch.Tensor | np.ndarray) -> np.ndarray:
    return values.cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)


def assert_bits_equal(got: torch.Tensor | np.ndarray, want: np.ndarray) -> None:
    """float32 arrays equal bit for bit (shape, then every value's bits)."""
    got = host(got)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def assert_same_state(cache: EmbeddingCache, ref: ReferenceCache) -> None:
    """Every line (tag, age and row by slot), the sizes, the clock and the counters agree."""
    tags, ages = cache.snapshot()
    assert tags.dtype == np.int64 and ages.dtype == np.int64
    np.testing.assert_array_equal(tags, ref.tag_at)
    np.testing.assert_array_equal(ages, [ref.age(s) for s in range(ref.occupied)])
    every = np.arange(ref.occupied)
    assert_bits_equal(cache.load(every), ref.rows(every))  # expired lines included
    assert cache.occupied == ref.occupied
    assert len(cache) == ref.live_lines()
    assert cache.clock == ref.clock
    assert cache.counters() == ref.counters


def assert_same_lookup(
    cache: EmbeddingCache, ref: ReferenceCache, queries: np.ndarray, how: str
) -> None:
    """One lookup through the cache and the reference, by ``how``: ``search`` (then a load of
    the hits), ``lookup`` or ``lookup_into``."""
    slots = ref.search(queries)
    hit = slots != HEC_MISS
    if how == "search":
        got = cache.search(queries)
        np.testing.assert_array_equal(host(got), slots)
        assert_bits_equal(cache.load(got[got != HEC_MISS]), ref.rows(slots[hit]))
    elif how == "lookup":
        mask, rows = cache.lookup(queries)
        assert mask.dtype == torch.bool and mask.device == rows.device == cache.device
        np.testing.assert_array_equal(host(mask), hit)
        assert_bits_equal(rows, ref.rows(slots[hit]))
    else:
        out = torch.full((queries.size, cache.dim), float("nan"), device=cache.device)
        mask = cache.lookup_into(queries, out)
        np.testing.assert_array_equal(host(mask), hit)
        want = np.zeros((queries.size, cache.dim), np.float32)
        want[hit] = ref.rows(slots[hit])
        assert_bits_equal(out, want)


def as_input(
    rng: np.random.Generator, values: np.ndarray, device: torch.device
) -> np.ndarray | torch.Tensor | list:
    """``values`` in one of the forms a cache accepts: a numpy array, a tensor on the cache's
    device (integers as int32), or, for non-empty integers, a list (``[]`` is float64)."""
    form = rng.integers(3)
    if form == 0:
        return values
    if values.dtype.kind in "iu":
        if form == 1 or values.size == 0:
            return torch.from_numpy(values.astype(np.int32)).to(device)
        return values.tolist()
    return torch.from_numpy(values).to(device)


def run_trace(
    cache: EmbeddingCache,
    seed: int,
    steps: int,
    universe: int,
    max_rows: int,
    check_every_step: bool = True,
) -> ReferenceCache:
    """A random trace of stores (tags repeated within a call), lookups of all three kinds,
    advances, clears and counter resets through ``cache`` and the reference."""
    rng = np.random.default_rng(seed)
    ref = ReferenceCache(cache.capacity, cache.dim, cache.lifespan)
    for _ in range(steps):
        op = rng.choice(["store", "lookup", "advance", "rare"], p=[0.42, 0.33, 0.22, 0.03])
        if op == "store":
            tags = rng.integers(0, universe, int(rng.integers(0, max_rows + 1)))
            rows = rng.standard_normal((tags.size, cache.dim)).astype(np.float32)
            cache.store(as_input(rng, tags, cache.device), as_input(rng, rows, cache.device))
            ref.store(tags, rows)
        elif op == "lookup":
            queries = rng.integers(0, universe + 3, int(rng.integers(0, 2 * cache.capacity + 3)))
            how = str(rng.choice(["search", "lookup", "lookup_into"]))
            assert_same_lookup(cache, ref, queries, how)
        elif op == "advance":
            for _ in range(int(rng.integers(1, 3))):
                cache.advance()
                ref.advance()
        elif rng.random() < 0.5:
            cache.clear()
            ref.clear()
        else:
            cache.reset_counters()
            ref.counters = dict.fromkeys(COUNTER_KEYS, 0)
        if check_every_step:
            assert_same_state(cache, ref)
    assert_same_state(cache, ref)
    return ref


# -- random traces --------------------------------------------------------------------------------
@pytest.mark.parametrize("lifespan", LIFESPANS)
@pytest.mark.parametrize(
    ("capacity", "universe", "max_rows"),
    [
        (1, 6, 5),  # every store of two tags evicts within the call
        (3, 12, 10),  # stores larger than the cache: lines written and replaced in one call
        (8, 30, 6),  # stores smaller than a full cache: old lines refreshed or replaced
        (24, 74, 50),
        (64, 40, 50),  # larger than the id space: nothing is ever evicted
    ],
)
def test_random_traces_match_the_reference(
    new_cache: CacheFactory, capacity: int, lifespan: int, universe: int, max_rows: int
) -> None:
    for seed in range(2):
        cache = new_cache(capacity, 3, lifespan)
        assert isinstance(cache, EmbeddingCache)
        run_trace(cache, seed * 31 + capacity, 70, universe, max_rows)


def test_random_traces_exercise_every_path(new_cache: CacheFactory) -> None:
    """The trace comparison is not vacuous: hits, misses, evictions and expired replacements
    all happen, and tags repeat within one store."""
    ref = run_trace(new_cache(8, 2, 1), seed=3, steps=300, universe=30, max_rows=12)
    c = ref.counters
    assert 0 < c["hits"] < c["lookups"]
    assert c["evictions"] > 0 and c["expired_replacements"] > 0


def test_full_cache_small_stores(new_cache: CacheFactory) -> None:
    """A full cache much larger than each store: a store only reaches the oldest lines, while
    refreshing newer ones anywhere in the write order."""
    rng = np.random.default_rng(11)
    cap, dim = 300, 2
    cache, ref = new_cache(cap, dim, 5), ReferenceCache(cap, dim, 5)
    fill = rng.permutation(420)[:cap]
    fill_rows = rng.standard_normal((cap, dim)).astype(np.float32)
    for part in np.array_split(np.arange(cap), 4):  # four ages
        for c in (cache, ref):
            c.store(fill[part], fill_rows[part])
            c.advance()
    for step in range(60):
        tags = rng.integers(0, 420, int(rng.integers(1, 12)))
        rows = rng.standard_normal((tags.size, dim)).astype(np.float32)
        cache.store(tags, rows)
        ref.store(tags, rows)
        if step % 3 == 0:
            cache.advance()
            ref.advance()
        assert_same_state(cache, ref)
    assert ref.counters["evictions"] > 0 and ref.counters["expired_replacements"] > 0


def test_large_calls(new_cache: CacheFactory) -> None:
    """Stores of thousands of rows with many repeats, into caches smaller and larger than a
    call, and lookups of 8192 tags (every parallel loop of the C++ cache splits: its grains
    are 4096 tags and 32768 floats per thread)."""
    rng = np.random.default_rng(5)
    dim = 32
    for cap in (700, 5000):
        cache, ref = new_cache(cap, dim, 1), ReferenceCache(cap, dim, 1)
        for _ in range(4):
            tags = rng.integers(0, 6000, 3000)
            rows = rng.standard_normal((tags.size, dim)).astype(np.float32)
            cache.store(tags, rows)
            ref.store(tags, rows)
            queries = rng.integers(0, 6000, 8192)
            for how in ("search", "lookup", "lookup_into"):
                assert_same_lookup(cache, ref, queries, how)
            cache.advance()
            ref.advance()
            assert_same_state(cache, ref)
        # Smaller than a call: rows evict lines of the same call; larger: expired lines go.
        replaced = "evictions" if cap < tags.size else "expired_replacements"
        assert ref.counters[replaced] > 0


# -- the rules, one at a time --------------------------------------------------------------------
def rows_for(tags: list[int], dim: int, salt: float = 0.0) -> np.ndarray:
    """Row i = tags[i] + salt + [0, 0.01, 0.02, ...]: distinct and recognisable."""
    tag_col = np.asarray(tags, dtype=np.float32)[:, None] + salt
    return tag_col + np.arange(dim, dtype=np.float32) * 0.01


def resident(cache: EmbeddingCache) -> dict[int, int]:
    """``{tag: age}`` of every line holding a tag."""
    tags, ages = cache.snapshot()
    return dict(zip(tags.tolist(), ages.tolist(), strict=True))


def slots_of(cache: EmbeddingCache, tags: list[int]) -> list[int]:
    return host(cache.search(tags)).tolist()


def test_hit_after_store_miss_for_unknown(new_cache: CacheFactory) -> None:
    cache = new_cache(4, 3, 2)
    cache.store(np.array([10, 20]), rows_for([10, 20], 3))
    assert slots_of(cache, [20, 30, 10]) == [1, HEC_MISS, 0]
    assert_bits_equal(cache.load([1, 0]), rows_for([20, 10], 3))
    assert cache.counters() == dict(zip(COUNTER_KEYS, [3, 2, 2, 0, 0], strict=True))
    assert cache.hit_rate() == pytest.approx(2 / 3)
    assert len(cache) == 2 and cache.occupied == 2


def test_overwrite_by_tag_keeps_one_line_and_resets_age(new_cache: CacheFactory) -> None:
    cache = new_cache(4, 2, 5)
    cache.store([7], rows_for([7], 2))
    cache.advance()
    cache.advance()
    assert resident(cache) == {7: 2}
    cache.store([7], rows_for([7], 2, salt=100.0))
    assert resident(cache) == {7: 0}
    mask, rows = cache.lookup([7])
    assert host(mask).tolist() == [True]
    assert_bits_equal(rows, rows_for([7], 2, salt=100.0))
    assert cache.counters()["evictions"] == 0


@pytest.mark.parametrize("lifespan", [0, 1, 2, 5])
def test_expiry_boundary(new_cache: CacheFactory, lifespan: int) -> None:
    """A line hits while age <= lifespan and misses from age lifespan + 1 on."""
    cache = new_cache(2, 1, lifespan)
    cache.store([3], rows_for([3], 1))
    for age in range(lifespan + 3):
        assert (slots_of(cache, [3])[0] != HEC_MISS) == (age <= lifespan), f"age {age}"
        assert len(cache) == (1 if age <= lifespan else 0)
        cache.advance()
    assert cache.occupied == 1  # expired, not removed


def test_unbounded_lifespan_never_expires(new_cache: CacheFactory) -> None:
    cache = new_cache(2, 1, LIFESPAN_UNBOUNDED)
    cache.store([3], rows_for([3], 1))
    for _ in range(1000):
        cache.advance()
    assert slots_of(cache, [3]) == [0]
    assert cache.lifespan == LIFESPAN_UNBOUNDED and "lifespan=unbounded" in repr(cache)


def test_expired_line_is_refreshed_by_its_tag(new_cache: CacheFactory) -> None:
    cache = new_cache(2, 1, 1)
    cache.store([3, 4], rows_for([3, 4], 1))
    for _ in range(3):
        cache.advance()
    assert slots_of(cache, [3, 4]) == [HEC_MISS, HEC_MISS]
    cache.store([3], rows_for([3], 1, salt=0.5))
    assert resident(cache) == {3: 0, 4: 3}
    c = cache.counters()
    assert c["evictions"] == 0 and c["expired_replacements"] == 0
    cache.store([5], rows_for([5], 1))  # full: replaces the expired line of 4
    assert resident(cache) == {3: 0, 5: 0}
    assert cache.counters()["expired_replacements"] == 1


def test_oldest_first_eviction(new_cache: CacheFactory) -> None:
    cache = new_cache(3, 2, LIFESPAN_UNBOUNDED)
    for tag in (1, 2, 3):
        cache.store([tag], rows_for([tag], 2))
        cache.advance()
    assert resident(cache) == {1: 3, 2: 2, 3: 1}
    cache.store([1], rows_for([1], 2))  # refresh: 2 becomes the oldest
    cache.store([4], rows_for([4], 2))
    assert resident(cache) == {1: 0, 4: 0, 3: 1}
    cache.store([5], rows_for([5], 2))  # the oldest is 3
    assert set(resident(cache)) == {1, 4, 5}
    assert cache.counters()["evictions"] == 2
    # Equal ages: the line stored first goes first (1 was stored before 4, then 5).
    cache.store([6, 7], rows_for([6, 7], 2))
    assert set(resident(cache)) == {5, 6, 7}


def test_oldest_first_prefers_expired_lines_and_counts_them(new_cache: CacheFactory) -> None:
    cache = new_cache(3, 1, 1)
    cache.store([1], rows_for([1], 1))
    cache.advance()
    cache.advance()  # 1 has age 2: expired
    cache.store([2, 3], rows_for([2, 3], 1))
    cache.store([4], rows_for([4], 1))
    assert set(resident(cache)) == {2, 3, 4}
    assert cache.counters()["expired_replacements"] == 1
    assert cache.counters()["evictions"] == 0
    cache.store([5], rows_for([5], 1))
    assert set(resident(cache)) == {3, 4, 5}
    assert cache.counters()["evictions"] == 1


def test_duplicate_tags_in_one_store_last_row_wins(new_cache: CacheFactory) -> None:
    cache = new_cache(4, 2, 2)
    rows = rows_for([5, 6, 5, 5], 2) + np.array([[0], [0], [10], [20]], np.float32)
    cache.store([5, 6, 5, 5], rows)
    assert resident(cache) == {5: 0, 6: 0}
    _, got = cache.lookup([5, 6])
    assert_bits_equal(got, rows[[3, 1]])
    assert cache.counters()["stores"] == 4


def test_store_larger_than_capacity_chains_evictions(new_cache: CacheFactory) -> None:
    """Rows are stored as if one at a time: later rows of a call evict earlier ones."""
    cache = new_cache(2, 2, LIFESPAN_UNBOUNDED)
    cache.store([1, 2, 3], rows_for([1, 2, 3], 2))
    assert cache.snapshot()[0].tolist() == [3, 2]  # 3 took line 0, the line of 1
    assert cache.counters()["evictions"] == 1


def test_repeated_tag_replaced_within_one_call(new_cache: CacheFactory) -> None:
    """Capacity 1: each new tag of a call replaces the previous row's line, so a tag that
    comes back later in the call is stored again (the serial chain of decisions)."""
    cache = new_cache(1, 1, 0)
    cache.store([1, 2, 1, 3, 3, 1], np.arange(6, dtype=np.float32)[:, None])
    assert resident(cache) == {1: 0}
    assert_bits_equal(cache.load([0]), np.array([[5.0]], np.float32))
    assert cache.counters()["evictions"] == 4


def test_hand_trace_slots_and_counters(new_cache: CacheFactory) -> None:
    """Slots, rows, ages and counters on a trace worked out by hand."""
    cache = new_cache(3, 2, 1)
    cache.store([10, 20, 30], rows_for([10, 20, 30], 2))  # free lines 0, 1, 2
    cache.advance()
    cache.store([20], rows_for([20], 2, salt=0.5))  # refresh: 20 is now the newest
    cache.store([40], rows_for([40], 2))  # replaces 10, the oldest (age 1, live: an eviction)
    assert slots_of(cache, [10, 20, 30, 40]) == [HEC_MISS, 1, 2, 0]
    assert_bits_equal(cache.load([1]), rows_for([20], 2, salt=0.5))
    cache.advance()
    cache.advance()  # 30 has age 3 > lifespan: expired, and the oldest
    cache.store([50, 50, 60], rows_for([50, 51, 60], 2))  # 50 takes 30's line, keeps row 51
    assert slots_of(cache, [30, 50, 60]) == [HEC_MISS, 2, 1]
    assert_bits_equal(cache.load([2]), rows_for([51], 2))
    # 40 evicted 10 (age 1, live); 50 and 60 replaced 30 and 20 (ages 3 and 2, expired).
    assert cache.counters() == dict(zip(COUNTER_KEYS, [7, 5, 8, 1, 2], strict=True))
    tags, ages = cache.snapshot()
    assert tags.tolist() == [40, 60, 50] and ages.tolist() == [2, 0, 0]


def test_clear_and_reset_counters(new_cache: CacheFactory) -> None:
    cache = new_cache(3, 2, 1)
    cache.store([1, 2], rows_for([1, 2], 2))
    cache.advance()
    cache.search([1, 9])
    cache.clear()
    assert len(cache) == 0 and cache.occupied == 0 and cache.clock == 1
    assert cache, "an empty cache is still truthy"
    assert slots_of(cache, [1, 2]) == [HEC_MISS, HEC_MISS]
    assert cache.counters()["lookups"] == 4
    cache.reset_counters()
    assert cache.counters() == dict.fromkeys(COUNTER_KEYS, 0) and cache.hit_rate() == 0.0
    cache.store([4, 5, 6, 7], rows_for([4, 5, 6, 7], 2))  # free lines again after clear
    assert cache.snapshot()[0].tolist() == [7, 5, 6]


# -- inputs and outputs --------------------------------------------------------------------------
def test_inputs_of_every_kind_and_outputs_into_slices(new_cache: CacheFactory) -> None:
    cache = new_cache(8, 4, 2)
    dev = cache.device
    tags = torch.tensor([3, 1, 2], dtype=torch.int32, device=dev)
    rows = torch.from_numpy(rows_for([3, 1, 2], 4)).to(dev).requires_grad_()
    cache.store(tags, rows)  # detached, not refused
    x = torch.zeros(5, 4, device=dev)
    out = cache.load(cache.search(torch.tensor([2, 3], device=dev)), out=x[3:])
    assert out.data_ptr() == x[3:].data_ptr()
    assert_bits_equal(x[3:], rows_for([2, 3], 4))
    assert (x[:3] == 0).all()
    y = torch.full((6, 4), -1.0, device=dev)
    hit = cache.lookup_into(np.array([1, 99, 3]), y[3:])  # the halo rows of a layer input
    assert hit.device == dev and host(hit).tolist() == [True, False, True]
    assert_bits_equal(y[[3, 5]], rows_for([1, 3], 4))
    assert (y[4] == 0).all() and (y[:3] == -1).all()
    # A non-contiguous float32 array is accepted (copied); uint8 tags too.
    cache.store(np.array([8, 9], dtype=np.uint8), np.asfortranarray(rows_for([8, 9], 4)))
    assert_bits_equal(cache.lookup([8, 9])[1], rows_for([8, 9], 4))
    # Empty calls.
    cache.store(np.zeros(0, np.int64), np.zeros((0, 4), np.float32))
    assert tuple(cache.search(np.zeros(0, np.int64)).shape) == (0,)
    mask, got = cache.lookup(np.zeros(0, np.int64))
    assert tuple(mask.shape) == (0,) and tuple(got.shape) == (0, 4)
    assert tuple(cache.load(np.zeros(0, np.int64)).shape) == (0, 4)
    assert cache.counters()["stores"] == 5


@pytest.mark.parametrize(
    "args",
    [(0, 4, 1), (-1, 4, 1), (4, 0, 1), (4, 4, -2), (1.5, 4, 1), (True, 4, 1), (4.0, 3, 1)],
)
def test_bad_constructor_arguments(new_cache: CacheFactory, args: tuple) -> None:
    with pytest.raises(ValueError, match="capacity|dim|lifespan"):
        new_cache(*args)


def test_too_large_a_cache_is_refused(new_cache: CacheFactory) -> None:
    with pytest.raises(ValueError, match="too large"):
        new_cache(2**62, 2**10, 1)


def test_bad_calls_raise_and_leave_the_cache_unchanged(new_cache: CacheFactory) -> None:
    cache = new_cache(4, 3, 1)
    cache.store([1, 2], rows_for([1, 2], 3))
    before = (cache.snapshot(), cache.counters())
    bad_stores = [
        ([1, 2], rows_for([1, 2], 3).astype(np.float64), "float32"),  # no silent conversion
        ([5], [[1.0, 2.0, 3.0]], "float32"),  # a list of Python floats is float64
        ([1, 2], rows_for([1, 2], 4), "shape"),  # width
        ([1], rows_for([1], 3)[0], "shape"),  # 1-D rows
        ([1, 2, 3], rows_for([1, 2], 3), "must match"),  # count
        ([[1, 2]], rows_for([1, 2], 3), "1-D"),  # 2-D tags
        (np.array([1.0, 2.0]), rows_for([1, 2], 3), "integers"),  # float tags
        (np.array([True, False]), rows_for([1, 2], 3), "integers"),  # bool tags
        ([5, -3], rows_for([5, 6], 3), "VID_o"),  # a negative tag
    ]
    for tags, rows, message in bad_stores:
        with pytest.raises(ValueError, match=message):
            cache.store(np.asarray(tags), rows)
    with pytest.raises(ValueError, match="integers"):
        cache.search(torch.tensor([1.0], device=cache.device))
    with pytest.raises(ValueError, match="VID_o"):
        cache.search([0, -1])
    with pytest.raises(ValueError, match="VID_o"):
        cache.lookup_into([-1], torch.zeros(1, 3, device=cache.device))
    with pytest.raises(ValueError, match="HEC_MISS"):
        cache.load([0, HEC_MISS])
    with pytest.raises(ValueError, match="not a line"):
        cache.load([2])  # only lines 0 and 1 hold a tag
    bad_outs = [
        torch.zeros(1, 4, device=cache.device),  # width
        torch.zeros(1, 3, dtype=torch.float64, device=cache.device),  # dtype
        torch.zeros(1, 6, device=cache.device)[:, ::2],  # non-contiguous
        np.zeros((1, 3), np.float32),  # not a tensor
    ]
    for out in bad_outs:
        with pytest.raises(ValueError, match="out"):
            cache.load([0], out=out)
        with pytest.raises(ValueError, match="out"):
            cache.lookup_into([1], out)
    (tags_before, ages_before), counters_before = before
    tags_after, ages_after = cache.snapshot()
    np.testing.assert_array_equal(tags_after, tags_before)
    np.testing.assert_array_equal(ages_after, ages_before)
    assert cache.counters() == counters_before, "a rejected call counted"
    assert_bits_equal(cache.load([0, 1]), rows_for([1, 2], 3))


# -- checkpoints ---------------------------------------------------------------------------------
@pytest.mark.parametrize("target", IMPLEMENTATIONS)
def test_state_and_restore_across_implementations(new_cache: CacheFactory, target: str) -> None:
    """A cache's state is the reference's (valid lines only, in slot order); restored into a
    fresh cache of any implementation it gives the reference's replay: the same lines in the
    same slots, which then answer and expire alike."""
    source = new_cache(12, 3, 3)
    ref = run_trace(source, seed=2, steps=60, universe=40, max_rows=10, check_every_step=False)
    state, want = source.state(), ref.state()
    assert tuple(state) == CACHE_STATE_KEYS
    for key in CACHE_STATE_KEYS:
        assert isinstance(state[key], np.ndarray)
        np.testing.assert_array_equal(state[key], want[key])
    assert state["ages"].max() <= 3 and state["tags"].size == len(source) > 0
    assert source.counters() == ref.counters  # the state's row reads are counted

    restored = make_cache(target, 12, 3, 3)
    restored.store([999], rows_for([999], 3))  # dropped by the restore
    replay = ReferenceCache(12, 3, 3)  # the restore procedure, on the reference
    replay.counters = restored.counters()  # kept; the restore adds its stores
    restored.restore(state)
    ages = want["ages"]
    for age in sorted(set(ages.tolist()), reverse=True):  # oldest first, in slot order
        replay.store(want["tags"][ages == age], want["rows"][ages == age])
        younger = ages[ages < age]
        for _ in range(age - (int(younger.max()) if younger.size else 0)):
            replay.advance()
    assert_same_state(restored, replay)
    assert resident(restored) == dict(
        zip(want["tags"].tolist(), want["ages"].tolist(), strict=True)
    )
    everything = np.arange(45)
    for _ in range(5):  # ages advance in step: lines expire in the same iteration
        assert_same_lookup(restored, replay, everything, "lookup")
        restored.advance()
        replay.advance()


def test_restore_refuses_malformed_state(new_cache: CacheFactory) -> None:
    cache = new_cache(4, 2, 1)
    good = {"tags": np.array([1, 2]), "ages": np.array([0, 1]), "rows": rows_for([1, 2], 2)}
    with pytest.raises(ValueError, match="ages"):
        cache.restore({**good, "ages": np.array([0, -1])})
    with pytest.raises(ValueError, match="ages"):
        cache.restore({**good, "ages": np.array([0])})
    with pytest.raises(ValueError, match="integers"):
        cache.restore({**good, "tags": np.array([1.0, 2.0])})
    cache.restore(good)
    assert resident(cache) == {1: 0, 2: 1} and cache.clock == 1
