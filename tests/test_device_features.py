"""The CUDA path's feature movement (distmb.cuda): zero-copy host rows, the device feature
cache (PreSC / degree / none) and Match-Reorder, against independent references (numpy
indexing, brute-force counts with Python sets, a brute-force greedy order).

Every test runs on CPU tensors in CI and on the GPU under ``pytest -m cuda``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from conftest import random_graph

from distmb.data.local import LocalGraph
from distmb.pipeline import BatchLoader
from distmb.pipeline.features import PartFeatures
from distmb.pipeline.features.device import DeviceFeatures, build_device_features
from distmb.pipeline.features.presample import presample_seed
from distmb.pipeline.features.reorder import (
    MatchReorder,
    greedy_order,
    loader_inputs,
    match_order,
    overlap_matrix,
    shared_with_previous,
)
from distmb.pipeline.features.zero_copy import (
    ROW_ALIGN_BYTES,
    HostRows,
    aligned_width,
    gather_sorted,
)
from distmb.pipeline.sample import NeighborSampler

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
DTYPES = [np.float32, np.float16, np.float64]
FANOUT = [3, 4]
BATCH = 40
SEED = 5


@pytest.fixture(scope="module")
def local() -> LocalGraph:
    return LocalGraph.from_graph(random_graph(n=500, m=3000, feat_dim=9, classes=3, seed=2))


def _make_sampler(local: LocalGraph):
    def make(seed: int) -> NeighborSampler:
        return NeighborSampler(
            local.indptr, local.indices, local.n_solid, local.n_local, FANOUT, seed
        )

    return make


def _degree(local: LocalGraph) -> np.ndarray:
    return np.diff(local.indptr)[: local.n_solid]


def _features(local: LocalGraph, device: str, cache_rows: int, policy: str, dtype, **kw):
    table = np.asarray(local.features[: local.n_solid]).astype(dtype)
    dim = table.shape[1]
    cache_mb = cache_rows * dim * np.dtype(dtype).itemsize / 2**20
    source = build_device_features(
        table,
        device,
        cache_mb,
        policy,
        degree=_degree(local),
        make_sampler=_make_sampler(local),
        train_idx=local.train_idx,
        batch_size=BATCH,
        presample_epochs=2,
        seed=SEED,
        **kw,
    )
    return table, source


def _training_batches(local: LocalGraph, epoch: int = 0) -> list[np.ndarray]:
    """Block 0's sources of an epoch of training batches (the training stream, seed SEED)."""
    sampler = _make_sampler(local)(SEED)
    order = np.random.default_rng([SEED, epoch]).permutation(local.train_idx)
    batches = np.array_split(order, -(-order.size // BATCH))
    return [sampler.sample(b, epoch, i)[0].src_ids.numpy() for i, b in enumerate(batches)]


# ---- zero-copy host rows ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("align", [True, False])
def test_host_rows_gather_equals_indexing(device, dtype, align):
    table = np.random.default_rng(1).standard_normal((37, 9)).astype(dtype)
    rows = HostRows(table, device, align_rows=align)
    itemsize = np.dtype(dtype).itemsize
    if align:
        assert rows.width * itemsize % ROW_ALIGN_BYTES == 0 and rows.width >= 9
        assert rows.view.stride(0) == rows.width
    else:
        assert rows.width == 9
    assert rows.row_bytes == 9 * itemsize
    ids = torch.tensor([36, 0, 5, 5, 12, 0], device=device)
    got = gather_sorted(rows, ids)
    assert got.device.type == device and got.dtype == rows.dtype
    np.testing.assert_array_equal(got.cpu().numpy(), table[ids.cpu().numpy()])
    sorted_ids = torch.tensor([1, 4, 30], device=device)
    np.testing.assert_array_equal(rows.gather(sorted_ids).cpu().numpy(), table[[1, 4, 30]])
    assert tuple(gather_sorted(rows, ids[:0]).shape) == (0, 9)
    rows.close()


@pytest.mark.cuda
def test_host_rows_on_cuda_are_pinned_host_memory_read_by_the_gpu():
    table = np.arange(64 * 10, dtype=np.float32).reshape(64, 10)
    rows = HostRows(table, "cuda")
    assert rows.host.device.type == "cpu" and rows.host.is_pinned()
    assert rows.view.device.type == "cuda"
    assert rows.view.data_ptr() == rows.host.data_ptr()  # an alias, not a copy
    rows.host[3, 2] = -1.0  # a host write is seen by the device: same memory
    assert float(rows.gather(torch.tensor([3], device="cuda"))[0, 2]) == -1.0
    rows.close()


def test_aligned_width():
    assert aligned_width(100, 4) == 128
    assert aligned_width(32, 4) == 32
    assert aligned_width(100, 2) == 128
    assert aligned_width(100, 8) == 112
    assert aligned_width(1, 4) == 32
    with pytest.raises(ValueError, match="multiple of the item size"):
        aligned_width(3, 3)


def test_host_rows_refuses_bad_tables():
    with pytest.raises(ValueError, match="2-D float16/32/64"):
        HostRows(np.zeros((3, 2), dtype=np.int64), "cpu")
    with pytest.raises(ValueError, match="2-D float16/32/64"):
        HostRows(np.zeros(3, dtype=np.float32), "cpu")


# ---- the device cache: rows --------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", ["presc", "degree", "none"])
@pytest.mark.parametrize("cache_rows", [0, 3, 120, 10**6])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_training_batches_equal_numpy_indexing(local, device, policy, cache_rows, dtype):
    # Every id shape against numpy is in test_feature_source_contract.py; here: capacities
    # from none to all, and the training stream's overlapping batches (Match's reuse).
    table, source = _features(local, device, cache_rows, policy, dtype, reuse_previous=True)
    n = table.shape[0]
    assert source.capacity == (0 if policy == "none" else min(cache_rows, n))
    for ids in _training_batches(local)[:3]:
        got = source.gather_device(torch.from_numpy(ids).to(device))
        assert got.dtype == torch.float32 and got.device.type == device
        np.testing.assert_array_equal(got.cpu().numpy(), table[ids].astype(np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_ids_are_checked(local, device):
    _, source = _features(local, device, 10, "degree", np.float32)
    with pytest.raises(IndexError, match=r"ids must be in \[0, "):
        source.gather_device(np.array([0, source.num_rows]))
    with pytest.raises(IndexError, match=r"ids must be in \[0, "):
        source.gather_device(torch.tensor([-1], device=device))
    with pytest.raises(ValueError, match="1-D integer"):
        source.gather_device(torch.tensor([0.5], device=device))
    table = np.zeros((10, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="must not repeat"):
        DeviceFeatures(table, device, 3, hot_ids=np.array([1, 2, 1]))
    with pytest.raises(ValueError, match="needs hot_ids"):
        DeviceFeatures(table, device, 3, policy="degree")
    with pytest.raises(ValueError, match="policy must be one of"):
        DeviceFeatures(table, device, 3, policy="lru")


# ---- the device cache: which rows, hit counts, bytes ---------------------------------------------
def _reference_presc_top(
    local: LocalGraph, k: int, epochs: int = 2, stream: int | None = None
) -> set[int]:
    """Top-k rows by visit count over ``epochs`` epochs of the stream ``stream`` (default:
    the pre-sampling stream), counted here with a Counter (ties: higher in-degree, then
    lower id)."""
    stream = presample_seed(SEED) if stream is None else stream
    sampler = _make_sampler(local)(stream)
    visits: Counter[int] = Counter()
    train = np.asarray(local.train_idx)
    num_batches = -(-train.size // BATCH)
    for epoch in range(epochs):
        order = train[np.random.default_rng([stream, epoch]).permutation(train.size)]
        for i, seeds in enumerate(np.array_split(order, num_batches)):
            for v in sampler.sample(seeds, epoch, i)[0].src_ids.tolist():
                if v < local.n_solid:
                    visits[v] += 1
    degree = _degree(local)
    ranked = sorted(range(local.n_solid), key=lambda v: (-visits[v], -degree[v], v))
    return set(ranked[:k])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", ["presc", "degree"])
def test_cached_set_and_hit_counts(local, device, policy):
    k = 60
    table, source = _features(local, device, k, policy, np.float32)
    cached = set(source.cached_ids().tolist())
    if policy == "presc":
        assert cached == _reference_presc_top(local, k)
    else:
        degree = _degree(local)
        assert cached == set(sorted(range(len(degree)), key=lambda v: (-degree[v], v))[:k])
    assert len(cached) == k and source.memory_bytes == k * 9 * 4 + table.shape[0] * 4
    for ids in _training_batches(local, epoch=1):
        before = source.counters()
        source.gather_device(ids)
        after = source.counters()
        hits = sum(int(v) in cached for v in ids)  # brute force, repeats counted
        distinct_misses = len({int(v) for v in ids} - cached)
        assert after["hits"] - before["hits"] == hits
        assert after["misses"] - before["misses"] == len(ids) - hits
        assert after["rows_loaded"] - before["rows_loaded"] == distinct_misses
        assert after["bytes_h2d"] - before["bytes_h2d"] == distinct_misses * 9 * 4
        assert after["rows_reused"] == 0  # reuse_previous off


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sync_free_gather_of_training_batches(local, device, dtype):
    """The sync-free back end (Triton; interpreted on CPU) through the BatchLoader's entry:
    rows equal numpy indexing, and the epoch's counters, read once at the end, equal the
    brute-force counts over the batches."""
    k = 60
    table, source = _features(local, device, k, "presc", dtype, backend="triton")
    cached = set(source.cached_ids().tolist())
    hits = lookups = distinct_misses = 0
    for ids in _training_batches(local, epoch=1):
        rows, buffer = source.gather_batch_rows(torch.from_numpy(ids).to(device), None)
        assert buffer is None and rows.device.type == device
        np.testing.assert_array_equal(rows.cpu().numpy(), table[ids].astype(np.float32))
        lookups += len(ids)
        hits += sum(int(v) in cached for v in ids)
        distinct_misses += len({int(v) for v in ids} - cached)
    itemsize = np.dtype(dtype).itemsize
    assert source.counters() == {
        "rows_served": lookups,
        "lookups": lookups,
        "hits": hits,
        "misses": lookups - hits,
        "rows_loaded": distinct_misses,
        "rows_reused": 0,
        "bytes_h2d": distinct_misses * 9 * itemsize,
    }


def test_presc_ranking_does_not_see_the_training_batches(local):
    """The PreSC set comes from the pre-sampling stream, not from the training stream: on
    this graph the two streams' top-k differ, and the cache holds the former's."""
    assert presample_seed(SEED) != SEED
    _, source = _features(local, "cpu", 60, "presc", np.float32)
    cached = set(source.cached_ids().tolist())
    assert cached == _reference_presc_top(local, 60)
    assert cached != _reference_presc_top(local, 60, stream=SEED)


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_table_moves_half_the_bytes(local, device):
    _, source = _features(local, device, 0, "none", np.float16)
    ids = _training_batches(local)[0]
    source.gather_device(ids)
    assert source.bytes_h2d == np.unique(ids).size * 9 * 2


# ---- Match: reuse of the previous batch's rows ---------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache_rows", [0, 50])
def test_match_reuses_exactly_the_shared_rows(local, device, cache_rows):
    batches = _training_batches(local)
    table, plain = _features(local, device, cache_rows, "degree", np.float32)
    _, match = _features(local, device, cache_rows, "degree", np.float32, reuse_previous=True)
    cached = set(plain.cached_ids().tolist())
    previous: set[int] | None = None
    for ids in batches:
        p0, m0 = plain.counters(), match.counters()
        np.testing.assert_array_equal(match.gather_device(ids).cpu().numpy(), table[ids])
        plain.gather_device(ids)
        p1, m1 = plain.counters(), match.counters()
        current = {int(v) for v in ids} - cached
        shared = len(current & previous) if previous is not None else 0
        assert m1["rows_reused"] - m0["rows_reused"] == shared
        assert p1["rows_loaded"] - p0["rows_loaded"] == len(current)
        assert m1["rows_loaded"] - m0["rows_loaded"] == len(current) - shared
        assert m1["hits"] - m0["hits"] == p1["hits"] - p0["hits"]
        previous = current
    saved = plain.bytes_h2d - match.bytes_h2d
    resident = np.zeros(table.shape[0], dtype=bool)
    resident[list(cached)] = True
    assert saved == sum(shared_with_previous(batches, resident)) * 9 * 4
    match.forget_previous()
    before = match.rows_reused
    match.gather_device(batches[0])
    assert match.rows_reused == before


# ---- Reorder -----------------------------------------------------------------------------------
def _greedy_reference(sets: list[np.ndarray], resident: set[int]) -> list[int]:
    """FastGL's Algorithm 1 by brute force on Python sets: first stays first, then the most
    shared rows with the last placed (ties: lowest position)."""
    s = [{int(v) for v in x} - resident for x in sets]
    order, left = [0], list(range(1, len(sets)))
    while left:
        best = max(left, key=lambda j: (len(s[order[-1]] & s[j]), -j))
        order.append(best)
        left.remove(best)
    return order


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trial", range(6))
def test_greedy_order_equals_brute_force(device, trial):
    rng = np.random.default_rng(trial)
    n, k = 60, int(rng.integers(1, 9))
    sets = [rng.integers(0, n, int(rng.integers(0, 40))) for _ in range(k)]
    resident_ids = set(rng.choice(n, 10 * (trial % 2), replace=False).tolist())
    resident = torch.zeros(n, dtype=torch.bool, device=device)
    resident[list(resident_ids)] = True
    m = overlap_matrix(sets, n, resident)
    for i in range(k):
        for j in range(k):
            si = {int(v) for v in sets[i]} - resident_ids
            sj = {int(v) for v in sets[j]} - resident_ids
            assert m[i, j] == len(si & sj)
    assert match_order(sets, n, resident) == _greedy_reference(sets, resident_ids)


def test_greedy_order_ties_and_edge_cases():
    assert greedy_order(np.zeros((0, 0), dtype=np.int64)) == []
    assert greedy_order(np.zeros((1, 1), dtype=np.int64)) == [0]
    assert greedy_order(np.zeros((4, 4), dtype=np.int64)) == [0, 1, 2, 3]  # ties: lowest
    # 0 shares most with 2, 2 with 3, 3 with 1.
    m = np.array([[9, 1, 5, 0], [1, 9, 0, 4], [5, 0, 9, 6], [0, 4, 6, 9]])
    assert greedy_order(m) == [0, 2, 3, 1]


def _loader(local: LocalGraph, reorder=None, superbatch: int = 4) -> BatchLoader:
    sampler = _make_sampler(local)(SEED)
    return BatchLoader(
        sampler,
        PartFeatures(local.features),
        local.labels,
        prefetch=0,
        superbatch=superbatch,
        reorder=reorder,
    )


def test_match_reorder_in_the_loader(local):
    order = np.random.default_rng([SEED, 0]).permutation(local.train_idx)
    batches = np.array_split(order, 10)
    plain = _loader(local)
    assert plain.plan(0, batches).order == list(range(10))  # option off: order unchanged
    loader = _loader(local)
    loader.reorder = MatchReorder(loader_inputs(loader), local.n_local)
    plan = loader.plan(0, batches)
    assert plan.order == loader.plan(0, batches).order  # deterministic
    assert sorted(plan.order) == list(range(10))
    for k, sb in enumerate(plan.superbatches()):  # permutes within superbatches of 4
        assert sorted(sb) == list(range(4 * k, min(4 * k + 4, 10)))
    inputs = [
        loader.gather_ids(loader.sampler.sample(b, 0, i)).numpy() for i, b in enumerate(batches)
    ]
    for sb_plain, sb in zip(
        plain.plan(0, batches).superbatches(), plan.superbatches(), strict=True
    ):
        ref = _greedy_reference([inputs[i] for i in sb_plain], set())
        assert sb == [sb_plain[p] for p in ref]
    got = {b.index: b for b in loader(plan)}  # same batches, another order
    want = {b.index: b for b in plain(plain.plan(0, batches))}
    for i in range(10):
        assert torch.equal(got[i].x, want[i].x)
        assert torch.equal(got[i].blocks[0].src_ids, want[i].blocks[0].src_ids)
