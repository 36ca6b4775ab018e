"""The device sampler's one-read batches (:mod:`distmb.pipeline.sample.device_batch`): every
layer sized by a bound, one host read per mini-batch, the same blocks as the per-layer path.

The reference is the sampler's own per-layer path (``_run(..., one_read=False)``), which
sizes every layer exactly and reads the host once per layer; its random words are keyed by
row index like the one-read path's, so the blocks must be equal, tensor for tensor. Graphs
are hand-built: hubs, halo leaves, isolated vertices, neighbours shared by many rows, layers
of several kernel programs, int32 and int64 indices, and graphs on which a bound is attained
(every key new, or every solid vertex reached), so that a bound one too small fails. Every
batch also meets the block contract (``test_sampler_contract.check_blocks``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_sampler_contract import (
    Implementation,
    LocalGraph,
    assert_same_blocks,
    check_blocks,
    from_rows,
    hand_graph,
    hub_graph,
    on_cpu,
    random_local_graph,
)

from distmb.core.host_reads import HOST_READS
from distmb.pipeline.sample import FANOUT_ALL, device_batch, idmap_triton, relabel_triton
from distmb.pipeline.sample.choose_triton import rows_per_program
from distmb.pipeline.sample.device import DeviceNeighborSampler
from distmb.pipeline.sample.device_batch import destination_bounds

pytestmark = pytest.mark.skipif(
    not idmap_triton.usable(torch.device("cpu"))[0], reason="needs Triton's interpreter"
)

#: (device, placement): the CPU (both placements are the host arrays there) and, on a GPU
#: node, the CSR in device memory and read in place from pinned host memory.
PLACES = [
    pytest.param("cpu", "device", id="cpu"),
    pytest.param("cpu", "host", id="cpu-host"),
    pytest.param("cuda", "device", id="cuda", marks=pytest.mark.cuda),
    pytest.param("cuda", "host", id="cuda-host", marks=pytest.mark.cuda),
]
#: :data:`PLACES` less the CPU's second placement (the same arrays), for the longer tests.
PLACES_ONE_CPU = [p for p in PLACES if p.id != "cpu-host"]


def make(
    g: LocalGraph, fanouts: list[int], seed: int = 0, device: str = "cpu", placement: str = "device"
) -> DeviceNeighborSampler:
    sampler = Implementation("triton", placement, device, "triton").make(g, fanouts, seed)
    assert isinstance(sampler, DeviceNeighborSampler)
    return sampler


def reads(call, *args):  # noqa: ANN001, ANN002, ANN201
    """``(call(*args), host reads it made)``."""
    before, _ = HOST_READS.snapshot()
    out = call(*args)
    return out, HOST_READS.snapshot()[0] - before


def assert_one_read_equals_per_layer(
    sampler: DeviceNeighborSampler, g: LocalGraph, seeds: np.ndarray, epoch: int, iteration: int
) -> list:
    """The one-read blocks (one host read) equal the per-layer path's (one read per layer)
    and meet the contract; returns them, on the CPU."""
    device = sampler.device.type
    on_device = torch.as_tensor(seeds, dtype=torch.int64, device=device)
    assert sampler.reads_once(sampler.fanouts, len(seeds))
    got, n_reads = reads(sampler.sample, on_device, epoch, iteration)
    assert n_reads == 1
    want, n_reads = reads(sampler._run, on_device, sampler.fanouts, epoch, iteration, False)
    assert n_reads == len(sampler.fanouts)
    got, want = on_cpu(got, device), on_cpu(want, device)
    assert_same_blocks(got, want)
    check_blocks(g, seeds, sampler.fanouts, got)
    return got


# -- graphs --------------------------------------------------------------------------------
def tree_graph(n_seeds: int, fanouts: list[int]) -> tuple[LocalGraph, np.ndarray]:
    """A graph on which the destination bounds are attained: ids are handed out level by
    level, every new vertex of a level takes exactly the level's fan-out of in-neighbours,
    all new (solid), and the last level's vertices have no in-edges. So the top layer's
    ``D`` seeds have ``D x (1 + fanout)`` sources, all computed: the layer below has exactly
    its bound of destinations. Returns the graph and the seeds ``[0, n_seeds)``."""
    rows: dict[int, list[int]] = {}
    level, next_id = list(range(n_seeds)), n_seeds
    for fanout in reversed(fanouts):  # the top layer's fan-out first
        below = []
        for v in level:
            if v not in rows:  # a vertex of an upper level keeps its row
                rows[v] = list(range(next_id, next_id + fanout))[::-1]  # unsorted rows
                next_id += fanout
            below += [v, *rows[v]]
        level = list(dict.fromkeys(below))
    for v in range(next_id):
        rows.setdefault(v, [])
    return from_rows(rows, next_id + 2), np.arange(n_seeds)  # 2 unused halo ids


def program_graph(dtype: type) -> LocalGraph:
    """700 solid vertices, every one with 20 in-neighbours drawn from 40 shared ones (and
    2 halo vertices): a bottom layer of 16 slots a row spans several kernel programs
    (64 rows each) and the neighbours repeat across rows."""
    rng = np.random.default_rng(4)
    shared = np.append(rng.choice(700, 38, replace=False), [700, 701])
    rows = {v: rng.choice(shared[shared != v], 20, replace=False).tolist() for v in range(700)}
    g = from_rows(rows, 702)
    return LocalGraph(g.indptr, g.indices.astype(dtype), g.n_solid, g.n_local)


# -- the same blocks as the per-layer path -------------------------------------------------
@pytest.mark.parametrize(("device", "placement"), PLACES_ONE_CPU)
@pytest.mark.parametrize("fanouts", [[2, 2], [1, 3, 2], [3, 1, 4]])
def test_hand_graphs(device: str, placement: str, fanouts: list[int]) -> None:
    """Hubs with halo in-neighbours, an isolated vertex (4), rows not sorted; seeds
    unsorted, a lone isolated seed, every solid vertex."""
    for g in (hand_graph(), hub_graph()):
        sampler = make(g, fanouts, 5, device, placement)
        for it, seeds in enumerate([[1, 4, 3], [0], [4], [2, 0, 3, 1], list(range(g.n_solid))]):
            assert_one_read_equals_per_layer(sampler, g, np.array(seeds), 1, it)


@pytest.mark.parametrize(("device", "placement"), PLACES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_random_graphs(device: str, placement: str, dtype: type) -> None:
    g = random_local_graph(300, 40, 12, seed=1, dtype=dtype)
    sampler = make(g, [4, 3, 6], 11, device, placement)
    rng = np.random.default_rng(2)
    for it in range(3):
        seeds = rng.choice(g.n_solid, 25, replace=False)
        assert_one_read_equals_per_layer(sampler, g, seeds, 2, it)


@pytest.mark.parametrize(("device", "placement"), PLACES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_layers_of_several_programs(device: str, placement: str, dtype: type) -> None:
    """The bottom layer's bound (destinations) and its valid rows both span several
    programs of the layer kernel, and its keys repeat across rows."""
    g = program_graph(dtype)
    fanouts = [16, 2]
    seeds = np.random.default_rng(5).choice(g.n_solid, 60, replace=False)
    bound = destination_bounds(len(seeds), fanouts, g.n_solid)[0]
    assert bound == 180 > 2 * rows_per_program(16)
    assert bound * (1 + 16) > 2 * relabel_triton.BLOCK  # 3 programs of Fused-Map's kernels
    blocks = assert_one_read_equals_per_layer(
        make(g, fanouts, 3, device, placement), g, seeds, 0, 4
    )
    assert rows_per_program(16) < blocks[0].n_dst < bound


@pytest.mark.parametrize(("device", "placement"), PLACES_ONE_CPU)
def test_fused_map_of_many_programs(
    device: str, placement: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fused-Map's count and relabel kernels at 16 keys a program and the scan at 4
    partial sums a pass: every layer spans many programs (a key's first occurrence often in
    another one) and the scan several passes; the blocks stay the per-layer path's."""
    monkeypatch.setattr(relabel_triton, "BLOCK", 16)
    monkeypatch.setattr(relabel_triton, "SCAN_CHUNK", 4)
    g = random_local_graph(300, 40, 12, seed=3)
    sampler = make(g, [3, 2, 4], 2, device, placement)
    rng = np.random.default_rng(8)
    for it in range(2):
        seeds = rng.choice(g.n_solid, 20, replace=False)
        blocks = assert_one_read_equals_per_layer(sampler, g, seeds, 1, it)
        assert blocks[0].n_src > 4 * 16 and blocks[-1].n_dst * 5 > 4 * 16


@pytest.mark.parametrize(("device", "placement"), PLACES_ONE_CPU)
def test_torch_fused_map_in_a_one_read_batch(device: str, placement: str) -> None:
    """:func:`~distmb.pipeline.sample.device_batch.sample_one_read` with the PyTorch-ops
    Fused-Map (its second implementation, not the sampler's): the same blocks as with the
    Triton kernels, and the same errors."""
    g = random_local_graph(300, 40, 12, seed=1)
    sampler = make(g, [4, 3, 6], 11, device, placement)
    seeds = torch.as_tensor(np.random.default_rng(2).choice(g.n_solid, 25, replace=False),
                            device=device)  # fmt: skip

    def one_read(backend: str, seeds: torch.Tensor = seeds) -> list:
        return device_batch.sample_one_read(
            sampler.indptr, sampler.indices, seeds, sampler.fanouts, 77, g.n_solid, backend,
            sampler._raise_bad_seed,
        )  # fmt: skip

    want = on_cpu(one_read("triton"), device)
    got, n_reads = reads(one_read, "torch")
    assert n_reads == 1
    assert_same_blocks(on_cpu(got, device), want)
    check_blocks(g, seeds.cpu().numpy(), sampler.fanouts, want)
    for backend in ("triton", "torch"):
        with pytest.raises(ValueError, match="outside the solid range"):
            one_read(backend, torch.tensor([3, g.n_local + 4], device=device))


@pytest.mark.parametrize(("device", "placement"), PLACES)
def test_bounds_attained(device: str, placement: str) -> None:
    """Every key of the top layer new, so the layer below has exactly its bound of
    destinations and a bound one too small cannot pass; then a graph small enough that
    the ``n_solid`` cap is the bound, and every solid vertex is reached."""
    fanouts = [2, 3]
    g, seeds = tree_graph(3, fanouts)
    blocks = assert_one_read_equals_per_layer(
        make(g, fanouts, 0, device, placement), g, seeds, 0, 0
    )
    bounds = destination_bounds(len(seeds), fanouts, g.n_solid)
    assert [b.n_dst for b in blocks] == bounds == [12, 3]
    # Below, the 3 seeds take 2 of their 3 neighbours (sources already), the 9 others 2 new.
    assert [b.n_src for b in blocks] == [12 + 9 * 2, 3 * (1 + 3)]
    g = hand_graph()  # vertex 3 reaches 0, 1, 2, 4 and the halo vertex 5
    fanouts = [5, 5]
    blocks = assert_one_read_equals_per_layer(make(g, fanouts, 0, device, placement), g,
                                              np.array([3]), 0, 0)  # fmt: skip
    assert destination_bounds(1, fanouts, g.n_solid) == [g.n_solid, 1] and 1 * (1 + 5) > 5
    assert blocks[0].n_dst == g.n_solid


def test_sample_hop_reads_once() -> None:
    g = random_local_graph(200, 30, 10, seed=6)
    sampler = make(g, [2])
    dst = torch.tensor([7, 3, 150, 42, 0])
    for fanout in (1, 3):
        hop, n_reads = reads(sampler.sample_hop, dst, fanout, 2, 9)
        assert n_reads == 1
        want = sampler._run(dst, [fanout], 2, 9, one_read=False)
        assert_same_blocks([hop], want)
    full, n_reads = reads(sampler.full_block, dst)  # FANOUT_ALL: sized by the data
    assert n_reads == 2 and full.num_edges == int(np.diff(g.indptr)[dst.numpy()].sum())


# -- bounds, limits, fallbacks -------------------------------------------------------------
def test_destination_bounds() -> None:
    # Top (layer 2): the seeds; below: min(D x (1 + fan-out of the layer above), n_solid).
    assert destination_bounds(30, [5, 10, 15], 10_000) == [30 * 16 * 11, 30 * 16, 30]
    assert destination_bounds(30, [5, 10, 15], 400) == [400, 400, 30]
    assert destination_bounds(2, [7], 5) == [2]
    assert destination_bounds(0, [3, 3], 50) == [0, 0]


def test_above_the_key_limit_reads_once_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose largest layer has more keys than the limit is sampled one read per
    layer, with the same blocks; at the limit exactly, one read."""
    g = random_local_graph(300, 40, 12, seed=1)
    fanouts = [4, 3]
    sampler = make(g, fanouts, 7)
    seeds = torch.as_tensor(np.random.default_rng(3).choice(g.n_solid, 20, replace=False))
    bounds = destination_bounds(20, fanouts, g.n_solid)
    largest = max(d * (1 + f) for d, f in zip(bounds, fanouts, strict=True))
    assert largest == 20 * 4 * 5
    one_read, n_reads = reads(sampler.sample, seeds, 0, 3)
    assert n_reads == 1
    monkeypatch.setattr(device_batch, "MAX_ONE_READ_KEYS", largest)
    assert sampler.reads_once(fanouts, 20)
    monkeypatch.setattr(device_batch, "MAX_ONE_READ_KEYS", largest - 1)
    assert not sampler.reads_once(fanouts, 20)
    per_layer, n_reads = reads(sampler.sample, seeds, 0, 3)
    assert n_reads == len(fanouts)
    assert_same_blocks(per_layer, one_read)


@pytest.mark.parametrize(
    ("backend", "choose", "fanouts", "n_seeds"),
    [
        ("triton", "torch", [2, 3], 3),  # the torch kernel: its words depend on the row count
        ("torch", "triton", [2, 3], 3),  # torch.unique reads its own size
        ("triton", "triton", [FANOUT_ALL, 3], 3),  # an exact layer: sized by the data
        ("triton", "triton", [2, 3], 0),  # no seed
    ],
)
def test_which_batches_read_once_per_layer(
    backend: str, choose: str, fanouts: list[int], n_seeds: int
) -> None:
    g = hub_graph()
    sampler = DeviceNeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, fanouts, 0,
                                    backend=backend, choose=choose)  # type: ignore[arg-type]  # fmt: skip
    assert not sampler.reads_once(fanouts, n_seeds)
    seeds = np.array([5, 0, 2][:n_seeds], dtype=np.int64)
    blocks, n_reads = reads(sampler.sample, seeds, 0, 0)
    exact = sum(f == FANOUT_ALL for f in fanouts)
    assert n_reads == len(fanouts) + exact
    check_blocks(g, seeds, fanouts, on_cpu(blocks, "cpu"))
    assert make(g, [2, 3]).reads_once([2, 3], 3)  # the same graph, Triton all through


# -- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seeds", "message"),
    [
        ([5], "is a halo vertex"),
        ([0, 7], "outside the solid range"),
        ([3, -1], "outside the solid range"),
        ([1, 2, 1], "must be distinct; VID_p 1"),
        ([0, 4, 0, 4], "must be distinct; VID_p 0"),
    ],
)
def test_bad_seeds_are_refused_after_the_one_read(seeds: list[int], message: str) -> None:
    """The per-layer path's errors, in its order (range, then repeats), after the batch's
    read (plus those that name the bad seed); the next batch is unaffected."""
    g = hand_graph()
    sampler = make(g, [2, 2])
    assert sampler.reads_once([2, 2], len(seeds))
    with pytest.raises(ValueError, match=message):
        sampler.sample(np.array(seeds), 0, 0)
    with pytest.raises(ValueError, match=message):
        sampler._run(np.array(seeds), [2, 2], 0, 0, one_read=False)
    assert_one_read_equals_per_layer(sampler, g, np.array([0, 3]), 0, 0)
