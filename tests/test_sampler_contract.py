"""The block contract of every part sampler (:class:`~distmb.pipeline.sample.PartSampler`):
the C++ :class:`NeighborSampler` and the :class:`DeviceNeighborSampler` (torch ops and the
Triton Fused-Map, the graph on the device or read in place from host memory; the layer by
torch ops or by the one-launch Triton kernel, :mod:`distmb.pipeline.sample.choose_triton`)
on CPU tensors here (Triton under its interpreter), on CUDA under ``pytest -m cuda``.

The Triton layer kernel's entries sample a whole mini-batch with one host read
(:mod:`distmb.pipeline.sample.device_batch`); the others read once per layer
(``test_host_reads_per_batch``).

One parametrised set checks every implementation against a brute-force reference on
hand-built graphs with hubs and halo vertices: destinations a prefix of the sources, then the
new solid sources, then the halo leaves, never expanded; ``min(deg, fanout)`` distinct
in-edges per row, in CSR order; with ``FANOUT_ALL`` the reference block exactly; the same
blocks for the same ``(seed, epoch, iteration)``. The sampling distributions are tested per
implementation (``test_sampler.py``, ``test_cuda_sampler.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from distmb.core.host_reads import HOST_READS
from distmb.pipeline.sample import (
    FANOUT_ALL,
    BatchSampler,
    Block,
    NeighborSampler,
    PartSampler,
    idmap_triton,
)
from distmb.pipeline.sample.device import DeviceNeighborSampler


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


def from_rows(rows: dict[int, list[int]], n_local: int) -> LocalGraph:
    """The local graph whose solid vertex ``v`` has the in-neighbours ``rows[v]`` (CSR
    order as listed)."""
    n_solid = len(rows)
    indptr = np.cumsum([0] + [len(rows[v]) for v in range(n_solid)])
    indices = np.concatenate([rows[v] for v in range(n_solid)]).astype(np.int32)
    return LocalGraph(indptr, indices, n_solid, n_local)


def hand_graph() -> LocalGraph:
    """5 solid vertices, 2 halo vertices (5, 6); vertex 4 has no in-edges."""
    return from_rows({0: [1, 2, 5], 1: [0, 3, 6, 2], 2: [6], 3: [0, 1, 2, 4, 5], 4: []}, 7)


def hub_graph() -> LocalGraph:
    """8 solid vertices, 3 halo vertices (8, 9, 10): two hubs (0 of degree 9, 5 of degree 7,
    both with halo in-neighbours), an isolated vertex (4), rows not sorted."""
    rows = {
        0: [7, 1, 9, 3, 5, 2, 8, 4, 6],
        1: [0, 10],
        2: [3, 8, 0, 1],
        3: [0],
        4: [],
        5: [10, 0, 2, 7, 4, 6, 9],
        6: [5],
        7: [0, 5, 10],
    }
    return from_rows(rows, 11)


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


#: Seeds every sampler refuses on :func:`hand_graph` (halo vertex 5), and the message's text.
BAD_SEEDS = [
    ([5], "is a halo vertex"),
    ([0, 7], "outside the solid range"),
    ([-1], "outside the solid range"),
    ([1, 2, 1], "must be distinct; VID_p 1"),
    ([[0, 1]], "must be 1-D"),
    ([0.5], "must hold integers"),
]


# -- the implementations -------------------------------------------------------------------
@dataclass(frozen=True)
class Implementation:
    """One sampler: the C++ one (``backend`` None) or the device one with its Fused-Map
    back end, graph placement, device and layer kernel (``choose``)."""

    backend: str | None = None
    placement: str = "device"
    device: str = "cpu"
    choose: str = "torch"
    graphs: bool = False

    def make(self, g: LocalGraph, fanouts: list[int], seed: int = 0) -> PartSampler:
        if self.backend is None:
            return g.sampler(fanouts, seed)
        if "triton" in (self.backend, self.choose):
            ok, why = idmap_triton.usable(torch.device(self.device))
            if not ok:
                pytest.skip(why)
        return DeviceNeighborSampler(
            g.indptr, g.indices, g.n_solid, g.n_local, fanouts, seed,
            device=self.device, placement=self.placement, backend=self.backend,  # type: ignore[arg-type]
            choose=self.choose, graphs=self.graphs,  # type: ignore[arg-type]
        )  # fmt: skip

    def seeds(self, seeds: np.ndarray) -> np.ndarray | torch.Tensor:
        """The seeds as the sampler's users pass them: numpy for the C++ sampler, a tensor
        on the device for the device sampler."""
        if self.backend is None:
            return seeds
        return torch.as_tensor(np.asarray(seeds, dtype=np.int64), device=self.device)


def on_cpu(blocks: list[Block], device: str) -> list[Block]:
    """The blocks with their tensors on the CPU, after checking they were on ``device``."""
    out = []
    for b in blocks:
        for t in (b.indptr, b.indices, b.src_ids):
            assert t.device.type == device
        out.append(Block(b.n_dst, b.n_src, b.n_halo, b.indptr.cpu(), b.indices.cpu(),
                         b.src_ids.cpu()))  # fmt: skip
    return out


IMPLEMENTATIONS = [
    pytest.param(Implementation(), id="cpp"),
    *[
        pytest.param(Implementation(backend, placement), id=f"{backend}-{placement}")
        for backend in ("torch", "triton")
        for placement in ("device", "host")
    ],
    # The one-launch layer kernel (with the Triton Fused-Map): on the CPU both placements
    # are the same arrays, so the device one only.
    pytest.param(Implementation("triton", choose="triton"), id="choose-triton-device"),
    # Its one-read batches replayed from graphs (off CUDA: the eager stand-in).
    pytest.param(Implementation("triton", choose="triton", graphs=True), id="choose-triton-graphs"),
    *[
        pytest.param(
            Implementation(backend, placement, "cuda"),
            id=f"{backend}-{placement}-cuda",
            marks=pytest.mark.cuda,
        )
        for backend in ("torch", "triton")
        for placement in ("device", "host")
    ],
    *[
        pytest.param(
            Implementation("triton", placement, "cuda", choose="triton"),
            id=f"choose-triton-{placement}-cuda",
            marks=pytest.mark.cuda,
        )
        for placement in ("device", "host")
    ],
    pytest.param(
        Implementation("triton", "device", "cuda", choose="triton", graphs=True),
        id="choose-triton-graphs-cuda",
        marks=pytest.mark.cuda,
    ),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> Implementation:
    return request.param


def sample(
    impl: Implementation, sampler: PartSampler, seeds: np.ndarray, epoch: int, iteration: int
) -> list[Block]:
    return on_cpu(sampler.sample(impl.seeds(seeds), epoch, iteration), impl.device)


# -- the protocol --------------------------------------------------------------------------
def test_declares_the_protocol(impl: Implementation) -> None:
    sampler = impl.make(hand_graph(), [2, FANOUT_ALL, 3])
    assert isinstance(sampler, PartSampler) and isinstance(sampler, BatchSampler)
    assert sampler.uses_collectives is False  # safe on the loader's prefetch thread
    assert sampler.num_layers == 3 and sampler.fanouts == [2, FANOUT_ALL, 3]
    assert (sampler.n_solid, sampler.n_local) == (5, 7)


def test_host_reads_per_batch(impl: Implementation) -> None:
    """The device sampler reads the host once per mini-batch with the Triton layer kernel
    (every layer sized by a bound), once per layer otherwise; the C++ sampler never."""
    fanouts = [2, 3, 2]
    sampler = impl.make(hub_graph(), fanouts)
    seeds = np.array([5, 0, 2])
    before, _ = HOST_READS.snapshot()
    blocks = sampler.sample(impl.seeds(seeds), 0, 0)
    reads = HOST_READS.snapshot()[0] - before
    if impl.backend is None:
        assert reads == 0
    else:
        assert isinstance(sampler, DeviceNeighborSampler)
        one_read = impl.choose == "triton"
        assert sampler.reads_once(fanouts, len(seeds)) == one_read
        assert reads == (1 if one_read else len(fanouts))
    check_blocks(hub_graph(), seeds, fanouts, on_cpu(blocks, impl.device))


# -- the block contract --------------------------------------------------------------------
def test_full_block_equals_the_hand_computed_block(impl: Implementation) -> None:
    block = on_cpu([impl.make(hub_graph(), [2]).full_block(impl.seeds(np.array([5, 2])))],
                   impl.device)[0]  # fmt: skip
    # dst 5 <- 10 0 2 7 4 6 9, dst 2 <- 3 8 0 1: new solid 0 7 4 6 3 1 (2 is a
    # destination), then the halo leaves 10 9 8 in order of first use.
    assert block.src_ids.tolist() == [5, 2, 0, 7, 4, 6, 3, 1, 10, 9, 8]
    assert block.indptr.tolist() == [0, 7, 11]
    assert block.indices.tolist() == [8, 2, 1, 3, 4, 5, 9, 6, 10, 2, 7]
    assert (block.n_dst, block.n_src, block.n_halo, block.n_computed) == (2, 11, 3, 8)


@pytest.mark.parametrize("fanouts", [[2, 2], [1, 3, 2], [FANOUT_ALL, 2], [3, FANOUT_ALL]])
@pytest.mark.parametrize("graph", [hand_graph, hub_graph])
def test_hand_graph_blocks_meet_the_contract(
    impl: Implementation, graph: Callable[[], LocalGraph], fanouts: list[int]
) -> None:
    g = graph()
    sampler = impl.make(g, fanouts, seed=5)
    for it in range(6):
        seeds = np.array([1, 4, 3]) if it % 2 else np.array([0])
        check_blocks(g, seeds, fanouts, sample(impl, sampler, seeds, 0, it))
    seeds = np.array([5, 0, 2]) if g.n_solid > 5 else np.array([3, 0, 2])  # the hubs
    check_blocks(g, seeds, fanouts, sample(impl, sampler, seeds, 1, 0))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_random_graph_blocks_meet_the_contract(impl: Implementation, dtype: type) -> None:
    g = random_local_graph(300, 40, 12, seed=1, dtype=dtype)
    fanouts = [4, 3, 6]
    sampler = impl.make(g, fanouts, seed=11)
    rng = np.random.default_rng(2)
    for it in range(4):
        seeds = rng.choice(g.n_solid, 25, replace=False)  # unsorted seeds keep their order
        check_blocks(g, seeds, fanouts, sample(impl, sampler, seeds, 1, it))


def test_sample_hop_is_one_layer(impl: Implementation) -> None:
    g = random_local_graph(200, 30, 10, seed=6)
    sampler = impl.make(g, [2])
    dst = np.array([7, 3, 150, 42, 0])
    for fanout in (1, 3, FANOUT_ALL):
        hop = on_cpu([sampler.sample_hop(impl.seeds(dst), fanout, 2, 9)], impl.device)
        check_blocks(g, dst, [fanout], hop)
    full = on_cpu([sampler.sample_hop(impl.seeds(dst), FANOUT_ALL, 2, 9)], impl.device)
    assert_same_blocks(full, [reference_full(g, dst)])


def test_fanout_all_equals_the_brute_force_reference(impl: Implementation) -> None:
    g = random_local_graph(200, 30, 10, seed=3)
    seeds = np.array([5, 17, 0, 199, 42])
    fanouts = [FANOUT_ALL, FANOUT_ALL]
    blocks = sample(impl, impl.make(g, fanouts), seeds, 0, 0)
    check_blocks(g, seeds, fanouts, blocks)
    assert_same_blocks([blocks[1]], [reference_full(g, seeds)])
    assert_same_blocks([blocks[0]], [reference_full(g, blocks[1].src_ids[: blocks[1].n_computed])])
    # A fan-out at least the maximum degree also takes every neighbour, whatever the stream.
    big = int(np.diff(g.indptr).max())
    sampler = impl.make(g, [big, big], seed=1)
    assert_same_blocks(sample(impl, sampler, seeds, 3, 4), blocks)
    for lo in range(0, g.n_solid, 64):  # layer-wise evaluation's batches of destinations
        dst = np.arange(lo, min(lo + 64, g.n_solid))
        full = on_cpu([sampler.full_block(impl.seeds(dst))], impl.device)
        assert_same_blocks(full, [reference_full(g, dst)])


def test_halo_leaves_empty_and_isolated_seeds(impl: Implementation) -> None:
    # Every in-neighbour of the seed is halo: no block below the seed's expands them.
    g = LocalGraph(np.array([0, 3, 4]), np.array([2, 3, 4, 0]), 2, 5)
    for b in sample(impl, impl.make(g, [FANOUT_ALL] * 3), np.array([0]), 0, 0):
        assert b.dst_ids.tolist() == [0] and b.src_ids.tolist() == [0, 2, 3, 4]
        assert b.n_halo == 3 and b.num_edges == 3
    sampler = impl.make(hub_graph(), [3, 3])
    blocks = sample(impl, sampler, np.zeros(0, dtype=np.int64), 0, 0)
    assert len(blocks) == 2
    assert all(b.n_dst == 0 and b.n_src == 0 and b.num_edges == 0 for b in blocks)
    blocks = sample(impl, sampler, np.array([4]), 0, 0)  # no in-edges
    assert all(b.src_ids.tolist() == [4] and b.indptr.tolist() == [0, 0] for b in blocks)


def test_deterministic_per_seed_epoch_and_iteration(impl: Implementation) -> None:
    g = random_local_graph(300, 40, 12, seed=9, dtype=np.int32)
    fanouts = [3, 3]
    seeds = np.random.default_rng(0).choice(g.n_solid, 50, replace=False)
    sampler = impl.make(g, fanouts, seed=123)
    one = sample(impl, sampler, seeds, 3, 7)
    check_blocks(g, seeds, fanouts, one)
    sample(impl, sampler, seeds, 5, 5)  # nothing depends on past calls
    assert_same_blocks(one, sample(impl, sampler, seeds, 3, 7))
    assert_same_blocks(one, sample(impl, impl.make(g, fanouts, seed=123), seeds, 3, 7))
    for other in (
        sample(impl, sampler, seeds, 3, 8),
        sample(impl, sampler, seeds, 4, 7),
        sample(impl, impl.make(g, fanouts, seed=124), seeds, 3, 7),
    ):
        assert not torch.equal(other[-1].indices, one[-1].indices)


@pytest.mark.parametrize(("seeds", "message"), BAD_SEEDS)
def test_bad_seeds_are_refused(impl: Implementation, seeds: list, message: str) -> None:
    sampler = impl.make(hand_graph(), [2, 2])
    before = sample(impl, sampler, np.array([0, 3]), 0, 0)
    with pytest.raises(ValueError, match=message):
        sampler.sample(np.array(seeds), 0, 0)
    # The failed call changed nothing: the same call gives the same blocks.
    assert_same_blocks(sample(impl, sampler, np.array([0, 3]), 0, 0), before)
