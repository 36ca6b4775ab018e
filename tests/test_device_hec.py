"""DeviceHistoricalCache (distmb.halo.hec.device) against the C++ HistoricalEmbeddingCache on random
operation traces (equal slots, rows, ages, counters at every step), against the plain-Python
reference model of tests/test_hec.py, and its own pieces against brute force. The traces run
on CPU tensors here and on a GPU under ``pytest -m cuda``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import SMALL
from test_distributed import SCRIPTS, mpirun
from test_hec import ReferenceHEC, rows_for

from distmb.data import load_dataset
from distmb.halo.hec.device import DeviceHistoricalCache, _first_reaching
from distmb.halo.hec.host import (
    COUNTER_KEYS,
    HEC_MISS,
    LIFESPAN_UNBOUNDED,
    HistoricalEmbeddingCache,
)
from distmb.partition import partition_graph

#: Devices every equality test runs on: the CPU always, a GPU under ``pytest -m cuda``.
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]
LIFESPANS = [0, 1, 3, LIFESPAN_UNBOUNDED]


# -- helpers -----------------------------------------------------------------------------------
def host(t: torch.Tensor) -> np.ndarray:
    return t.cpu().numpy()


def assert_twins(cpp: HistoricalEmbeddingCache, dev: DeviceHistoricalCache) -> None:
    """Every line (tag, age, row bits) by slot, sizes, clock and counters agree."""
    tags_c, ages_c = cpp.snapshot()
    tags_d, ages_d = dev.snapshot()
    np.testing.assert_array_equal(tags_d, tags_c)
    np.testing.assert_array_equal(ages_d, ages_c)
    if tags_c.size:
        every = np.arange(tags_c.size)
        rows_c = cpp.load(every).numpy()
        rows_d = host(dev.load(every))
        np.testing.assert_array_equal(rows_d.view(np.int32), rows_c.view(np.int32))
    assert dev.occupied == cpp.occupied
    assert len(dev) == len(cpp)
    assert dev.clock == cpp.clock
    assert dev.counters() == cpp.counters()


def twin_search(
    cpp: HistoricalEmbeddingCache, dev: DeviceHistoricalCache, queries: np.ndarray, how: str
) -> None:
    """One lookup through both caches, by ``how``: search+load, lookup, or lookup_into."""
    if how == "search":
        slots_c = cpp.search(queries)
        slots_d = dev.search(torch.from_numpy(queries))
        np.testing.assert_array_equal(host(slots_d), slots_c)
        hits = slots_c[slots_c != HEC_MISS]
        np.testing.assert_array_equal(host(dev.load(hits)), cpp.load(hits).numpy())
    elif how == "lookup":
        hit_c, rows_c = cpp.lookup(queries)
        hit_d, rows_d = dev.lookup(queries)
        np.testing.assert_array_equal(host(hit_d), hit_c.numpy())
        np.testing.assert_array_equal(host(rows_d), rows_c.numpy())
    else:
        out_c = torch.full((queries.size, cpp.dim), float("nan"))
        out_d = torch.full((queries.size, dev.dim), float("nan"), device=dev.device)
        hit_c = cpp.lookup_into(queries, out_c)
        hit_d = dev.lookup_into(queries, out_d)
        np.testing.assert_array_equal(host(hit_d), hit_c.numpy())
        np.testing.assert_array_equal(host(out_d).view(np.int32), out_c.numpy().view(np.int32))


def run_twins(
    device: str,
    capacity: int,
    lifespan: int,
    seed: int,
    steps: int,
    universe: int,
    max_rows: int,
    dim: int = 3,
) -> tuple[HistoricalEmbeddingCache, DeviceHistoricalCache]:
    """A random trace of stores (repeated tags within a call), searches, lookups, advances,
    clears and counter resets through both caches, compared after every operation."""
    rng = np.random.default_rng(seed)
    cpp = HistoricalEmbeddingCache(capacity, dim, lifespan)
    dev = DeviceHistoricalCache(capacity, dim, lifespan, device=device)
    for _ in range(steps):
        op = rng.choice(["store", "search", "advance", "rare"], p=[0.45, 0.3, 0.22, 0.03])
        if op == "store":
            m = int(rng.integers(0, max_rows + 1))
            tags = rng.integers(0, universe, m)
            rows = rng.standard_normal((m, dim)).astype(np.float32)
            cpp.store(tags, rows)
            if rng.random() < 0.5:
                dev.store(tags, rows)
            else:  # tensors, already on the device, int32 tags
                dev.store(torch.from_numpy(tags.astype(np.int32)).to(device),
                          torch.from_numpy(rows).to(device))  # fmt: skip
        elif op == "search":
            queries = rng.integers(0, universe + 3, int(rng.integers(0, 2 * capacity + 3)))
            twin_search(cpp, dev, queries, str(rng.choice(["search", "lookup", "into"])))
        elif op == "advance":
            for _ in range(int(rng.integers(1, 3))):
                cpp.advance()
                dev.advance()
        elif rng.random() < 0.5:
            cpp.clear()
            dev.clear()
        else:
            cpp.reset_counters()
            dev.reset_counters()
        assert_twins(cpp, dev)
    return cpp, dev


# -- equality with the C++ cache ------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lifespan", LIFESPANS)
@pytest.mark.parametrize(
    ("capacity", "universe", "max_rows"),
    [
        (1, 6, 5),  # every store of two tags evicts within the call
        (3, 12, 10),  # batches larger than the cache: lines written and replaced in one call
        (8, 30, 6),  # batches smaller than a full cache: old lines refreshed or replaced
        (40, 120, 30),
        (64, 40, 50),  # larger than the id space: nothing is ever evicted
    ],
)
def test_equals_cpp_on_random_traces(
    device: str, capacity: int, lifespan: int, universe: int, max_rows: int
) -> None:
    for seed in range(3):
        run_twins(device, capacity, lifespan, seed * 31 + capacity, 60, universe, max_rows)


@pytest.mark.parametrize("device", DEVICES)
def test_traces_exercise_every_path(device: str) -> None:
    """The trace comparison is not vacuous: hits, misses, evictions, expired replacements and
    repeated tags within one store all happen."""
    cpp, _ = run_twins(device, 8, 1, seed=3, steps=200, universe=30, max_rows=12)
    c = cpp.counters()
    assert 0 < c["hits"] < c["lookups"]
    assert c["evictions"] > 0 and c["expired_replacements"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_equals_cpp_full_cache_small_batches(device: str) -> None:
    """A full cache much larger than each store: the store only looks at its oldest lines,
    while refreshing newer ones anywhere in the write order."""
    rng = np.random.default_rng(11)
    cap, dim = 300, 2
    cpp = HistoricalEmbeddingCache(cap, dim, 5)
    dev = DeviceHistoricalCache(cap, dim, 5, device=device)
    fill = rng.permutation(420)[:cap]
    fill_rows = rng.standard_normal((cap, dim)).astype(np.float32)
    for part in np.array_split(np.arange(cap), 4):  # four ages
        cpp.store(fill[part], fill_rows[part])
        dev.store(fill[part], fill_rows[part])
        cpp.advance()
        dev.advance()
    for step in range(60):
        m = int(rng.integers(1, 12))
        tags = rng.integers(0, 420, m)
        rows = rng.standard_normal((m, dim)).astype(np.float32)
        cpp.store(tags, rows)
        dev.store(tags, rows)
        if step % 3 == 0:
            cpp.advance()
            dev.advance()
        assert_twins(cpp, dev)
    c = cpp.counters()
    assert c["evictions"] > 0 and c["expired_replacements"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_equals_cpp_large_calls(device: str) -> None:
    """Stores of thousands of rows with many repeats, into caches smaller and larger than a
    call."""
    rng = np.random.default_rng(5)
    for cap in (700, 5000):
        cpp = HistoricalEmbeddingCache(cap, 16, 1)
        dev = DeviceHistoricalCache(cap, 16, 1, device=device)
        for _ in range(5):
            tags = rng.integers(0, 6000, 3000)
            rows = rng.standard_normal((tags.size, 16)).astype(np.float32)
            cpp.store(tags, rows)
            dev.store(tags, rows)
            twin_search(cpp, dev, rng.integers(0, 6000, 4000), "into")
            cpp.advance()
            dev.advance()
            assert_twins(cpp, dev)


# -- the contract, against the reference model -------------------------------------------
def test_matches_reference_model() -> None:
    """Contents, ages, rows, hits and counters of the reference model of tests/test_hec.py
    (a dict of lines; independent of both caches) on random traces."""
    for cap, lifespan in [(1, 0), (4, 1), (9, LIFESPAN_UNBOUNDED), (9, 2)]:
        rng = np.random.default_rng(cap + 7 * lifespan)
        dev, ref = DeviceHistoricalCache(cap, 2, lifespan), ReferenceHEC(cap, 2, lifespan)
        for _ in range(80):
            tags = rng.integers(0, 3 * cap + 2, int(rng.integers(0, 2 * cap + 2)))
            rows = rng.standard_normal((tags.size, 2)).astype(np.float32)
            dev.store(tags, rows)
            ref.store(tags, rows)
            queries = rng.integers(0, 3 * cap + 4, 10)
            hit = host(dev.search(queries)) != HEC_MISS
            np.testing.assert_array_equal(hit, ref.search(queries))
            if rng.random() < 0.5:
                dev.advance()
                ref.advance()
            tags_d, ages_d = dev.snapshot()
            assert dict(zip(tags_d.tolist(), ages_d.tolist(), strict=True)) == {
                t: ref.age(t) for t in ref.lines
            }
            rows_d = host(dev.load(np.arange(tags_d.size)))
            for slot, tag in enumerate(tags_d.tolist()):
                np.testing.assert_array_equal(rows_d[slot], ref.row(tag))
            assert dev.counters() == ref.counters
            assert len(dev) == ref.live()


def test_hand_trace_oldest_first_and_last_row_wins() -> None:
    """The documented rules on a trace worked out by hand."""
    dev = DeviceHistoricalCache(3, 2, 1)
    dev.store([10, 20, 30], rows_for([10, 20, 30], 2))  # slots 0, 1, 2
    dev.advance()
    dev.store([20], rows_for([20], 2, salt=0.5))  # refresh: 20 is now the newest
    dev.store([40], rows_for([40], 2))  # replaces 10, the oldest (age 1, live: an eviction)
    assert host(dev.search([10, 20, 30, 40])).tolist() == [HEC_MISS, 1, 2, 0]
    np.testing.assert_array_equal(host(dev.load([1])), rows_for([20], 2, salt=0.5))
    dev.advance()
    dev.advance()  # 30 has age 3 > lifespan: expired, and the oldest
    dev.store([50, 50, 60], rows_for([50, 51, 60], 2))  # 50 takes 30's line, keeps row 51
    assert host(dev.search([30, 50, 60])).tolist() == [HEC_MISS, 2, 1]
    np.testing.assert_array_equal(host(dev.load([2])), rows_for([51], 2))
    # 40 evicted 10 (age 1, live); 50 and 60 replaced 30 and 20 (ages 3 and 2, expired).
    assert dev.counters() == dict(zip(COUNTER_KEYS, [7, 5, 8, 1, 2], strict=True))
    tags, ages = dev.snapshot()
    assert tags.tolist() == [40, 60, 50] and ages.tolist() == [2, 0, 0]


def test_repeated_tag_replaced_within_one_call() -> None:
    """Capacity 1: each new tag of a call replaces the previous row's line, so a tag that
    comes back later in the call is stored again (the C++ chain of decisions)."""
    cpp, dev = HistoricalEmbeddingCache(1, 1, 0), DeviceHistoricalCache(1, 1, 0)
    tags = np.array([1, 2, 1, 3, 3, 1])
    rows = np.arange(6, dtype=np.float32)[:, None]
    cpp.store(tags, rows)
    dev.store(tags, rows)
    assert_twins(cpp, dev)
    assert dev.snapshot()[0].tolist() == [1]
    assert host(dev.load([0])).tolist() == [[5.0]]
    assert dev.counters()["evictions"] == 4


# -- checkpoints --------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_state_and_restore_interchange_with_cpp(device: str) -> None:
    cpp, dev = run_twins(device, 12, 3, seed=2, steps=50, universe=40, max_rows=10)
    state_c, state_d = cpp.state(), dev.state()
    assert state_c.keys() == state_d.keys()
    for key in state_c:
        np.testing.assert_array_equal(state_d[key], state_c[key])
    assert dev.counters() == cpp.counters()  # both count the state's row reads
    # A C++ state restored into a fresh device cache, its own state into another, and the
    # same state into a fresh C++ cache: three equal caches.
    cpp2 = HistoricalEmbeddingCache(12, 3, 3)
    dev_from_cpp = DeviceHistoricalCache(12, 3, 3, device=device)
    dev_from_dev = DeviceHistoricalCache(12, 3, 3, device=device)
    cpp2.restore(state_c)
    dev_from_cpp.restore(state_c)
    dev_from_dev.restore(state_d)
    assert_twins(cpp2, dev_from_cpp)
    assert_twins(cpp2, dev_from_dev)
    assert state_c["tags"].size > 0


# -- inputs ------------------------------------------------------------------------------------
def test_bad_input_is_refused_and_leaves_the_cache_unchanged() -> None:
    dev = DeviceHistoricalCache(4, 3, 1)
    dev.store([1, 2], rows_for([1, 2], 3))
    before = dev.state()
    with pytest.raises(ValueError, match=r"tags\[1\] = -5"):
        dev.store([3, -5], rows_for([3, 4], 3))
    with pytest.raises(ValueError, match="float32"):
        dev.store([3], np.zeros((1, 3)))
    with pytest.raises(ValueError, match="shape"):
        dev.store([3], np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="must match"):
        dev.store([3, 4], np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="integers"):
        dev.search(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="HEC_MISS"):
        dev.load([HEC_MISS])
    with pytest.raises(ValueError, match="not a line"):
        dev.load([3])
    with pytest.raises(ValueError, match="expected"):
        dev.lookup_into([1], torch.zeros(2, 3))
    for args in [(0, 3, 1), (4, 0, 1), (4, 3, -2), (2**62, 2**10, 1), (4.0, 3, 1)]:
        with pytest.raises(ValueError):
            DeviceHistoricalCache(*args)
    after = dev.state()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])


# -- pieces ---------------------------------------------------------------------------------------
def test_first_reaching_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 33, 100):
        never = n
        prev = rng.integers(-1, n + 1, n)
        prev[rng.random(n) < 0.2] = never
        target = rng.integers(0, n + 2, n)
        got = _first_reaching(torch.from_numpy(prev), torch.from_numpy(target), never).numpy()
        for a in range(n):
            counts = np.cumsum(prev <= a)
            reached = np.flatnonzero(counts >= target[a])
            if reached.size:
                assert got[a] == reached[0], (n, a)
            else:
                assert got[a] >= n, (n, a)


@pytest.mark.cuda
def test_hot_path_never_synchronises_on_cuda() -> None:
    """With checked=False, search, lookup_into, store and advance queue device work only."""
    dev = DeviceHistoricalCache(1000, 8, 2, device="cuda", checked=False)
    tags = torch.randint(0, 3000, (2000,), device="cuda")
    rows = torch.randn(2000, 8, device="cuda")
    out = torch.empty(2000, 8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            dev.store(tags, rows)
            dev.search(tags)
            dev.lookup_into(tags, out)
            dev.advance()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert dev.counters()["lookups"] == 3 * 2 * 2000


# -- the halo scheme -----------------------------------------------------------------------------
def test_halo_scheme_with_device_cache_trains_identically(tmp_path) -> None:
    """2 ranks under mpiexec: HistoricalCache(cache_device="cpu") and the C++ caches give the
    same records, halo loads and cache states (tests/mpi_scripts/device_hec_twin.py)."""
    parts = tmp_path / "p2"
    partition_graph(load_dataset(SMALL), 2, parts, seed=0)
    proc = mpirun(2, [str(SCRIPTS / "device_hec_twin.py"), str(parts), "2", "cpu"], 240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loads equal" in proc.stdout


def test_incremental_index_equals_a_fresh_sort() -> None:
    """After every store, the merged ``tag -> slot`` index is the index sorted from scratch."""
    rng = np.random.default_rng(4)
    for cap, universe in [(1, 4), (6, 20), (50, 60), (50, 400)]:
        dev = DeviceHistoricalCache(cap, 1, 1)
        for _ in range(40):
            tags = rng.integers(0, universe, int(rng.integers(0, 2 * cap + 3)))
            dev.store(tags, np.zeros((tags.size, 1), np.float32))
            keys, slots = dev._sorted_index()
            np.testing.assert_array_equal(host(dev._keys), host(keys))
            np.testing.assert_array_equal(host(dev._slots), host(slots))
            if rng.random() < 0.1:
                dev.clear()
