"""The device sampler's one-read batches replayed from CUDA graphs
(:mod:`distmb.pipeline.sample.graphed`).

The reference is the sampler's per-layer path (``_run(..., one_read=False)``: every layer
sized exactly, one read per layer, the keys passed as ints), which draws the same words, so
every replayed batch must give its blocks tensor for tensor. On the CPU the replay is the
stand-in (the same launches into the captured buffers), so the blocks a batch returns are
cut from memory that later batches overwrite, as on a GPU: the blocks of every batch are
kept and compared again at the end. On a GPU node (``-m cuda``) the graphs are real.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from conftest import held_elsewhere
from test_sampler_contract import (
    assert_same_blocks,
    check_blocks,
    from_rows,
    on_cpu,
    random_local_graph,
)

from distmb.core.graph_lock import GRAPH_LOCK
from distmb.core.host_reads import HOST_READS
from distmb.pipeline.sample import graphed, idmap_triton
from distmb.pipeline.sample.device import DeviceNeighborSampler
from distmb.pipeline.sample.device_batch import destination_bounds

pytestmark = pytest.mark.skipif(
    not idmap_triton.usable(torch.device("cpu"))[0], reason="needs Triton's interpreter"
)

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


def make(g, fanouts: list[int], device: str, graphs: bool) -> DeviceNeighborSampler:  # noqa: ANN001
    return DeviceNeighborSampler(
        g.indptr, g.indices, g.n_solid, g.n_local, fanouts, 11,
        device=device, backend="triton", choose="triton", graphs=graphs,
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
def test_replays_equal_the_per_layer_path_and_keep_earlier_blocks(device: str) -> None:
    """Shapes in turn (two seed counts, then a third beyond :data:`MAX_SAMPLER_GRAPHS`, run
    eagerly): every batch's blocks equal the per-layer path's, with one host read, and still
    do after all later batches; two graphs are captured, every later batch of their shapes
    replays one."""
    g = random_local_graph(400, 60, 14, seed=3, dtype=np.int32)
    fanouts = [3, 2, 4]
    sampler = make(g, fanouts, device, graphs=True)
    reference = make(g, fanouts, device, graphs=False)
    assert sampler.graphs is not None and reference.graphs is None
    rng = np.random.default_rng(0)
    shapes = [40, 40, 25, 40, 25, 40, 25, 9, 9, 9, 40]
    kept = []
    for iteration, n_seeds in enumerate(shapes):
        seeds = rng.choice(g.n_solid, n_seeds, replace=False)
        on_device = torch.as_tensor(seeds, device=device)
        before, _ = HOST_READS.snapshot()
        got = sampler.sample(on_device, 2, iteration)
        assert HOST_READS.snapshot()[0] - before == 1
        want = reference._run(on_device, fanouts, 2, iteration, one_read=False)
        assert_same_blocks(on_cpu(got, device), on_cpu(want, device))
        check_blocks(g, seeds, fanouts, on_cpu(got, device))
        kept.append((got, want))
    for got, want in kept:  # nothing returned earlier was overwritten by a replay
        assert_same_blocks(on_cpu(got, device), on_cpu(want, device))
    graphs = sampler.graphs
    assert graphed.MAX_SAMPLER_GRAPHS == 2 and graphs.captures == 2
    # 40 seeds: warm-up, then capture + replay at its 2nd batch and replays after (4);
    # 25 seeds: warm-up then 2; 9 seeds: never.
    assert graphs.replays == 4 + 2
    if device == "cuda":
        assert all(entry.graph is not None for entry in graphs._graphs.values())
    # The graphs' bounds are fitted: at most the full ones, and below them somewhere.
    for n_seeds in (40, 25):
        fitted, full = graphs.bounds(n_seeds, fanouts), destination_bounds(n_seeds, fanouts, 400)
        assert fitted is not None and fitted[-1] == n_seeds
        assert all(f <= b for f, b in zip(fitted, full, strict=True)) and fitted != full
    assert graphs.overflows == 0


def two_regions() -> tuple:
    """300 solid vertices: 0..99 take their in-neighbours from 0..9 only (a batch of them
    reaches few vertices), 100..299 three random ones each from 100..299 (many)."""
    rng = np.random.default_rng(1)
    rows = {v: rng.choice([u for u in range(10) if u != v], 3, replace=False).tolist()
            for v in range(100)}  # fmt: skip
    rows.update({v: rng.choice([u for u in range(100, 300) if u != v], 3, replace=False).tolist()
                 for v in range(100, 300)})  # fmt: skip
    return from_rows(rows, 300)


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_beyond_the_fitted_bounds_is_sampled_again(device: str, monkeypatch) -> None:
    """Bounds fitted to a batch of the first region are too small for one of the second:
    that batch is sampled again with the full bounds (the reference's blocks all the same),
    the shape refitted and its graph captured again; after :data:`MAX_REFITS` refits the
    graph takes the full bounds."""
    g, fanouts = two_regions(), [2, 2, 2]
    reference = make(g, fanouts, device, graphs=False)
    rng = np.random.default_rng(2)

    def batch(region: range, iteration: int) -> None:
        seeds = rng.choice(np.asarray(region), 10, replace=False)
        on_device = torch.as_tensor(seeds, device=device)
        got = on_cpu(sampler.sample(on_device, 0, iteration), device)
        want = on_cpu(reference._run(on_device, fanouts, 0, iteration, False), device)
        assert_same_blocks(got, want)

    sampler = make(g, fanouts, device, graphs=True)
    graphs = sampler.graphs
    assert graphs is not None
    batch(range(100), 0)  # eager: fits the bounds
    batch(range(100), 1)  # captured, replayed
    small = graphs.bounds(10, fanouts)
    assert graphs.captures == 1 and small is not None
    batch(range(100, 300), 2)  # beyond them: sampled again, the graph dropped
    assert graphs.overflows == 1 and graphs.bounds(10, fanouts) is None
    batch(range(100, 300), 3)  # captured again with the refitted bounds
    wider = graphs.bounds(10, fanouts)
    assert graphs.captures == 2 and graphs.overflows == 1
    assert wider is not None and all(a <= b for a, b in zip(small, wider, strict=True))
    assert wider != small
    monkeypatch.setattr(graphed, "MAX_REFITS", 0)  # the first refit takes the full bounds
    sampler = make(g, fanouts, device, graphs=True)
    graphs = sampler.graphs
    assert graphs is not None
    for iteration, region in enumerate([range(100)] * 2 + [range(100, 300)] * 2):
        batch(region, iteration)
    assert graphs.overflows == 1 and graphs.captures == 2
    assert graphs.bounds(10, fanouts) == destination_bounds(10, fanouts, g.n_solid)


@pytest.mark.parametrize("device", DEVICES)
def test_errors_of_a_replayed_shape(device: str) -> None:
    """A bad or repeated seed in a batch of a captured shape raises the eager path's error;
    the next batch of that shape is still right."""
    g = random_local_graph(120, 20, 8, seed=5)
    fanouts = [2, 3]
    sampler = make(g, fanouts, device, graphs=True)
    reference = make(g, fanouts, device, graphs=False)

    def batch(seeds: list[int], iteration: int) -> None:
        on_device = torch.tensor(seeds, device=device)
        got = on_cpu(sampler.sample(on_device, 0, iteration), device)
        want = on_cpu(reference._run(on_device, fanouts, 0, iteration, False), device)
        assert_same_blocks(got, want)

    batch([3, 7, 9], 0)
    batch([4, 8, 100], 1)  # captured here
    assert sampler.graphs is not None and sampler.graphs.captures == 1
    with pytest.raises(ValueError, match="VID_p 125 .* is a halo vertex"):
        sampler.sample(torch.tensor([1, 125, 2], device=device), 0, 2)
    with pytest.raises(ValueError, match="outside the solid range"):
        sampler.sample(torch.tensor([1, 2, 400], device=device), 0, 3)
    with pytest.raises(ValueError, match="seeds must be distinct; VID_p 6 occurs more"):
        sampler.sample(torch.tensor([6, 1, 6], device=device), 0, 4)
    batch([5, 0, 11], 5)
    assert sampler.graphs.replays == 5
    # A shape whose only eager batch failed has no fitted bounds yet: its next batch runs
    # eagerly again, the one after is captured.
    with pytest.raises(ValueError, match="outside the solid range"):
        sampler.sample(torch.tensor([1, 400], device=device), 0, 6)
    batch([4, 9], 7)
    batch([3, 8], 8)
    assert sampler.graphs.captures == 2


def test_captures_and_replays_hold_the_graph_lock(monkeypatch) -> None:
    """While the sampler captures or replays a graph, no other thread can take
    ``GRAPH_LOCK`` (which the training step holds around its random ops and graphs)."""
    g = random_local_graph(120, 20, 8, seed=5)
    sampler = make(g, [2, 3], "cpu", graphs=True)
    graphs = sampler.graphs
    assert graphs is not None
    held: list[bool] = []
    for name in ("_capture", "_replay"):
        original = getattr(graphs, name)
        monkeypatch.setattr(
            graphs, name, lambda *a, _f=original: held.append(held_elsewhere(GRAPH_LOCK)) or _f(*a)
        )
    for iteration in range(3):
        sampler.sample(torch.tensor([3, 7, 9]), 0, iteration)
    assert held == [True, True, True]  # the capture, and the replays of batches 1 and 2
    assert held_elsewhere(GRAPH_LOCK) is False


@pytest.mark.cuda
def test_random_ops_on_another_thread_during_captures() -> None:
    """A thread drawing dropout masks on the GPU under ``GRAPH_LOCK`` (as the training step
    does) while the sampler captures and replays graphs of several shapes: neither raises
    (PyTorch's default generator refuses use outside a capture while any graph is being
    captured)."""
    g = random_local_graph(400, 60, 14, seed=3, dtype=np.int32)
    sampler = make(g, [3, 2, 4], "cuda", graphs=True)
    stop, errors = threading.Event(), []
    x = torch.ones(1 << 16, device="cuda")

    def draw() -> None:
        try:
            while not stop.is_set():
                with GRAPH_LOCK:
                    torch.nn.functional.dropout(x, 0.5, training=True)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=draw)
    thread.start()
    try:
        rng = np.random.default_rng(0)
        for iteration in range(30):
            n_seeds = (40, 25)[iteration % 2]
            seeds = torch.as_tensor(rng.choice(g.n_solid, n_seeds, replace=False), device="cuda")
            sampler.sample(seeds, 0, iteration)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert sampler.graphs is not None and sampler.graphs.captures == 2
