"""DeviceNeighborSampler: what only it has (power-law hubs at scale, graph placements, its
per-batch generator seed, its sampling distribution, its argument checks, the BatchLoader on
its device blocks), on CPU tensors here and on CUDA under ``pytest -m cuda``.

The block contract it shares with the C++ sampler is checked in ``test_sampler_contract.py``;
the distribution is tested by chi-square statistics that a biased sampler cannot pass, and
against the C++ sampler on the same graph, for the torch layer kernel and, on CUDA, the
one-launch Triton kernel (``choose="triton"``, whose batches are sampled with one host read,
``test_sampler_one_read.py``), which is also compared there with the numpy reference of
``test_choose_triton.py`` (under the interpreter on the CPU).
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import combinations

import numpy as np
import pytest
import torch
from test_sampler import P_MIN
from test_sampler_contract import (
    Implementation,
    LocalGraph,
    assert_same_blocks,
    block_neighbours,
    check_blocks,
    hand_graph,
    on_cpu,
    random_local_graph,
    star_graph,
)

from distmb.data.datasets.synthetic import SyntheticConfig, generate
from distmb.pipeline.sample.device import DeviceNeighborSampler, batch_seed
from distmb.pipeline.sample.placement import mapped_view

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
#: (device, layer kernel) of the distribution tests: the Triton kernel on CUDA only (the
#: interpreter is too slow for their sample sizes; test_choose_triton.py tests it on CPU).
KERNELS = [
    pytest.param("cpu", "torch", id="cpu"),
    pytest.param("cuda", "torch", id="cuda", marks=pytest.mark.cuda),
    pytest.param("cuda", "triton", id="cuda-choose-triton", marks=pytest.mark.cuda),
]


def device_sampler(
    g: LocalGraph,
    fanouts: list[int],
    seed: int = 0,
    device: str = "cpu",
    backend: str = "torch",
    placement: str = "device",
    choose: str = "torch",
) -> DeviceNeighborSampler:
    if choose == "triton":
        backend = "triton"  # the one-launch layer with the Triton Fused-Map
    sampler = Implementation(backend, placement, device, choose).make(g, fanouts, seed)
    assert isinstance(sampler, DeviceNeighborSampler)
    return sampler


def power_law_graph(nodes: int, avg_degree: float, seed: int, halo_fraction: float = 0.1):
    """A synthetic power-law graph (uncapped hubs) as a part: the last ``halo_fraction`` of
    the vertices are halo leaves (no rows)."""
    graph = generate(SyntheticConfig(nodes=nodes, avg_degree=avg_degree, hub_cap=0.0,
                                     feat_dim=1, classes=2, seed=seed))  # fmt: skip
    n_solid = int(nodes * (1 - halo_fraction))
    indptr = np.ascontiguousarray(graph.indptr[: n_solid + 1])
    indices = np.ascontiguousarray(graph.indices[: indptr[-1]])
    return LocalGraph(indptr, indices, n_solid, nodes)


# -- hubs, placements, streams ---------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_power_law_invariants(backend, device) -> None:
    g = power_law_graph(3000, 12.0, seed=3)
    assert np.diff(g.indptr).max() > 100, "no hub: the graph does not test the hub path"
    fanouts = [5, 10, 15]
    sampler = device_sampler(g, fanouts, 7, device, backend)
    rng = np.random.default_rng(4)
    for it in range(2):
        seeds = rng.choice(g.n_solid, 64, replace=False)
        blocks = on_cpu(sampler.sample(seeds, 0, it), device)
        check_blocks(g, seeds, fanouts, blocks)
        assert sum(b.n_halo for b in blocks) > 0


@pytest.mark.parametrize("device", DEVICES)
def test_placements_draw_the_same_blocks(device) -> None:
    g = random_local_graph(2_000, 200, 30, seed=9, dtype=np.int32)
    fanouts = [10, 10]
    seeds = np.random.default_rng(0).choice(g.n_solid, 200, replace=False)
    one = on_cpu(device_sampler(g, fanouts, 123, device).sample(seeds, 3, 7), device)
    check_blocks(g, seeds, fanouts, one)
    fresh = device_sampler(g, fanouts, 123, device, placement="host")
    assert_same_blocks(one, on_cpu(fresh.sample(seeds, 3, 7), device))


def test_batch_seed_is_a_hash_of_the_triple() -> None:
    assert len({batch_seed(s, e, i) for s in range(3) for e in range(3) for i in range(3)}) == 27
    assert 0 <= batch_seed(2**64 - 1, 2**64 - 1, 2**64 - 1) < 2**63


@pytest.mark.cuda
def test_host_placement_reads_pinned_memory_in_place() -> None:
    host = torch.arange(1000, dtype=torch.int64).pin_memory()
    view = mapped_view(host, torch.device("cuda"))
    assert view.is_cuda and view.data_ptr() == host.data_ptr()
    assert torch.equal(view[torch.tensor([999, 0, 500], device="cuda")].cpu(),
                       torch.tensor([999, 0, 500]))  # fmt: skip
    host[500] = -7  # the same bytes: a host write is seen by the device
    assert int(view[500]) == -7


def test_host_placement_on_cpu_is_the_host_array() -> None:
    host = torch.arange(10)
    assert mapped_view(host, torch.device("cpu")) is host
    with pytest.raises(ValueError, match="supports cpu and cuda"):
        mapped_view(host, torch.device("meta"))


# -- distribution --------------------------------------------------------------------------
def inclusion_pvalue(inclusion: np.ndarray, n: int, fanout: int) -> float:
    """p-value of ``inclusion`` (times each of the d positions was taken in ``n`` uniform
    draws of ``fanout`` of d): inclusion indicators have mean p = k/d and covariance
    p(1-p) d/(d-1) (I - 11^T/d), so the statistic is chi-square with d-1 dof."""
    from scipy import stats

    d = inclusion.shape[0]
    p = fanout / d
    stat = ((inclusion - n * p) ** 2).sum() / (n * p * (1 - p)) * (d - 1) / d
    return float(stats.chi2.sf(stat, d - 1))


def test_the_inclusion_test_rejects_biased_samplers() -> None:
    # The statistic (at the sample sizes of test_inclusion_is_uniform's degree-20 cases)
    # fails a sampler that favours some positions: the first k always, or the first
    # position 20 % more often than the others (a 10 % tilt of one position out of 20 is
    # at the edge of what 10^4 draws resolve: p ~ 0.02).
    n, d, k = 10_000, 20, 5
    first_k = np.zeros(d)
    first_k[:k] = n
    assert inclusion_pvalue(first_k, n, k) < 1e-100
    tilted = np.full(d, n * k / d)
    tilted[0] *= 1.2
    tilted[1:] -= (tilted.sum() - n * k) / (d - 1)
    assert inclusion_pvalue(tilted, n, k) < P_MIN


def star_inclusion(
    degree: int, fanout: int, n_hubs: int, calls: int, device: str, choose: str = "torch"
) -> np.ndarray:
    g = star_graph(n_hubs, degree)
    sampler = device_sampler(g, [fanout], 3, device, choose=choose)
    inclusion = np.zeros(degree)
    for it in range(calls):
        (block,) = on_cpu(sampler.sample(np.arange(n_hubs), epoch=1, iteration=it), device)
        leaves = block.src_ids[block.indices].numpy() - n_hubs
        assert len(leaves) == n_hubs * fanout
        assert np.all(np.diff(leaves.reshape(n_hubs, fanout), axis=1) > 0), "not CSR order"
        inclusion += np.bincount(leaves, minlength=degree)
    return inclusion


@pytest.mark.parametrize(("device", "choose"), KERNELS)
@pytest.mark.parametrize(("degree", "fanout"), [(20, 5), (20, 19), (300, 100), (3_000, 40)])
def test_inclusion_is_uniform(degree, fanout, device, choose) -> None:
    n_hubs, calls = 1_000, 10 if fanout < 40 else 3  # Floyd costs O(fanout^2) per row
    inclusion = star_inclusion(degree, fanout, n_hubs, calls, device, choose)
    p = inclusion_pvalue(inclusion, n_hubs * calls, fanout)
    assert p > P_MIN, f"inclusion of {fanout} of {degree} not uniform: p = {p:.2e}"


@pytest.mark.parametrize(("device", "choose"), KERNELS)
@pytest.mark.parametrize(("degree", "fanout"), [(8, 3), (6, 4), (7, 1)])
def test_subsets_are_uniform(degree, fanout, device, choose) -> None:
    from scipy import stats

    g = star_graph(2_000, degree)
    sampler = device_sampler(g, [fanout], 99, device, choose=choose)
    counts: Counter = Counter()
    for it in range(20):
        (block,) = on_cpu(sampler.sample(np.arange(2_000), 0, it), device)
        leaves = block.src_ids[block.indices].numpy().reshape(2_000, fanout) - 2_000
        counts.update(map(tuple, leaves.tolist()))
    subsets = list(combinations(range(degree), fanout))
    assert set(counts) == set(subsets) and len(subsets) == math.comb(degree, fanout)
    p = stats.chisquare(np.array([counts[s] for s in subsets])).pvalue
    assert p > P_MIN, f"C({degree},{fanout}) subsets not uniform: p = {p:.2e}"


def edge_inclusion(sample, g: LocalGraph, seeds: np.ndarray, calls: int) -> list[np.ndarray]:
    """Per seed, how often each of its CSR positions was sampled over ``calls`` batches."""
    position = [{u: k for k, u in enumerate(g.row(int(v)).tolist())} for v in seeds]
    counts = [np.zeros(g.degree(int(v))) for v in seeds]
    for it in range(calls):
        for i, nbrs in enumerate(block_neighbours(sample(it))):
            counts[i][[position[i][u] for u in nbrs.tolist()]] += 1
    return counts


@pytest.mark.parametrize(("device", "choose"), KERNELS)
def test_edge_inclusion_matches_the_cpp_sampler(device, choose) -> None:
    """On a power-law graph, every edge of a seed above the fan-out is taken k/d of the
    time by both samplers (one chi-square over all seeds each), and the two samplers'
    frequencies agree (a two-sample chi-square of their differences)."""
    from scipy import stats

    g = power_law_graph(3000, 12.0, seed=5)
    fanout, calls = 4, 150
    deg = np.diff(g.indptr)
    seeds = np.flatnonzero((deg > fanout) & (deg <= 400))[:300]
    assert len(seeds) == 300 and deg[seeds].max() > 100
    ours = device_sampler(g, [fanout], 21, device, choose=choose)
    cpp = g.sampler([fanout], seed=21)
    a = edge_inclusion(lambda it: on_cpu(ours.sample(seeds, 0, it), device)[0], g, seeds, calls)
    b = edge_inclusion(lambda it: cpp.sample(seeds, 0, it)[0], g, seeds, calls)
    stat_a = stat_b = stat_ab = 0.0
    dof = 0
    for x, y in zip(a, b, strict=True):
        d = x.shape[0]
        p = fanout / d
        scale = (d - 1) / d / (calls * p * (1 - p))
        stat_a += ((x - calls * p) ** 2).sum() * scale
        stat_b += ((y - calls * p) ** 2).sum() * scale
        stat_ab += ((x - y) ** 2).sum() * scale / 2
        dof += d - 1
    for name, stat in (("device", stat_a), ("C++", stat_b), ("device - C++", stat_ab)):
        pvalue = stats.chi2.sf(stat, dof)
        assert pvalue > P_MIN, f"{name}: chi2 = {stat:.0f} on {dof} dof, p = {pvalue:.2e}"


# -- the one-launch layer kernel on CUDA ------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_layer_kernel_on_cuda_equals_the_numpy_reference(dtype) -> None:
    """The kernel compiled for the GPU (not the interpreter) gives exactly the reference's
    slots, row sizes and valid masks: the hand-built graph's hubs, isolated vertices and
    degree == fan-out, fan-outs 1 to 100, keys with the top bit set, many programs."""
    from test_choose_triton import KEYS, assert_matches_reference, mixed_graph

    g = mixed_graph(dtype)
    rows = np.array([8, 0, 3, 2, 6, 1, 5, 7, 4, 8])
    for fanout in (1, 3, 4, 5, 16, 100):
        for key in KEYS:
            assert_matches_reference(g, rows, rows + 500, fanout, key, "cuda")
    many = np.random.default_rng(0).integers(0, g.n_solid, 5_000)
    for fanout in (3, 16):
        assert_matches_reference(g, many, np.arange(5_000), fanout, 2**64 - 1, "cuda")


# -- errors --------------------------------------------------------------------------------
def test_bad_arguments() -> None:
    g = hand_graph()
    with pytest.raises(ValueError, match="positive or FANOUT_ALL"):
        device_sampler(g, [2, 0])
    with pytest.raises(ValueError, match="graph placement 'disk'"):
        device_sampler(g, [2], placement="disk")
    with pytest.raises(ValueError, match=r"is outside \[0, n_local=7\)"):
        DeviceNeighborSampler(g.indptr, np.where(g.indices == 6, 7, g.indices), 5, 7, [2], 0)
    with pytest.raises(ValueError, match="indptr decreases at row 1"):
        DeviceNeighborSampler(np.array([0, 3, 2, 8, 13, 13]), g.indices, 5, 7, [2], 0)
    with pytest.raises(ValueError, match="indices must be int32 or int64"):
        DeviceNeighborSampler(g.indptr, g.indices.astype(np.float32), 5, 7, [2], 0)
    sampler = device_sampler(g, [2])
    with pytest.raises(ValueError, match="iteration must be in"):
        sampler.sample(np.array([0]), 0, 2**64)


# -- the data path -------------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [0, 2])
def test_plugs_into_the_batch_loader(prefetch) -> None:
    from conftest import random_graph

    from distmb.data.local import LocalGraph as PartGraph
    from distmb.pipeline import BatchLoader
    from distmb.pipeline.features import PartFeatures

    part = PartGraph.from_graph(random_graph(n=600, m=4000, feat_dim=7, classes=3, seed=4))
    g = LocalGraph(part.indptr, part.indices, part.n_solid, part.n_local)
    sampler = device_sampler(g, [3, 4], 11)
    loader = BatchLoader(sampler, PartFeatures(part.features), part.labels, prefetch=prefetch)
    batches = np.array_split(np.random.default_rng(0).permutation(part.train_idx), 5)
    for batch in loader(loader.plan(2, batches)):
        seeds = batches[batch.index]
        check_blocks(g, seeds, [3, 4], batch.blocks)
        assert_same_blocks(batch.blocks, sampler.sample(seeds, 2, batch.index))
        first = batch.blocks[0]
        want = torch.as_tensor(np.asarray(part.features)[first.src_ids[: first.n_computed]])
        assert torch.equal(batch.x, want)
        assert torch.equal(batch.labels, torch.as_tensor(part.labels[seeds]))
