"""NeighborSampler (C++ kernel): what only it has (thread counts, memory-mapped partitions,
concurrent Python callers, its sampling distribution, its argument checks). The block contract
it shares with the device sampler is checked in ``test_sampler_contract.py``."""

from __future__ import annotations

import math
import threading
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_graph
from test_sampler_contract import (
    LocalGraph,
    assert_same_blocks,
    block_neighbours,
    check_blocks,
    hand_graph,
    random_local_graph,
    star_graph,
)

from distmb import _C
from distmb.data import PartitionStore
from distmb.partition import partition_graph
from distmb.pipeline.sample import FANOUT_ALL, Block, NeighborSampler

#: Significance level of the uniformity tests (fixed seeds: a failure is reproducible).
P_MIN = 1e-3
#: Edges per layer from which every pass of the kernel uses 2 threads (its grains are
#: 16384 destinations / edges for passes 1-2 and 65536 edges for passes 3-5).
PARALLEL_EDGES = 65536


@pytest.fixture
def restore_threads():
    before = _C.get_num_threads()
    yield
    _C.set_num_threads(before)


# -- structure -----------------------------------------------------------------------------
def test_partition_store_halo_and_mmap(tmp_path: Path) -> None:
    graph = random_graph(n=500, m=3000, seed=7)
    partition_graph(graph, 3, tmp_path / "p", seed=0)
    for part in range(3):
        store = PartitionStore(tmp_path / "p", part)
        assert isinstance(store.indices, np.memmap) and store.n_halo > 0
        g = LocalGraph(store.indptr, store.indices, store.n_solid, store.n_local)
        fanouts = [5, 5]
        sampler = g.sampler(fanouts, seed=part)
        seeds = np.asarray(store.train_idx)[:40]
        blocks = sampler.sample(seeds, epoch=2, iteration=3)
        check_blocks(g, seeds, fanouts, blocks)
        assert sum(b.n_halo for b in blocks) > 0
        in_memory = LocalGraph(
            np.array(store.indptr), np.array(store.indices), g.n_solid, g.n_local
        )
        assert_same_blocks(in_memory.sampler(fanouts, seed=part).sample(seeds, 2, 3), blocks)


# -- determinism ---------------------------------------------------------------------------
def test_deterministic_across_threads_and_calls(restore_threads) -> None:
    g = random_local_graph(20_000, 2_000, 30, seed=9, dtype=np.int32)
    fanouts = [10, 10]
    sampler = g.sampler(fanouts, seed=123)
    seeds = np.random.default_rng(0).choice(g.n_solid, 2_000, replace=False)
    _C.set_num_threads(1)
    one = sampler.sample(seeds, epoch=3, iteration=7)
    assert one[0].num_edges >= PARALLEL_EDGES, "graph too small to exercise the parallel paths"
    _C.set_num_threads(2)
    two = sampler.sample(seeds, epoch=3, iteration=7)
    assert_same_blocks(one, two)
    assert_same_blocks(one, sampler.sample(seeds, epoch=3, iteration=7))
    check_blocks(g, seeds, fanouts, two)
    fresh = g.sampler(fanouts, seed=123)  # a new sampler: nothing depends on past calls
    assert_same_blocks(one, fresh.sample(seeds, epoch=3, iteration=7))
    for other in (
        sampler.sample(seeds, epoch=3, iteration=8),
        sampler.sample(seeds, epoch=4, iteration=7),
        g.sampler(fanouts, seed=124).sample(seeds, epoch=3, iteration=7),
    ):
        assert not torch.equal(other[-1].indices, one[-1].indices)


def test_int32_and_int64_indices_agree() -> None:
    g64 = random_local_graph(400, 50, 15, seed=5, dtype=np.int64)
    g32 = LocalGraph(g64.indptr, g64.indices.astype(np.int32), g64.n_solid, g64.n_local)
    seeds = np.arange(0, 400, 7)
    a = g64.sampler([3, 5], seed=1).sample(seeds, 0, 9)
    b = g32.sampler([3, 5], seed=1).sample(seeds, 0, 9)
    assert_same_blocks(a, b)


def test_concurrent_python_threads_are_serialised() -> None:
    g = random_local_graph(3_000, 300, 20, seed=6)
    sampler = g.sampler([5, 5], seed=2)
    seeds = np.arange(0, 3_000, 3)
    expected = [sampler.sample(seeds, 0, it) for it in range(8)]
    results: dict[int, list[Block]] = {}

    def work(it: int) -> None:
        results[it] = sampler.sample(seeds, 0, it)

    threads = [threading.Thread(target=work, args=(it,)) for it in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for it in range(8):
        assert_same_blocks(results[it], expected[it])


# -- uniformity ----------------------------------------------------------------------------
def subset_counts(degree: int, fanout: int, n_hubs: int, calls: int) -> Counter:
    """How often each subset of leaf positions was drawn, over ``n_hubs * calls`` draws."""
    g = star_graph(n_hubs, degree)
    sampler = g.sampler([fanout], seed=99)
    hubs = np.arange(n_hubs)
    counts: Counter = Counter()
    for it in range(calls):
        (block,) = sampler.sample(hubs, epoch=0, iteration=it)
        leaves = block.src_ids[block.indices].numpy().reshape(n_hubs, fanout) - n_hubs
        counts.update(map(tuple, leaves.tolist()))
    return counts


@pytest.mark.parametrize(
    ("degree", "fanout"),
    [(8, 3), (6, 4), (7, 1)],  # Floyd's algorithm, selection sampling, a single draw
)
def test_subsets_are_uniform(degree: int, fanout: int) -> None:
    from scipy import stats

    n_subsets = math.comb(degree, fanout)
    counts = subset_counts(degree, fanout, n_hubs=2_000, calls=20)
    assert set(counts) == set(combinations(range(degree), fanout)), "a subset never drawn"
    observed = np.array([counts[s] for s in combinations(range(degree), fanout)])
    p = stats.chisquare(observed).pvalue
    assert p > P_MIN, f"C({degree},{fanout}) subsets not uniform: p = {p:.2e}"
    assert observed.sum() == 40_000 and n_subsets == len(observed)


@pytest.mark.parametrize(
    ("degree", "fanout"),
    [(20, 5), (20, 12), (300, 100), (3_000, 70)],  # Floyd, selection, selection (k > 64),
)  # Floyd with std::sort (k > 32)
def test_inclusion_is_uniform(degree: int, fanout: int) -> None:
    from scipy import stats

    n_hubs, calls = 1_000, 10 if degree < 1_000 else 4
    g = star_graph(n_hubs, degree)
    sampler = g.sampler([fanout], seed=3)
    inclusion = np.zeros(degree)
    for it in range(calls):
        (block,) = sampler.sample(np.arange(n_hubs), epoch=1, iteration=it)
        leaves = block.src_ids[block.indices].numpy() - n_hubs
        assert len(leaves) == n_hubs * fanout
        inclusion += np.bincount(leaves, minlength=degree)
    # Inclusion indicators of a uniform k-subset of d: mean p = k/d, covariance
    # p(1-p) d/(d-1) (I - 11^T/d), so this statistic is chi-square with d-1 dof.
    n, p = n_hubs * calls, fanout / degree
    stat = ((inclusion - n * p) ** 2).sum() / (n * p * (1 - p)) * (degree - 1) / degree
    pvalue = stats.chi2.sf(stat, degree - 1)
    assert pvalue > P_MIN, f"inclusion of {fanout} of {degree} not uniform: p = {pvalue:.2e}"


def test_layers_draw_independently() -> None:
    # Hub 0 is its own in-neighbour, so it is a destination of both layers: its two draws
    # must come from different streams (equal with probability 1 / C(40, 5) otherwise).
    indptr = np.concatenate([[0], np.full(40, 40)])
    g = LocalGraph(indptr, np.arange(40), 40, 40)
    sampler = g.sampler([5, 5], seed=1)
    differ = 0
    for it in range(30):
        below, top = sampler.sample(np.array([0]), 0, it)
        assert below.dst_ids[0] == 0
        differ += block_neighbours(below)[0].tolist() != block_neighbours(top)[0].tolist()
    assert differ >= 29


# -- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fanouts", "message"),
    [([], "at least one layer"), ([2, 0], "positive or FANOUT_ALL"), ([-2], "got \\[-2\\]")],
)
def test_bad_fanouts(fanouts: list[int], message: str) -> None:
    g = hand_graph()
    with pytest.raises(ValueError, match=message):
        g.sampler(fanouts)


def test_bad_fanouts_in_kernel() -> None:
    g = hand_graph()
    core = _C.NeighborSamplerCore(g.indptr, g.indices, g.n_solid, g.n_local)
    for fanouts, message in (([], "at least one layer"), ([3, 0], "fan-out 0 is invalid")):
        with pytest.raises(ValueError, match=message):
            core.sample(np.array([0]), np.array(fanouts, dtype=np.int64), 0, 0, 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda ip, ix: (ip, ix.astype(np.float64)), "indices must be int32 or int64"),
        (lambda ip, ix: (ip.astype(np.int32), ix), "indptr must be int64"),
        (lambda ip, ix: (ip[:-1], ix), "indptr has 5 entries, expected n_solid \\+ 1 = 6"),
        (lambda ip, ix: (ip, ix[:-1]), "must equal len\\(indices\\)"),
        (lambda ip, ix: (ip, np.where(ix == 6, 7, ix)), "is outside \\[0, n_local=7\\)"),
        (lambda ip, ix: (ip, np.where(ix == 6, -1, ix)), "is outside \\[0, n_local=7\\)"),
        (lambda ip, ix: (np.array([0, 3, 2, 8, 13, 13]), ix), "indptr decreases at row 1"),
    ],
)
def test_bad_graph(change, message: str) -> None:
    g = hand_graph()
    indptr, indices = change(g.indptr.copy(), g.indices.copy())
    with pytest.raises(ValueError, match=message):
        NeighborSampler(indptr, indices, g.n_solid, g.n_local, [2], 0)


def test_bad_counters() -> None:
    g = hand_graph()
    with pytest.raises(ValueError, match="seed must be in"):
        g.sampler([2], seed=-1)
    sampler = g.sampler([2])
    with pytest.raises(ValueError, match="iteration must be in"):
        sampler.sample(np.array([0]), 0, 2**64)
    with pytest.raises(ValueError, match="epoch must be an integer"):
        sampler.sample(np.array([0]), 1.5, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_solid <= n_local"):
        NeighborSampler(g.indptr, g.indices, 5, 4, [2], 0)


# -- Block.drop_sources --------------------------------------------------------------------
def test_drop_sources() -> None:
    g = hand_graph()
    block = g.sampler([FANOUT_ALL]).full_block(np.array([3, 1, 0]))
    keep = block.src_ids < g.n_solid  # drop the halo leaves, as on a cache miss
    dropped = block.drop_sources(keep)
    assert torch.equal(dropped.src_ids, block.src_ids)
    assert (dropped.n_dst, dropped.n_src, dropped.n_halo) == (3, block.n_src, block.n_halo)
    for v, before, after in zip(
        [3, 1, 0], block_neighbours(block), block_neighbours(dropped), strict=True
    ):
        assert after.tolist() == [u for u in before.tolist() if u < g.n_solid], v
    assert dropped.num_edges == int(dropped.indptr[-1])
    all_gone = block.drop_sources(torch.zeros(block.n_src, dtype=torch.bool))
    assert all_gone.num_edges == 0 and all_gone.indptr.tolist() == [0, 0, 0, 0]
