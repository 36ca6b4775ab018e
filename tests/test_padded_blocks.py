"""distmb.pipeline.sample.padded: blocks padded to their bounds give the unpadded model's
real rows, loss and gradients (the reference: the same model on the unpadded blocks)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import random_graph, require_triton

from distmb.data.local import LocalGraph
from distmb.nn import build_model
from distmb.nn.kernels.dispatch import get_kernels, set_kernels
from distmb.nn.models import GAT
from distmb.pipeline.sample import Block, NeighborSampler
from distmb.pipeline.sample.device_batch import destination_bounds
from distmb.pipeline.sample.padded import (
    PADDING_ROW_FANOUTS,
    PaddedBatch,
    PaddedLayout,
    fitted_caps,
    padded_layout,
)

FEAT, CLASSES = 6, 4


@pytest.fixture(autouse=True)
def _torch_kernels():
    before = get_kernels()
    set_kernels("torch")
    yield
    set_kernels(before)


def random_blocks(
    n_seeds: int, fanouts: tuple[int, ...], n_solid: int, seed: int, full: bool = False
) -> list[Block]:
    """Blocks of one rank within the bounds, built top down: each row up to ``f`` edges
    (exactly ``f`` with ``full``), up to one new source per edge and ``n_solid`` sources in
    all (with ``full`` every edge a new source, so every size is at its bound when
    ``n_solid`` does not cap it)."""
    rng = np.random.default_rng(seed)
    blocks, n_dst = [], n_seeds
    for fanout in reversed(fanouts):
        degrees = np.full(n_dst, fanout) if full else rng.integers(0, fanout + 1, n_dst)
        nnz = int(degrees.sum())
        most = min(nnz, n_solid - n_dst)
        new = most if full else int(rng.integers(0, most + 1))
        n_src = n_dst + new
        if full:
            indices = n_dst + np.arange(nnz)
        else:
            indices = rng.integers(0, n_src, nnz)
            indices[:new] = n_dst + np.arange(new)  # every new source has an edge
            rng.shuffle(indices)
        indptr = np.concatenate([[0], np.cumsum(degrees)])
        blocks.append(
            Block(
                n_dst, n_src, 0, torch.as_tensor(indptr, dtype=torch.int64),
                torch.as_tensor(indices, dtype=torch.int64), torch.arange(n_src),
            )
        )  # fmt: skip
        n_dst = n_src
    return blocks[::-1]


def sampled_blocks(n_seeds: int, fanouts: tuple[int, ...]) -> tuple[list[Block], int]:
    """A mini-batch of the C++ sampler on a small graph (bounds capped by ``n_solid``)."""
    local = LocalGraph.from_graph(random_graph(n=60, m=400, feat_dim=FEAT, classes=CLASSES))
    sampler = NeighborSampler(
        local.indptr, local.indices, local.n_solid, local.n_local, fanouts, seed=3
    )
    seeds = torch.as_tensor(local.train_idx[:n_seeds])
    return sampler.sample(seeds, epoch=0, iteration=1), local.n_solid


def make_model(name: str, num_layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "gat_self_loops":
        return GAT(FEAT, 5, CLASSES, num_layers=num_layers, heads=2, dropout=0.0, self_loops=True)
    if name == "gat":
        return GAT(FEAT, 5, CLASSES, num_layers=num_layers, heads=2, dropout=0.0)
    return build_model(name, FEAT, 5, CLASSES, num_layers=num_layers, heads=2, dropout=0.0)


def loss_and_grads(
    model: torch.nn.Module, blocks: list[Block], x: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(blocks, x)[: labels.shape[0]]
    loss = F.cross_entropy(logits, labels, reduction="sum")
    loss.backward()
    return logits.detach(), loss.detach(), [p.grad.clone() for p in model.parameters()]


def check_padded_equals_unpadded(
    name: str,
    blocks: list[Block],
    fanouts: tuple[int, ...],
    n_solid: int,
    layout: PaddedLayout | None = None,
) -> PaddedBatch:
    n_seeds = blocks[-1].n_dst
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(blocks[0].n_src, FEAT, generator=gen)
    labels = torch.randint(0, CLASSES, (n_seeds,), generator=gen)
    layout = padded_layout(n_seeds, fanouts, n_solid) if layout is None else layout
    padded = PaddedBatch(layout, FEAT, x.dtype, x.device)
    padded.fill(blocks, x, labels)
    model = make_model(name, len(fanouts))
    # Layer by layer: the real rows of every layer's output, where the layout puts them.
    h, h_pad = x, padded.x
    for layer, (block, block_pad) in enumerate(zip(blocks, padded.blocks(), strict=True)):
        h = model.forward_layer(layer, block, h)
        h_pad = model.forward_layer(layer, block_pad, h_pad)
        assert h_pad.shape[0] == padded.layout.dst_rows[layer]
        real = h_pad[padded.positions[: block.n_dst]]
        torch.testing.assert_close(real, h, rtol=1e-5, atol=1e-6)
        h, h_pad = h.detach(), h_pad.detach()
    # The whole step: logits, loss and every parameter's gradient.
    logits, loss, grads = loss_and_grads(model, blocks, x, labels)
    logits_p, loss_p, grads_p = loss_and_grads(model, padded.blocks(), padded.x, padded.labels)
    torch.testing.assert_close(logits_p, logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss_p, loss, rtol=1e-5, atol=1e-6)
    for g_p, g in zip(grads_p, grads, strict=True):
        torch.testing.assert_close(g_p, g, rtol=1e-5, atol=1e-6)
    return padded


@pytest.mark.parametrize("name", ["sage", "gcn", "gin", "gat", "gat_self_loops"])
def test_padded_model_equals_unpadded(name):
    fanouts = (3, 2)
    blocks = random_blocks(7, fanouts, n_solid=10_000, seed=4)
    check_padded_equals_unpadded(name, blocks, fanouts, 10_000)


@pytest.mark.parametrize("name", ["sage", "gcn"])
def test_padded_sampled_batch_with_capped_bounds(name):
    """The C++ sampler's blocks on a 60-vertex graph: the bounds are capped by n_solid."""
    fanouts = (4, 3)
    blocks, n_solid = sampled_blocks(9, fanouts)
    bounds = destination_bounds(9, fanouts, n_solid)
    assert bounds[0] == 9 * 4 or n_solid < 9 * 4
    assert min(9 * 4 * 5, n_solid) == n_solid  # the input layer's bound is capped
    check_padded_equals_unpadded(name, blocks, fanouts, n_solid)


@pytest.mark.parametrize("name", ["sage", "gcn", "gat_self_loops"])
def test_a_batch_at_its_bounds(name):
    """Every size at its bound: the padded rows are the sinks (and their rows in the layers
    below), which own no padding edge."""
    fanouts = (2, 3)
    blocks = random_blocks(5, fanouts, n_solid=10_000, seed=2, full=True)
    layout = padded_layout(5, fanouts, 10_000)
    for layer, block in enumerate(blocks):
        assert block.n_src - block.n_dst == layout.new_sources[layer]
        assert block.num_edges == layout.edges[layer]
    padded = check_padded_equals_unpadded(name, blocks, fanouts, 10_000)
    # Sinks: ceil(D f / 16 f); rows: seeds, top sink, 15 new sources, 2 sinks, 40 new.
    assert layout.sinks == (2, 1)
    assert layout.dst_rows == (5 + 1 + 15 + 2, 5 + 1)
    assert layout.src_rows == (23 + 40, 23)
    for layer, indptr in enumerate(padded.indptr):  # every sink row is empty
        assert (indptr[layout.first_sink(layer) :] == layout.edges[layer]).all()


def test_the_last_smaller_batch_and_refills():
    """One layout per batch size; refilling a layout with a smaller batch leaves no stale
    edge or row pointer of the bigger one behind (the same buffers, other sizes)."""
    fanouts = (3, 2)
    layout = padded_layout(6, fanouts, 10_000)
    padded = PaddedBatch(layout, FEAT, torch.float32, torch.device("cpu"))
    buffers = [t.data_ptr() for t in (*padded.indptr, *padded.indices, padded.x)]
    model = make_model("gcn", 2)
    for seed, full in ((0, True), (1, False), (2, False)):
        blocks = random_blocks(6, fanouts, n_solid=10_000, seed=seed, full=full)
        x = torch.randn(blocks[0].n_src, FEAT)
        labels = torch.randint(0, CLASSES, (6,))
        padded.fill(blocks, x, labels)
        _, loss, grads = loss_and_grads(model, blocks, x, labels)
        _, loss_p, grads_p = loss_and_grads(model, padded.blocks(), padded.x, padded.labels)
        torch.testing.assert_close(loss_p, loss, rtol=1e-5, atol=1e-6)
        for g_p, g in zip(grads_p, grads, strict=True):
            torch.testing.assert_close(g_p, g, rtol=1e-5, atol=1e-6)
    assert buffers == [t.data_ptr() for t in (*padded.indptr, *padded.indices, padded.x)]
    smaller = padded_layout(5, fanouts, 10_000)
    assert smaller.dst_rows < layout.dst_rows  # its own, smaller shapes
    blocks = random_blocks(5, fanouts, n_solid=10_000, seed=3)
    with pytest.raises(ValueError, match="a batch of 5 seeds"):
        padded.fill(blocks, torch.randn(blocks[0].n_src, FEAT), torch.zeros(5, dtype=torch.int64))
    check_padded_equals_unpadded("sage", blocks, fanouts, 10_000)


def test_layout_refuses_what_has_no_bound():
    with pytest.raises(ValueError, match="positive fan-outs"):
        padded_layout(4, (-1, 3), 100)
    layout = padded_layout(4, (2, 3), 100)
    padded = PaddedBatch(layout, FEAT, torch.float32, torch.device("cpu"))
    big = random_blocks(4, (3, 3), n_solid=10_000, seed=0, full=True)  # fan-out 3 > 2 below
    assert not layout.fits(big)
    with pytest.raises(ValueError, match="layer 0: .* exceed the layout's 32 and 32"):
        padded.fill(big, torch.randn(big[0].n_src, FEAT), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="one .* pair per layer for 2 layers"):
        padded_layout(4, (2, 3), 100, caps=[(3, 8)])
    with pytest.raises(ValueError, match="one .* pair per layer"):
        padded_layout(4, (2, 3), 100, caps=[(3, 8), (3, 0)])


@pytest.mark.parametrize("name", ["sage", "gcn", "gat_self_loops"])
def test_a_fitted_layout_is_smaller_and_still_exact(name):
    """A layout fitted to a batch (its sizes with headroom, far below the bounds, which count
    every sampled neighbour as new): the batch fits it, the padded step equals the unpadded
    one on it as on the bounds' layout, and it has fewer rows and edges; a batch beyond a
    cap does not fit it."""
    fanouts = (4, 3)
    blocks, n_solid = sampled_blocks(9, fanouts)
    bounds = padded_layout(9, fanouts, n_solid)
    caps = fitted_caps(blocks, fanouts)
    # The caps: the counts plus max(10 %, 4 square roots), edges at least one sink's c_l.
    for (new, edges), block, fanout in zip(caps, blocks, fanouts, strict=True):
        k, nnz = block.n_src - block.n_dst, block.num_edges
        assert new == k + math.ceil(max(0.1 * k, 4 * math.sqrt(k)))
        assert edges == max(nnz + math.ceil(max(0.1 * nnz, 4 * math.sqrt(nnz))), 16 * fanout)
    fitted = padded_layout(9, fanouts, n_solid, caps)
    assert fitted.fits(blocks) and bounds.fits(blocks)
    capped = zip(caps, bounds.new_sources, bounds.edges, strict=True)
    assert [(fitted.new_sources[i], fitted.edges[i]) for i in range(2)] == [
        (min(k, bound_k), min(e, bound_e)) for (k, e), bound_k, bound_e in capped
    ]
    assert fitted.input_rows < bounds.input_rows and sum(fitted.edges) <= sum(bounds.edges)
    padded = check_padded_equals_unpadded(name, blocks, fanouts, n_solid, layout=fitted)
    assert padded.layout == fitted
    # Fitting is exact: caps of the batch's own sizes fit it, one new source fewer does not.
    exact = [(b.n_src - b.n_dst, max(b.num_edges, 1)) for b in blocks]
    assert padded_layout(9, fanouts, n_solid, exact).fits(blocks)
    short = [(exact[0][0] - 1, exact[0][1]), exact[1]]
    assert not padded_layout(9, fanouts, n_solid, short).fits(blocks)


def test_padded_sage_with_the_triton_aggregation():
    """The Triton CSR aggregation (under the interpreter on CPU tensors) on padded blocks."""
    from distmb.nn.kernels import triton_aggregate

    x = torch.zeros(2, 2)
    if not triton_aggregate.supports(x):
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1, set by conftest)")
    set_kernels("triton")
    fanouts = (2, 2)
    blocks = random_blocks(3, fanouts, n_solid=10_000, seed=5)
    check_padded_equals_unpadded("sage", blocks, fanouts, 10_000)


def refill_census(padded: PaddedBatch, blocks: list[Block], x: torch.Tensor,
                  labels: torch.Tensor) -> tuple[int, int, Counter, Counter]:  # fmt: skip
    """One :meth:`PaddedBatch.fill` counted as the op census counts an iteration: ``(ATen ops
    that launch, Triton launches, every op by name, the sync-prone ops)``; views,
    allocations and the interpreter's own ops are not launches."""
    from distmb.engine.op_census import _OpCounter, _wrap, triton_kernel_classes

    counter, undo = _OpCounter(), []
    for kernel_class in triton_kernel_classes():
        _wrap(kernel_class, "run", counter.kernel, undo)
    try:
        with counter:
            padded.fill(blocks, x, labels)
    finally:
        for restore in reversed(undo):
            restore()
    free = sum(counter.views.values()) + sum(counter.launch_free.values())
    launching = sum(counter.ops.values()) - free
    return launching, sum(counter.triton.values()), counter.by_name, counter.syncing


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(("n_seeds", "fanouts"), [(20, (3, 2)), (6, (2, 2, 3)), (40, (2, 3, 2))])
def test_a_refill_launches_what_launches_counts_without_a_read(backend, n_seeds, fanouts):
    """The refill's launches as the census counts them. Torch ops: ``L`` aranges, per layer
    5 (4 at the top, 1 less where a layer has one sink), the input rows and the labels:
    ``6 L + 1`` at most. Triton: one kernel per layer and one for the input rows and labels,
    no ATen op. None would read the device back on a GPU."""
    if backend == "triton":
        require_triton("cpu")
    blocks = random_blocks(n_seeds, fanouts, n_solid=10_000, seed=1)
    layout = padded_layout(n_seeds, fanouts, 10_000)
    padded = PaddedBatch(layout, FEAT, torch.float32, torch.device("cpu"), backend=backend)
    x, labels = torch.randn(blocks[0].n_src, FEAT), torch.zeros(n_seeds, dtype=torch.int64)
    launching, triton_launches, by_name, syncing = refill_census(padded, blocks, x, labels)
    one_sink = sum(r == 1 for r in layout.sinks)
    if backend == "torch":
        expected = (6 * len(fanouts) + 1 - one_sink, 0)
    else:
        expected = (0, len(fanouts) + 1)
    assert (launching, triton_launches) == expected, by_name
    assert launching + triton_launches == padded.launches()
    assert sum(syncing.values()) == 0, dict(by_name)
    assert one_sink == (n_seeds <= PADDING_ROW_FANOUTS)  # only a small top layer has one


def test_no_row_owns_more_than_its_share_of_padding_edges():
    """A batch leaves many edge slots as padding: they are spread over the sinks, at most
    ``c_l`` a row and a source, not piled on one row (which a row-tiled kernel would walk in
    one tile)."""
    fanouts = (3, 4)
    blocks = random_blocks(100, fanouts, n_solid=10_000, seed=6)
    layout = padded_layout(100, fanouts, 10_000)
    padded = check_padded_equals_unpadded("gcn", blocks, fanouts, 10_000)
    for layer, block in enumerate(padded.blocks()):
        degrees = block.indptr[1:] - block.indptr[:-1]
        out_degrees = torch.bincount(block.indices, minlength=block.n_src)
        sinks = slice(layout.first_sink(layer), layout.dst_rows[layer])
        limit, padding = layout.sink_edges[layer], layout.edges[layer] - blocks[layer].num_edges
        assert padding > 2 * limit  # several sinks share them
        assert int(degrees[sinks].sum()) == int(out_degrees[sinks].sum()) == padding
        assert int(degrees.max()) <= limit and int(out_degrees[sinks].max()) <= limit
