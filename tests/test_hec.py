"""HistoricalEmbeddingCache (C++ core) against a plain-Python reference model of the contract
(distmb/halo/hec/host.py module docstring), plus targeted tests of each rule."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from distmb import _C
from distmb.core.errors import InputError
from distmb.engine.checkpoint import load_cache_state, save_cache_state
from distmb.halo.hec.host import (
    COUNTER_KEYS,
    HEC_MISS,
    LIFESPAN_UNBOUNDED,
    HistoricalEmbeddingCache,
)

#: Tags, rows and searches per operation from which every parallel loop of the kernel uses
#: 2 threads (its grains are 4096 tags and 32768 floats per thread).
PARALLEL_TAGS = 2 * 4096
PARALLEL_DIM = 64


# -- reference model ----------------------------------------------------------------------
@dataclass
class _Line:
    written_at: int  # clock when stored
    order: int  # global store sequence number (ties between equal ages)
    row: np.ndarray


class ReferenceHEC:
    """The contract with a dict ``tag -> line``: no slots, no hashing, no linked lists.

    A line hits while ``clock - written_at <= lifespan``; a store of a new tag into a full
    cache replaces the line with the largest age, among equal ages the one stored first.
    """

    def __init__(self, capacity: int, dim: int, lifespan: int) -> None:
        self.capacity, self.dim, self.lifespan = capacity, dim, lifespan
        self.lines: dict[int, _Line] = {}
        self.clock = 0
        self._order = 0
        self.counters = dict.fromkeys(COUNTER_KEYS, 0)

    def age(self, tag: int) -> int:
        return self.clock - self.lines[tag].written_at

    def _live(self, tag: int) -> bool:
        return self.lifespan == LIFESPAN_UNBOUNDED or self.age(tag) <= self.lifespan

    def search(self, tags: np.ndarray) -> np.ndarray:
        """bool[n]: which tags hit."""
        hits = np.array([int(t) in self.lines and self._live(int(t)) for t in tags], dtype=bool)
        self.counters["lookups"] += len(tags)
        self.counters["hits"] += int(hits.sum())
        return hits

    def row(self, tag: int) -> np.ndarray:
        return self.lines[tag].row

    def store(self, tags: np.ndarray, rows: np.ndarray) -> None:
        for tag, row in zip(tags.tolist(), rows, strict=True):
            if tag not in self.lines and len(self.lines) >= self.capacity:
                victim = max(self.lines, key=lambda t: (self.age(t), -self.lines[t].order))
                key = "evictions" if self._live(victim) else "expired_replacements"
                self.counters[key] += 1
                del self.lines[victim]
            self.lines[tag] = _Line(self.clock, self._order, row.copy())
            self._order += 1
        self.counters["stores"] += len(tags)

    def advance(self) -> None:
        self.clock += 1

    def clear(self) -> None:
        self.lines.clear()

    def live(self) -> int:
        return sum(self._live(t) for t in self.lines)


def assert_same_state(hec: HistoricalEmbeddingCache, ref: ReferenceHEC) -> None:
    """Resident tags and their ages, rows of every line, sizes and counters agree."""
    tags, ages = hec.snapshot()
    assert len(set(tags.tolist())) == len(tags), "a tag occupies two lines"
    assert dict(zip(tags.tolist(), ages.tolist(), strict=True)) == {
        t: ref.age(t) for t in ref.lines
    }
    rows = hec.load(np.arange(len(tags))).numpy()  # every line, expired ones included
    for slot, tag in enumerate(tags.tolist()):
        np.testing.assert_array_equal(rows[slot], ref.row(tag))
    assert hec.occupied == len(ref.lines)
    assert len(hec) == ref.live()
    assert hec.clock == ref.clock


def assert_same_search(
    hec: HistoricalEmbeddingCache, ref: ReferenceHEC, queries: np.ndarray, use_lookup: bool
) -> None:
    expected = ref.search(queries)
    if use_lookup:
        mask, rows = hec.lookup(queries)
        assert mask.dtype == torch.bool and rows.dtype == torch.float32
        np.testing.assert_array_equal(mask.numpy(), expected)
        # lookup_into agrees: the same rows at the hit positions, zeros elsewhere.
        dense = torch.full((len(queries), hec.dim), float("nan"))
        np.testing.assert_array_equal(hec.lookup_into(queries, dense).numpy(), expected)
        np.testing.assert_array_equal(dense[mask].numpy(), rows.numpy())
        assert (dense[~mask] == 0).all()
        ref.search(queries)  # the reference counts the second lookup too
    else:
        slots = hec.search(queries)
        assert slots.dtype == np.int64
        np.testing.assert_array_equal(slots != HEC_MISS, expected)
        rows = hec.load(slots[slots != HEC_MISS])
    want = np.stack([ref.row(int(t)) for t in queries[expected]]) if expected.any() else None
    assert rows.shape == (int(expected.sum()), hec.dim)
    if want is not None:
        np.testing.assert_array_equal(rows.numpy(), want)
    assert hec.counters() == ref.counters


# -- randomised comparison with the reference ----------------------------------------------
def run_random_ops(
    capacity: int, dim: int, lifespan: int, seed: int, steps: int, check_every_step: bool = True
) -> tuple[HistoricalEmbeddingCache, ReferenceHEC]:
    rng = np.random.default_rng(seed)
    hec = HistoricalEmbeddingCache(capacity, dim, lifespan)
    ref = ReferenceHEC(capacity, dim, lifespan)
    universe = 3 * capacity + 2  # tags overlap between stores; capacity is under pressure
    for _ in range(steps):
        op = rng.choice(
            ["store", "search", "lookup", "advance", "rare"], p=[0.4, 0.2, 0.2, 0.18, 0.02]
        )
        if op == "store":
            m = int(rng.integers(0, 2 * capacity + 2))
            tags = rng.integers(0, universe, m)  # with repeats inside one call
            rows = rng.standard_normal((m, dim)).astype(np.float32)
            hec.store(tags, rows)
            ref.store(tags, rows)
        elif op in ("search", "lookup"):
            queries = rng.integers(0, universe + 5, int(rng.integers(0, 2 * capacity + 2)))
            assert_same_search(hec, ref, queries, use_lookup=op == "lookup")
        elif op == "advance":
            for _ in range(int(rng.integers(1, 3))):
                hec.advance()
                ref.advance()
        elif rng.random() < 0.5:
            hec.clear()
            ref.clear()
        else:
            hec.reset_counters()
            ref.counters = dict.fromkeys(COUNTER_KEYS, 0)
        if check_every_step:
            assert_same_state(hec, ref)
            assert hec.counters() == ref.counters
    return hec, ref


@pytest.mark.parametrize("lifespan", [0, 1, 3, LIFESPAN_UNBOUNDED])
@pytest.mark.parametrize("capacity", [1, 5, 24])
def test_matches_reference_random_ops(capacity: int, lifespan: int) -> None:
    for seed in range(3):
        hec, ref = run_random_ops(capacity, 3, lifespan, seed=seed * 101 + capacity, steps=150)
        assert ref.counters["stores"] > 0 and ref.counters["lookups"] > 0


def test_random_ops_exercise_every_path() -> None:
    """The randomised comparison is not vacuous: hits, misses, evictions and expired
    replacements all happen."""
    _, ref = run_random_ops(8, 2, 1, seed=7, steps=300, check_every_step=False)
    c = ref.counters
    assert c["hits"] > 0 and c["lookups"] > c["hits"]
    assert c["evictions"] > 0 and c["expired_replacements"] > 0


# -- targeted rules ----------------------------------------------------------------------
def rows_for(tags: list[int], dim: int, salt: float = 0.0) -> np.ndarray:
    """Row i = tags[i] + salt + [0, 0.01, 0.02, ...]: distinct and recognisable."""
    return (np.asarray(tags, dtype=np.float32)[:, None] + salt) + np.arange(
        dim, dtype=np.float32
    ) * 0.01


def resident(hec: HistoricalEmbeddingCache) -> dict[int, int]:
    tags, ages = hec.snapshot()
    return dict(zip(tags.tolist(), ages.tolist(), strict=True))


def test_hit_after_store_miss_for_unknown() -> None:
    hec = HistoricalEmbeddingCache(4, 3, 2)
    hec.store(np.array([10, 20]), rows_for([10, 20], 3))
    slots = hec.search(np.array([20, 30, 10]))
    assert slots[1] == HEC_MISS and slots[0] != HEC_MISS and slots[2] != HEC_MISS
    np.testing.assert_array_equal(hec.load(slots[[0, 2]]).numpy(), rows_for([20, 10], 3))
    assert hec.counters() == {
        "lookups": 3,
        "hits": 2,
        "stores": 2,
        "evictions": 0,
        "expired_replacements": 0,
    }
    assert hec.hit_rate() == pytest.approx(2 / 3)
    assert len(hec) == 2 and hec.occupied == 2


def test_overwrite_by_tag_keeps_one_line_and_resets_age() -> None:
    hec = HistoricalEmbeddingCache(4, 2, 5)
    hec.store([7], rows_for([7], 2))
    hec.advance()
    hec.advance()
    assert resident(hec) == {7: 2}
    hec.store([7], rows_for([7], 2, salt=100.0))
    assert resident(hec) == {7: 0}
    mask, rows = hec.lookup([7])
    assert mask.tolist() == [True]
    np.testing.assert_array_equal(rows.numpy(), rows_for([7], 2, salt=100.0))
    assert hec.counters()["evictions"] == 0


@pytest.mark.parametrize("lifespan", [0, 1, 2, 5])
def test_expiry_boundary(lifespan: int) -> None:
    """A line hits while age <= lifespan and misses from age lifespan + 1 on."""
    hec = HistoricalEmbeddingCache(2, 1, lifespan)
    hec.store([3], rows_for([3], 1))
    for age in range(lifespan + 3):
        assert (hec.search([3])[0] != HEC_MISS) == (age <= lifespan), f"age {age}"
        assert len(hec) == (1 if age <= lifespan else 0)
        hec.advance()
    assert hec.occupied == 1  # expired, not removed


def test_unbounded_lifespan_never_expires() -> None:
    hec = HistoricalEmbeddingCache(2, 1, LIFESPAN_UNBOUNDED)
    hec.store([3], rows_for([3], 1))
    for _ in range(1000):
        hec.advance()
    assert hec.search([3])[0] != HEC_MISS
    assert hec.lifespan == LIFESPAN_UNBOUNDED and "unbounded" in repr(hec)


def test_expired_line_is_refreshed_by_its_tag() -> None:
    hec = HistoricalEmbeddingCache(2, 1, 1)
    hec.store([3, 4], rows_for([3, 4], 1))
    for _ in range(3):
        hec.advance()
    assert (hec.search([3, 4]) == HEC_MISS).all()
    hec.store([3], rows_for([3], 1, salt=0.5))
    assert resident(hec) == {3: 0, 4: 3}
    c = hec.counters()
    assert c["evictions"] == 0 and c["expired_replacements"] == 0
    hec.store([5], rows_for([5], 1))  # full: replaces the expired line of 4
    assert resident(hec) == {3: 0, 5: 0}
    assert hec.counters()["expired_replacements"] == 1


def test_oldest_first_eviction() -> None:
    hec = HistoricalEmbeddingCache(3, 2, LIFESPAN_UNBOUNDED)
    for tag in (1, 2, 3):
        hec.store([tag], rows_for([tag], 2))
        hec.advance()
    assert resident(hec) == {1: 3, 2: 2, 3: 1}
    hec.store([1], rows_for([1], 2))  # refresh: 2 becomes the oldest
    hec.store([4], rows_for([4], 2))
    assert resident(hec) == {1: 0, 3: 1, 4: 0}
    hec.store([5], rows_for([5], 2))  # oldest is 3
    assert set(resident(hec)) == {1, 4, 5}
    assert hec.counters()["evictions"] == 2
    # Equal ages: the line stored first goes first (1 was stored before 4, then 5).
    hec.store([6, 7], rows_for([6, 7], 2))
    assert set(resident(hec)) == {5, 6, 7}


def test_oldest_first_prefers_expired_lines_and_counts_them() -> None:
    hec = HistoricalEmbeddingCache(3, 1, 1)
    hec.store([1], rows_for([1], 1))
    hec.advance()
    hec.advance()  # 1 has age 2: expired
    hec.store([2, 3], rows_for([2, 3], 1))
    hec.store([4], rows_for([4], 1))
    assert set(resident(hec)) == {2, 3, 4}
    assert hec.counters()["expired_replacements"] == 1
    assert hec.counters()["evictions"] == 0
    hec.store([5], rows_for([5], 1))
    assert set(resident(hec)) == {3, 4, 5}
    assert hec.counters()["evictions"] == 1


def test_duplicate_tags_in_one_store_last_row_wins() -> None:
    hec = HistoricalEmbeddingCache(4, 2, 2)
    rows = rows_for([5, 6, 5, 5], 2, salt=0.0) + np.array([[0], [0], [10], [20]], np.float32)
    hec.store([5, 6, 5, 5], rows)
    assert resident(hec) == {5: 0, 6: 0}
    mask, got = hec.lookup([5, 6])
    np.testing.assert_array_equal(got.numpy(), rows[[3, 1]])
    assert hec.counters()["stores"] == 4


def test_store_larger_than_capacity_chains_evictions() -> None:
    """Rows are stored as if one at a time: later rows of a call evict earlier ones."""
    hec = HistoricalEmbeddingCache(2, 2, LIFESPAN_UNBOUNDED)
    hec.store([1, 2, 3], rows_for([1, 2, 3], 2))
    assert set(resident(hec)) == {2, 3}
    assert hec.counters()["evictions"] == 1
    hec.clear()
    cap1 = HistoricalEmbeddingCache(1, 2, LIFESPAN_UNBOUNDED)
    rows = rows_for([1, 2, 1], 2) + np.array([[0], [0], [7]], np.float32)
    cap1.store([1, 2, 1], rows)
    _, got = cap1.lookup([1])
    np.testing.assert_array_equal(got.numpy(), rows[[2]])
    assert cap1.counters()["evictions"] == 2


def test_clear_and_reset_counters() -> None:
    hec = HistoricalEmbeddingCache(3, 2, 1)
    hec.store([1, 2], rows_for([1, 2], 2))
    hec.advance()
    hec.search([1, 9])
    hec.clear()
    assert len(hec) == 0 and hec.occupied == 0 and hec.clock == 1
    assert hec, "an empty cache is still truthy"
    assert (hec.search([1, 2]) == HEC_MISS).all()
    assert hec.counters()["lookups"] == 4
    hec.reset_counters()
    assert hec.counters() == dict.fromkeys(COUNTER_KEYS, 0) and hec.hit_rate() == 0.0
    hec.store([4, 5, 6, 7], rows_for([4, 5, 6, 7], 2))  # free lines again after clear
    assert set(resident(hec)) == {5, 6, 7}


# -- inputs and outputs --------------------------------------------------------------------
def test_torch_inputs_and_zero_copy_load_into_a_slice() -> None:
    hec = HistoricalEmbeddingCache(8, 4, 2)
    tags = torch.tensor([3, 1, 2], dtype=torch.int32)
    rows = torch.from_numpy(rows_for([3, 1, 2], 4)).requires_grad_()
    hec.store(tags, rows)
    x = torch.zeros(5, 4)
    slots = hec.search(torch.tensor([2, 3]))
    out = hec.load(torch.from_numpy(slots), out=x[3:])
    assert out.data_ptr() == x[3:].data_ptr()
    np.testing.assert_array_equal(x[3:].numpy(), rows_for([2, 3], 4))
    assert (x[:3] == 0).all()
    y = torch.full((6, 4), -1.0)
    hit = hec.lookup_into(np.array([1, 99, 3]), y[3:])  # halo rows of a layer input
    assert hit.tolist() == [True, False, True]
    np.testing.assert_array_equal(y[[3, 5]].numpy(), rows_for([1, 3], 4))
    assert (y[4] == 0).all() and (y[:3] == -1).all()
    # A non-contiguous float32 array is accepted (copied).
    strided = np.asfortranarray(rows_for([8, 9], 4))
    hec.store(np.array([8, 9], dtype=np.uint8), strided)
    np.testing.assert_array_equal(hec.lookup([8, 9])[1].numpy(), rows_for([8, 9], 4))
    # Empty calls.
    hec.store(np.zeros(0, np.int64), np.zeros((0, 4), np.float32))
    assert hec.search(np.zeros(0, np.int64)).shape == (0,)
    mask, got = hec.lookup(np.zeros(0, np.int64))
    assert mask.shape == (0,) and got.shape == (0, 4)
    assert hec.load(np.zeros(0, np.int64)).shape == (0, 4)


def test_bad_inputs_raise_value_error() -> None:
    for args in [(0, 4, 1), (-1, 4, 1), (4, 0, 1), (4, 4, -2), (1.5, 4, 1), (True, 4, 1)]:
        with pytest.raises(ValueError):
            HistoricalEmbeddingCache(*args)
    with pytest.raises(ValueError, match="too large"):
        HistoricalEmbeddingCache(2**62, 2**10, 1)
    hec = HistoricalEmbeddingCache(4, 3, 1)
    hec.store([1, 2], rows_for([1, 2], 3))
    before = (resident(hec), hec.counters())
    bad_stores = [
        ([1, 2], rows_for([1, 2], 3).astype(np.float64)),  # dtype: no silent conversion
        ([1, 2], rows_for([1, 2], 4)),  # width
        ([1, 2, 3], rows_for([1, 2], 3)),  # count
        ([1], rows_for([1], 3)[0]),  # 1-D rows
        ([[1, 2]], rows_for([1, 2], 3)),  # 2-D tags
        (np.array([1.0, 2.0]), rows_for([1, 2], 3)),  # float tags
        ([5, -3], rows_for([5, 6], 3)),  # negative tag
        ([5], [[1.0, 2.0, 3.0]]),  # a list of floats is float64
    ]
    for tags, rows in bad_stores:
        with pytest.raises(ValueError):
            hec.store(np.asarray(tags), rows)
    assert (resident(hec), hec.counters()) == before, "a rejected store changed the cache"
    with pytest.raises(ValueError, match="VID_o"):
        hec.search([0, -1])
    with pytest.raises(ValueError, match="HEC_MISS"):
        hec.load([0, HEC_MISS])
    with pytest.raises(ValueError, match="not a line"):
        hec.load([2])  # only lines 0 and 1 are used
    with pytest.raises(ValueError):
        hec.load([0], out=torch.zeros(1, 4))
    with pytest.raises(ValueError):
        hec.load([0], out=torch.zeros(1, 3, dtype=torch.float64))
    with pytest.raises(ValueError):
        hec.load([0, 1], out=torch.zeros(3, 2).t())  # non-contiguous
    with pytest.raises(ValueError):
        hec.lookup_into([0, 1], torch.zeros(2, 4))
    with pytest.raises(ValueError):
        hec.lookup_into([0, 1], np.zeros((2, 3), np.float32))  # not a tensor
    # The raw binding refuses conversions too (a converted output copy would be lost).
    with pytest.raises(ValueError):
        hec._core.load(np.array([0]), np.zeros((1, 3), np.float64))
    with pytest.raises(ValueError):
        hec._core.store(np.array([0]), np.zeros((1, 3), np.float64))


# -- threads -------------------------------------------------------------------------------
def snapshot_everything(hec: HistoricalEmbeddingCache) -> tuple[np.ndarray, ...]:
    tags, ages = hec.snapshot()
    return tags, ages, hec.load(np.arange(len(tags))).numpy()


def run_big_sequence(threads: int) -> list[object]:
    """Stores and searches large enough for every parallel loop to split."""
    old = _C.get_num_threads()
    _C.set_num_threads(threads)
    try:
        rng = np.random.default_rng(5)
        hec = HistoricalEmbeddingCache(3 * PARALLEL_TAGS, PARALLEL_DIM, 2)
        results: list[object] = []
        for _ in range(6):
            tags = rng.integers(0, 8 * PARALLEL_TAGS, 2 * PARALLEL_TAGS)
            hec.store(tags, rng.standard_normal((len(tags), PARALLEL_DIM)).astype(np.float32))
            queries = rng.integers(0, 8 * PARALLEL_TAGS, 2 * PARALLEL_TAGS)
            results.append(hec.search(queries))
            mask, rows = hec.lookup(queries)
            dense = torch.empty(len(queries), PARALLEL_DIM)
            results += [mask.numpy(), rows.numpy(), hec.lookup_into(queries, dense).numpy()]
            results.append(dense.numpy())
            hec.advance()
        results += [*snapshot_everything(hec), hec.counters(), len(hec)]
        return results
    finally:
        _C.set_num_threads(old)


def test_thread_count_independence() -> None:
    one, two = run_big_sequence(1), run_big_sequence(2)
    assert len(one) == len(two)
    for a, b in zip(one, two, strict=True):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b


def test_big_sequence_matches_reference() -> None:
    """Calls large enough for every parallel loop to split, against the reference (whose
    victim search is O(capacity) per row, hence the small capacity)."""
    rng = np.random.default_rng(9)
    cap, dim, universe = 512, PARALLEL_DIM, 2000
    hec, ref = HistoricalEmbeddingCache(cap, dim, 1), ReferenceHEC(cap, dim, 1)
    for _ in range(4):
        tags = rng.integers(0, universe, 1100)  # 1100 * 64 floats: 2 threads copy
        rows = rng.standard_normal((len(tags), dim)).astype(np.float32)
        hec.store(tags, rows)
        ref.store(tags, rows)
        queries = rng.integers(0, universe, PARALLEL_TAGS)
        assert_same_search(hec, ref, queries, use_lookup=True)
        assert_same_search(hec, ref, queries, use_lookup=False)
        hec.advance()
        ref.advance()
    assert_same_state(hec, ref)
    assert ref.counters["evictions"] > 0


def test_concurrent_python_threads_are_serialised() -> None:
    """A storing thread and a looking-up thread: every hit returns a row stored for its tag."""
    dim, n_tags = 8, 4000
    hec = HistoricalEmbeddingCache(1000, dim, 3)
    table = rows_for(list(range(n_tags)), dim)  # the only row ever stored under each tag
    errors: list[BaseException] = []

    def writer() -> None:
        rng = np.random.default_rng(1)
        for _ in range(200):
            tags = rng.integers(0, n_tags, 500)
            hec.store(tags, table[tags])
            hec.advance()

    def reader() -> None:
        rng = np.random.default_rng(2)
        try:
            for _ in range(200):
                tags = rng.integers(0, n_tags, 500)
                mask, rows = hec.lookup(tags)
                np.testing.assert_array_equal(rows.numpy(), table[tags[mask.numpy()]])
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# -- memory ----------------------------------------------------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_large_cache_is_not_zero_filled() -> None:
    """cs = 1M lines of 256 floats is a 1 GiB buffer: only bookkeeping (~72 MB) is touched
    at creation, and storing rows backs only their pages."""
    before = rss_bytes()
    hec = HistoricalEmbeddingCache(1_000_000, 256, 2)
    created = rss_bytes() - before
    assert created < 200 * 2**20, f"creating the cache touched {created / 2**20:.0f} MiB"
    hec.store(np.arange(1000), np.ones((1000, 256), np.float32))
    assert len(hec) == 1000
    del hec


def test_state_and_restore_keep_valid_lines_with_their_ages(tmp_path: Path) -> None:
    """state() -> save -> load -> restore(): the restored cache answers every later lookup
    as the original does (same rows, same expiry), and expired lines are not saved."""
    rng = np.random.default_rng(5)
    original = HistoricalEmbeddingCache(64, 3, lifespan=2)
    for _ in range(6):  # lines of ages 0..5; only ages <= 2 are valid
        tags = rng.choice(200, size=10, replace=False)
        original.store(tags, rng.standard_normal((10, 3)).astype(np.float32))
        original.advance()
    state = original.state()
    assert state["ages"].max() <= 2 and len(state["tags"]) == len(original)
    save_cache_state(tmp_path, 7, 1, {f"layer1_{k}": v for k, v in state.items()})
    loaded = load_cache_state(tmp_path, 7, 1)
    assert loaded is not None
    restored = HistoricalEmbeddingCache(64, 3, lifespan=2)
    restored.restore({k.removeprefix("layer1_"): v for k, v in loaded.items()})
    everything = np.arange(200)
    for _ in range(4):  # ages advance in step: lines expire in the same iteration
        rows_a, hit_a = original.lookup(everything)
        rows_b, hit_b = restored.lookup(everything)
        assert torch.equal(hit_a, hit_b) and torch.equal(rows_a, rows_b)
        original.advance()
        restored.advance()
    assert load_cache_state(tmp_path, 6, 1) is None
    (tmp_path / "hec-epoch6-rank1.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="hec-epoch6-rank1.npz"):
        load_cache_state(tmp_path, 6, 1)
