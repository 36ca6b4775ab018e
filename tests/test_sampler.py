"""NeighborSampler (C++ kernel) against a brute-force Python reference on small graphs."""

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

from distmb import _C
from distmb.data import PartitionStore
from distmb.partition import partition_graph
from distmb.pipeline.sample import FANOUT_ALL, Block, NeighborSampler

#: Significance level of the uniformity tests (fixed seeds: a failure is reproducible).
P_MIN = 1e-3
#: Edges per layer from which every pass of the kernel uses 2 threads (its grains are
#: 16384 destinations / edges for passes 1-2 and 65536 edges for passes 3-5).
PARALLEL_EDGES = 65536


# -- graphs --------------------------------------------------------------------------------
class LocalGraph:
    """A part-like local CSR: solid rows ``[0, n_solid)``, sources in ``[0, n_local)``."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, n_solid: int, n_local: int):
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.indices = np.asarray(indices)
        self.n_solid = n_solid
        self.n_local = n_local

    def row(self, v: int) -> np.ndarray:
        return np.asarray(self.indices[self.indptr[v] : self.indptr[v + 1]], dtype=np.int64)

    def degree(self, v: int) -> int:
        return int(self.indptr[v + 1] - self.indptr[v])

    def sampler(self, fanouts: list[int], seed: int = 0) -> NeighborSampler:
        return NeighborSampler(self.indptr, self.indices, self.n_solid, self.n_local, fanouts, seed)


def random_local_graph(
    n_solid: int, n_halo: int, max_degree: int, seed: int, dtype: type = np.int64
) -> LocalGraph:
    """Rows of distinct random sources (no self-loops), degrees 0..max_degree plus a few hubs;
    about one source in ten is a halo vertex."""
    rng = np.random.default_rng(seed)
    n_local = n_solid + n_halo
    degrees = rng.integers(0, max_degree + 1, n_solid)
    degrees[rng.choice(n_solid, max(1, n_solid // 50), replace=False)] = min(
        n_local - 1, 4 * max_degree
    )
    rows = []
    for v, d in enumerate(degrees):
        halo = rng.random(d) < 0.1 if n_halo else np.zeros(d, dtype=bool)
        pool_solid = np.delete(np.arange(n_solid), v)
        n_h = min(int(halo.sum()), n_halo)
        src = np.concatenate(
            [
                rng.choice(pool_solid, d - n_h, replace=False),
                n_solid + rng.choice(n_halo, n_h, replace=False) if n_h else [],
            ]
        ).astype(np.int64)
        rows.append(rng.permutation(src))  # unsorted rows: order must come from the CSR
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    indices = np.concatenate(rows).astype(dtype) if rows else np.zeros(0, dtype)
    return LocalGraph(indptr, indices, n_solid, n_local)


def hand_graph() -> LocalGraph:
    """5 solid vertices, 2 halo vertices (5, 6); vertex 4 has no in-edges."""
    rows = {0: [1, 2, 5], 1: [0, 3, 6, 2], 2: [6], 3: [0, 1, 2, 4, 5], 4: []}
    indptr = np.cumsum([0] + [len(rows[v]) for v in range(5)])
    indices = np.concatenate([rows[v] for v in range(5)]).astype(np.int32)
    return LocalGraph(indptr, indices, 5, 7)


def star_graph(n_hubs: int, degree: int) -> LocalGraph:
    """``n_hubs`` hubs ``[0, n_hubs)``, each with the same ``degree`` leaf in-neighbours
    (``n_hubs + j``; the last two leaves are halo vertices). Leaves have no in-edges."""
    n_solid = n_hubs + degree - 2
    leaves = np.arange(n_hubs, n_hubs + degree)
    indptr = np.concatenate([np.arange(n_hubs + 1) * degree, np.full(degree - 2, n_hubs * degree)])
    indices = np.tile(leaves, n_hubs)
    return LocalGraph(indptr, indices, n_solid, n_hubs + degree)


# -- reference -----------------------------------------------------------------------------
def reference_relabel(
    graph: LocalGraph, dst: np.ndarray, neighbours: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, int]:
    """Brute force: (src_ids, indices, n_halo) of the block whose destination i takes the
    in-neighbours ``neighbours[i]`` (VID_p, in edge order)."""
    order = [int(v) for v in dst]
    seen = set(order)
    solid, halo = [], []
    for nbrs in neighbours:
        for u in nbrs.tolist():
            if u not in seen:
                seen.add(u)
                (solid if u < graph.n_solid else halo).append(u)
    src_ids = np.array(order + solid + halo, dtype=np.int64)
    pos = {u: i for i, u in enumerate(src_ids.tolist())}
    flat = [pos[u] for nbrs in neighbours for u in nbrs.tolist()]
    return src_ids, np.array(flat, dtype=np.int64), len(halo)


def reference_full(graph: LocalGraph, dst: np.ndarray) -> Block:
    """The exact FANOUT_ALL block, every row in CSR order."""
    neighbours = [graph.row(int(v)) for v in dst]
    src_ids, indices, n_halo = reference_relabel(graph, dst, neighbours)
    indptr = np.concatenate([[0], np.cumsum([len(n) for n in neighbours])]).astype(np.int64)
    return Block(
        len(dst),
        len(src_ids),
        n_halo,
        torch.from_numpy(indptr),
        torch.from_numpy(indices),
        torch.from_numpy(src_ids),
    )


def block_neighbours(block: Block) -> list[np.ndarray]:
    """VID_p of the sampled in-neighbours of every destination, in edge order."""
    ip, src = block.indptr.numpy(), block.src_ids.numpy()
    nbr = src[block.indices.numpy()]
    return [nbr[ip[i] : ip[i + 1]] for i in range(block.n_dst)]


def check_blocks(
    graph: LocalGraph, seeds: np.ndarray, fanouts: list[int], blocks: list[Block]
) -> None:
    """Every invariant of the sampling contract, against the graph and the reference."""
    assert len(blocks) == len(fanouts)
    np.testing.assert_array_equal(blocks[-1].dst_ids.numpy(), seeds)
    for layer, (block, fanout) in enumerate(zip(blocks, fanouts, strict=True)):
        for t in (block.indptr, block.indices, block.src_ids):
            assert t.dtype == torch.int64 and t.dim() == 1
        ip, src = block.indptr.numpy(), block.src_ids.numpy()
        assert ip.shape == (block.n_dst + 1,) and ip[0] == 0 and ip[-1] == block.num_edges
        assert np.all(np.diff(ip) >= 0)
        assert src.shape == (block.n_src,) and len(np.unique(src)) == block.n_src
        if block.num_edges:
            assert block.indices.min() >= 0 and block.indices.max() < block.n_src
        n_comp = block.n_computed
        assert np.all(src[:n_comp] < graph.n_solid), "a halo vertex is not flagged as halo"
        assert np.all(src[n_comp:] >= graph.n_solid), "a solid vertex is flagged as halo"
        assert np.all(src[n_comp:] < graph.n_local)
        dst = src[: block.n_dst]
        assert np.all(dst < graph.n_solid), "a halo vertex is a destination (expanded)"
        neighbours = block_neighbours(block)
        for v, nbrs in zip(dst.tolist(), neighbours, strict=True):
            row = graph.row(v)
            deg = len(row)
            want = deg if fanout == FANOUT_ALL else min(deg, fanout)
            assert len(nbrs) == want, f"layer {layer}: vertex {v} has {len(nbrs)} of {want}"
            assert len(set(nbrs.tolist())) == len(nbrs), f"vertex {v}: duplicate neighbour"
            position = {u: k for k, u in enumerate(row.tolist())}
            assert all(u in position for u in nbrs.tolist()), f"vertex {v}: not an in-edge"
            assert np.all(np.diff([position[u] for u in nbrs.tolist()]) > 0), "not CSR order"
        ref_src, ref_indices, ref_halo = reference_relabel(graph, dst, neighbours)
        np.testing.assert_array_equal(src, ref_src)
        np.testing.assert_array_equal(block.indices.numpy(), ref_indices)
        assert block.n_halo == ref_halo
        if layer > 0:
            below = blocks[layer - 1]
            assert below.n_dst == n_comp
            np.testing.assert_array_equal(below.dst_ids.numpy(), src[:n_comp])


def assert_same_blocks(a: list[Block], b: list[Block]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.n_dst, x.n_src, x.n_halo) == (y.n_dst, y.n_src, y.n_halo)
        for name in ("indptr", "indices", "src_ids"):
            assert torch.equal(getattr(x, name), getattr(y, name)), name


@pytest.fixture
def restore_threads():
    before = _C.get_num_threads()
    yield
    _C.set_num_threads(before)


# -- structure -----------------------------------------------------------------------------
def test_hand_graph_full_block_matches_hand_computed() -> None:
    g = hand_graph()
    block = g.sampler([FANOUT_ALL]).full_block(np.array([3, 2]))
    # dst 3 <- 0 1 2 4 5, dst 2 <- 6: new solid 0 1 4 (2 is a destination), then halo 5 6.
    assert block.src_ids.tolist() == [3, 2, 0, 1, 4, 5, 6]
    assert block.indptr.tolist() == [0, 5, 6]
    assert block.indices.tolist() == [2, 3, 1, 4, 5, 6]
    assert (block.n_dst, block.n_src, block.n_halo, block.n_computed) == (2, 7, 2, 5)


@pytest.mark.parametrize("fanouts", [[2, 2], [1, 3, 2], [FANOUT_ALL, 2], [3, FANOUT_ALL]])
def test_hand_graph_invariants(fanouts: list[int]) -> None:
    g = hand_graph()
    sampler = g.sampler(fanouts, seed=5)
    for it in range(20):
        seeds = np.array([1, 4, 3]) if it % 2 else np.array([0])
        check_blocks(g, seeds, fanouts, sampler.sample(seeds, epoch=0, iteration=it))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_random_graph_invariants(dtype: type) -> None:
    g = random_local_graph(300, 40, 12, seed=1, dtype=dtype)
    fanouts = [4, 3, 6]
    sampler = g.sampler(fanouts, seed=11)
    rng = np.random.default_rng(2)
    for it in range(10):
        seeds = rng.choice(g.n_solid, 25, replace=False)  # unsorted seeds keep their order
        check_blocks(g, seeds, fanouts, sampler.sample(seeds, epoch=1, iteration=it))


def test_fanout_all_equals_reference() -> None:
    g = random_local_graph(200, 30, 10, seed=3)
    sampler = g.sampler([FANOUT_ALL, FANOUT_ALL], seed=0)
    seeds = np.array([5, 17, 0, 199, 42])
    blocks = sampler.sample(seeds, 0, 0)
    check_blocks(g, seeds, [FANOUT_ALL, FANOUT_ALL], blocks)
    assert_same_blocks([blocks[1]], [reference_full(g, seeds)])
    assert_same_blocks([blocks[0]], [reference_full(g, blocks[1].src_ids[: blocks[1].n_computed])])
    # A fan-out at least the maximum degree also takes every neighbour.
    big = int(np.diff(g.indptr).max())
    assert_same_blocks(g.sampler([big, big]).sample(seeds, 3, 4), blocks)


def test_full_block_batches_cover_the_graph() -> None:
    g = random_local_graph(150, 20, 8, seed=4)
    sampler = g.sampler([2])
    for lo in range(0, g.n_solid, 64):
        dst = np.arange(lo, min(lo + 64, g.n_solid))
        assert_same_blocks([sampler.full_block(torch.from_numpy(dst))], [reference_full(g, dst)])


def test_halo_vertices_are_leaves() -> None:
    # Every in-neighbour of the seed is halo: no block below the seed's expands them.
    g = LocalGraph(np.array([0, 3, 4]), np.array([2, 3, 4, 0]), 2, 5)
    blocks = g.sampler([FANOUT_ALL] * 3).sample(np.array([0]), 0, 0)
    for b in blocks:
        assert b.dst_ids.tolist() == [0] and b.src_ids.tolist() == [0, 2, 3, 4]
        assert b.n_halo == 3 and b.num_edges == 3


def test_empty_and_isolated_seeds() -> None:
    g = hand_graph()
    blocks = g.sampler([3, 3]).sample(np.zeros(0, dtype=np.int64), 0, 0)
    assert all(b.n_dst == 0 and b.n_src == 0 and b.num_edges == 0 for b in blocks)
    blocks = g.sampler([3, 3]).sample(np.array([4]), 0, 0)  # no in-edges
    assert all(b.src_ids.tolist() == [4] and b.indptr.tolist() == [0, 0] for b in blocks)


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
#: Seeds every sampler refuses on :func:`hand_graph` (halo vertex 5), and the message's text.
BAD_SEEDS = [
    ([5], "is a halo vertex"),
    ([0, 7], "outside the solid range"),
    ([-1], "outside the solid range"),
    ([1, 2, 1], "must be distinct; VID_p 1"),
    ([[0, 1]], "must be 1-D"),
    ([0.5], "must hold integers"),
]


@pytest.mark.parametrize(("seeds", "message"), BAD_SEEDS)
def test_bad_seeds(seeds: list, message: str) -> None:
    g = hand_graph()
    sampler = g.sampler([2, 2], seed=0)
    before = sampler.sample(np.array([0, 3]), 0, 0)
    with pytest.raises(ValueError, match=message):
        sampler.sample(np.array(seeds), 0, 0)
    # The failed call left the scratch table clean: the same call gives the same blocks.
    assert_same_blocks(sampler.sample(np.array([0, 3]), 0, 0), before)


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
