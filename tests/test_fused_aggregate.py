"""The fused C++ AGG kernels (distmb.nn.kernels.cpu_aggregate) against PyTorch references.

Every fused function runs in float32 and is compared, values and every gradient, with the
``"torch"`` path of :mod:`distmb.nn.aggregate` evaluated in float64 (an independent
implementation: CSR sparse matmul, ``segment_reduce``, ``index_add``), on awkward shapes (no
edges, zero-degree destinations, ``n_dst = 1``, widths that are not a multiple of the SIMD
width or of the 64-float register tile) and at 1 and 2 OpenMP threads. Also: bitwise
independence of the thread count, the transposed CSR and its cache, error handling, and the
dtype dispatch (float64 stays on the PyTorch path).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from torch import Tensor

from distmb import _C
from distmb.nn import GATConv, SAGEConv
from distmb.nn.kernels import cpu_aggregate as fused
from distmb.nn.kernels.dispatch import get_kernels, set_kernels
from distmb.pipeline.sample import Block

# distmb.nn re-exports the function ``aggregate``, which shadows the module attribute.
agg = importlib.import_module("distmb.nn.aggregate")

#: float32 kernels against the float64 reference.
ATOL, RTOL = 2e-5, 2e-4
THREADS = [1, 2]
#: Feature widths: 1, odd, one past a 32-lane multiple, exactly the 64-float tile, tile + tail.
WIDTHS = [1, 7, 33, 64, 130]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _restore_state() -> Iterator[None]:
    threads, kernels = _C.get_num_threads(), get_kernels()
    yield
    _C.set_num_threads(threads)
    set_kernels(kernels)


def make_block(
    n_dst: int, n_src: int, max_deg: int, seed: int = 0, zero_frac: float = 0.25
) -> Block:
    """Random block: degrees up to max_deg (some forced to 0), power-law-ish repeated sources,
    duplicate edges allowed."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, max_deg + 1, n_dst)
    deg[rng.random(n_dst) < zero_frac] = 0
    indptr = np.zeros(n_dst + 1, np.int64)
    indptr[1:] = np.cumsum(deg)
    popularity = (np.arange(n_src) + 1.0) ** -0.7
    indices = rng.choice(n_src, int(indptr[-1]), p=popularity / popularity.sum())
    return Block(
        n_dst,
        n_src,
        0,
        torch.from_numpy(indptr),
        torch.from_numpy(indices.astype(np.int64)),
        torch.arange(n_src, dtype=torch.int64),
    )


def no_edge_block(n_dst: int = 3, n_src: int = 5) -> Block:
    return Block(
        n_dst,
        n_src,
        0,
        torch.zeros(n_dst + 1, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        torch.arange(n_src, dtype=torch.int64),
    )


# (n_dst, n_src, max_deg): n_dst = 1, tiny, ordinary, and one large enough for 2 threads to
# split the rows into several chunks.
SHAPES = [(1, 1, 1), (1, 6, 4), (7, 20, 5), (60, 150, 12), (1500, 4000, 16)]


def blocks() -> list[tuple[str, Block]]:
    out = [(f"{s[0]}x{s[1]}", make_block(*s, seed=sum(s))) for s in SHAPES]
    return [*out, ("no-edges", no_edge_block())]


def run_both(
    fn: Callable[..., Tensor], inputs: list[Tensor], seed: int = 1
) -> tuple[list[Tensor], list[Tensor]]:
    """fn on the float32 inputs (fused path) and on float64 copies ("torch" path): the output
    followed by the gradients of <output, g> for a random g, for each."""
    results = []
    for kernels, dtype in (("fused", torch.float32), ("torch", torch.float64)):
        set_kernels(kernels)
        ins = [t.detach().to(dtype).requires_grad_(True) for t in inputs]
        out = fn(*ins)
        gen = torch.Generator().manual_seed(seed)
        g = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(dtype)
        grads = torch.autograd.grad(out, ins, g, allow_unused=True)
        grads = [torch.zeros_like(t) if d is None else d for t, d in zip(ins, grads, strict=True)]
        results.append([out.detach(), *grads])
    return results[0], results[1]


def assert_matches(got: list[Tensor], want: list[Tensor]) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float32
        assert a.shape == b.shape
        torch.testing.assert_close(a.double(), b, atol=ATOL, rtol=RTOL)


def randn(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- aggregate


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("kind", agg.AGGREGATORS)
@pytest.mark.parametrize("width", WIDTHS)
def test_aggregate_matches_reference(threads: int, kind: str, width: int) -> None:
    _C.set_num_threads(threads)
    for _, block in blocks():
        x = randn(block.n_src, width, seed=width)
        got, want = run_both(lambda t, b=block: agg.aggregate(b, t, kind), [x])
        assert_matches(got, want)


@pytest.mark.parametrize("kind", agg.AGGREGATORS)
def test_aggregate_by_hand_and_feature_shapes(kind: str) -> None:
    # dst 0 <- {1, 3}, dst 1 <- {}, dst 2 <- {0, 0} (a duplicate edge counts twice).
    block = Block(
        3,
        4,
        0,
        torch.tensor([0, 2, 2, 4]),
        torch.tensor([1, 3, 0, 0]),
        torch.arange(4),
    )
    x = torch.tensor([1.0, 2.0, 4.0, 8.0]).unsqueeze(1)
    expected = {
        "sum": [10.0, 0.0, 2.0],
        "mean": [5.0, 0.0, 1.0],
        "gcn": [11.0 / 3, 2.0, 6.0 / 3],
    }[kind]
    torch.testing.assert_close(agg.aggregate(block, x, kind).flatten(), torch.tensor(expected))
    # Multi-dimensional features [n_src, H, D] and a non-contiguous input.
    x3 = randn(4, 5, 3).transpose(1, 2)
    got, want = run_both(lambda t: agg.aggregate(block, t, kind), [x3])
    assert got[0].shape == (3, 3, 5)
    assert_matches(got, want)


@pytest.mark.parametrize("kind", agg.AGGREGATORS)
def test_aggregate_thread_count_independent(kind: str) -> None:
    block = make_block(3000, 5000, 20, seed=4)
    x = randn(block.n_src, 70).requires_grad_(True)
    g = randn(block.n_dst, 70, seed=1)
    results = []
    for threads in THREADS:
        _C.set_num_threads(threads)
        block = Block(*(getattr(block, f) for f in block.__dataclass_fields__))  # fresh cache
        out = fused.aggregate(block, x, kind)
        (grad,) = torch.autograd.grad(out, [x], g)
        results.append((out, grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_aggregate_large_values_in_every_lane() -> None:
    """Every feature column and every edge contributes (catches a skipped tile or tail)."""
    block = make_block(50, 80, 9, seed=2, zero_frac=0.0)
    width = 64 + 64 + 5
    x = torch.arange(block.n_src * width, dtype=torch.float32).reshape(block.n_src, width)
    got, want = run_both(lambda t: agg.aggregate(block, t, "sum"), [x / 1000])
    assert_matches(got, want)


# --------------------------------------------------------------------------- transposed CSR


@pytest.mark.parametrize("threads", THREADS)
def test_block_transpose(threads: int) -> None:
    _C.set_num_threads(threads)
    for _, block in blocks():
        t = fused.block_transpose(block)
        indices = block.indices.numpy()
        order = np.argsort(indices, kind="stable")  # edges by source, ascending edge ids
        counts = np.bincount(indices, minlength=block.n_src)
        assert t.indptr.tolist() == [0, *np.cumsum(counts).tolist()]
        assert t.edges.tolist() == order.tolist()
        assert t.dst.tolist() == block.dst_of_edges().numpy()[order].tolist()


def test_block_transpose_parallel_order() -> None:
    """Many edges per source from rows that both threads work on: the atomic slot claims of
    the parallel transposition interleave, and the segment sort must restore edge order."""
    _C.set_num_threads(2)
    block = make_block(20_000, 300, 16, seed=11, zero_frac=0.0)
    t = fused.block_transpose(block)
    order = np.argsort(block.indices.numpy(), kind="stable")
    assert np.array_equal(t.edges.numpy(), order)
    assert np.array_equal(t.dst.numpy(), block.dst_of_edges().numpy()[order])


def test_block_transpose_cache() -> None:
    block = make_block(40, 90, 6, seed=3)
    first = fused.block_transpose(block)
    assert fused.block_transpose(block) is first
    # An in-place change of the CSR invalidates the cache.
    block.indices[0] = (int(block.indices[0]) + 1) % block.n_src
    second = fused.block_transpose(block)
    assert second is not first
    assert second.edges.tolist() == np.argsort(block.indices.numpy(), kind="stable").tolist()
    # Backward passes reuse the cached transpose.
    x = randn(block.n_src, 3).requires_grad_(True)
    fused.aggregate(block, x, "mean").sum().backward()
    assert fused.block_transpose(block) is second


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("heads", [1, 4])
def test_edge_softmax_matches_reference(threads: int, heads: int) -> None:
    _C.set_num_threads(threads)
    for _, block in blocks():
        scores = randn(block.num_edges, heads, seed=heads) * 4
        got, want = run_both(lambda s, b=block: agg.edge_softmax(b, s), [scores])
        assert_matches(got, want)


def test_edge_softmax_stable_and_trailing_shape() -> None:
    block = make_block(200, 300, 10, seed=5, zero_frac=0.0)
    scores = randn(block.num_edges, 2, 3) * 1e4 + 5e4  # exp would overflow without the max
    got, want = run_both(lambda s: agg.edge_softmax(block, s), [scores])
    assert torch.isfinite(got[0]).all()
    assert_matches(got, want)
    sums = torch.zeros(200, 2, 3).index_add_(0, block.dst_of_edges(), got[0])
    has_edges = block.indptr[1:] > block.indptr[:-1]
    torch.testing.assert_close(sums[has_edges], torch.ones_like(sums[has_edges]))
    assert agg.edge_softmax(no_edge_block(), torch.zeros(0, 4)).shape == (0, 4)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("heads,dim", [(1, 1), (1, 33), (4, 7), (4, 64), (2, 100)])
def test_weighted_aggregate_matches_reference(threads: int, heads: int, dim: int) -> None:
    _C.set_num_threads(threads)
    for _, block in blocks():
        w = randn(block.num_edges, heads, seed=dim).abs()
        x = randn(block.n_src, heads, dim, seed=heads)
        got, want = run_both(lambda a, t, b=block: agg.weighted_aggregate(b, a, t), [w, x])
        assert_matches(got, want)


@pytest.mark.parametrize("need", ["weights", "x"])
def test_weighted_aggregate_single_gradient(need: str) -> None:
    block = make_block(60, 150, 12, seed=6)
    w = randn(block.num_edges, 3, seed=1).requires_grad_(need == "weights")
    x = randn(block.n_src, 3, 20, seed=2).requires_grad_(need == "x")
    g = randn(block.n_dst, 3, 20, seed=3)
    target = w if need == "weights" else x
    (got,) = torch.autograd.grad(fused.weighted_aggregate(block, w, x), [target], g)
    set_kernels("torch")
    (want,) = torch.autograd.grad(agg.weighted_aggregate(block, w, x), [target], g)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("heads", [1, 4])
def test_attention_softmax_matches_reference(threads: int, heads: int) -> None:
    _C.set_num_threads(threads)
    for _, block in blocks():
        el = randn(block.n_src, heads, seed=1) * 3
        er = randn(block.n_dst, heads, seed=2) * 3
        got, want = run_both(
            lambda a, c, b=block: agg.attention_softmax(b, a, c, negative_slope=0.2), [el, er]
        )
        assert_matches(got, want)


@pytest.mark.parametrize("need", ["el", "er"])
def test_attention_softmax_single_gradient(need: str) -> None:
    block = make_block(1500, 4000, 16, seed=12)
    el = randn(block.n_src, 2, seed=1).requires_grad_(need == "el")
    er = randn(block.n_dst, 2, seed=2).requires_grad_(need == "er")
    g = randn(block.num_edges, 2, seed=3)
    target = el if need == "el" else er
    (got,) = torch.autograd.grad(fused.gat_attention(block, el, er, 0.2), [target], g)
    set_kernels("torch")
    (want,) = torch.autograd.grad(agg.attention_softmax(block, el, er, 0.2), [target], g)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


def test_attention_softmax_is_the_gat_logits() -> None:
    """attention_softmax == edge_softmax(LeakyReLU(el[src] + er[dst])) as GATConv writes it."""
    block = make_block(60, 150, 12, seed=7)
    el, er = randn(block.n_src, 3, seed=1), randn(block.n_dst, 3, seed=2)
    scores = torch.nn.functional.leaky_relu(
        el[block.indices] + er[block.dst_of_edges()], negative_slope=0.3
    )
    torch.testing.assert_close(
        agg.attention_softmax(block, el, er, 0.3), agg.edge_softmax(block, scores)
    )
    with pytest.raises(ValueError, match="expected el"):
        agg.attention_softmax(block, el, er[:-1], 0.2)


# --------------------------------------------------------------------------- layers


def fused_vs_torch_layer(conv: torch.nn.Module, block: Block, x: Tensor) -> None:
    """The layer's output and the gradients of its input and parameters, fused vs "torch"
    (both float32)."""
    results = []
    for kernels in ("fused", "torch"):
        set_kernels(kernels)
        conv.zero_grad()
        xi = x.clone().requires_grad_(True)
        out = conv(block, xi)
        out.backward(randn(*out.shape, seed=5))
        results.append([out.detach(), xi.grad, *(p.grad.clone() for p in conv.parameters())])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("aggr", agg.AGGREGATORS)
def test_sage_layer_fused_matches_torch(aggr: str) -> None:
    torch.manual_seed(0)
    block = make_block(300, 700, 10, seed=8)
    for dims in [(20, 35), (35, 20)]:  # aggregate before / after the projection
        fused_vs_torch_layer(SAGEConv(*dims, aggr=aggr), block, randn(block.n_src, dims[0]))


@pytest.mark.parametrize("self_loops", [False, True])
def test_gat_layer_fused_matches_torch(self_loops: bool) -> None:
    torch.manual_seed(1)
    block = make_block(300, 700, 10, seed=9)
    conv = GATConv(12, 9, heads=4, self_loops=self_loops)
    fused_vs_torch_layer(conv, block, randn(block.n_src, 12))


# --------------------------------------------------------------------------- dispatch / errors


def test_dispatch_by_dtype_and_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = fused.aggregate

    def spy(block: Block, x: Tensor, kind: str) -> Tensor:
        calls.append(str(x.dtype))
        return real(block, x, kind)

    monkeypatch.setattr(fused, "aggregate", spy)
    block = make_block(7, 20, 5)
    agg.aggregate(block, randn(20, 3), "mean")
    agg.aggregate(block, randn(20, 3).double(), "mean")  # float64: PyTorch path
    set_kernels("torch")
    agg.aggregate(block, randn(20, 3), "mean")
    assert calls == ["torch.float32"]


def test_invalid_blocks_raise() -> None:
    bad_index = Block(2, 3, 0, torch.tensor([0, 1, 2]), torch.tensor([0, 3]), torch.arange(3))
    with pytest.raises(IndexError, match="outside"):
        fused.aggregate(bad_index, randn(3, 4), "sum")
    with pytest.raises(IndexError, match="outside"):
        fused.block_transpose(bad_index)
    with pytest.raises(IndexError, match="outside"):
        fused.weighted_aggregate(bad_index, randn(2, 1), randn(3, 1, 4))
    decreasing = Block(2, 3, 0, torch.tensor([0, 2, 1]), torch.tensor([0]), torch.arange(3))
    for fn in (
        lambda: fused.aggregate(decreasing, randn(3, 4), "mean"),
        lambda: fused.edge_softmax(decreasing, randn(1, 2)),
        lambda: fused.gat_attention(decreasing, randn(3, 2), randn(2, 2), 0.2),
    ):
        with pytest.raises(IndexError, match="decreasing indptr"):
            fn()
    ok = make_block(7, 20, 5)
    with pytest.raises(ValueError, match="writeable float32"):
        _C.aggregate_forward(
            ok.indptr.numpy(),
            ok.indices.numpy(),
            20,
            randn(20, 4).numpy(),
            4,
            "mean",
            np.empty((7, 4), np.float64),
        )
    with pytest.raises(ValueError, match="unknown aggregator"):
        _C.aggregate_forward(
            ok.indptr.numpy(),
            ok.indices.numpy(),
            20,
            randn(20, 4).numpy(),
            4,
            "max",
            np.empty((7, 4), np.float32),
        )


def test_stream_copy() -> None:
    src = randn(100_003)
    dst = torch.empty_like(src)
    fused.stream_copy(src, dst)
    assert torch.equal(src, dst)


def test_transposed_csr_is_checked_alike_by_every_backward_kernel() -> None:
    """aggregate, GAT attention and weighted aggregation backward share one check of the
    transposed CSR: it must start at 0 and end at the block's edge count."""
    ip = np.array([0, 1, 2], dtype=np.int64)
    ix = np.array([0, 1], dtype=np.int64)
    edges = np.array([0, 1], dtype=np.int64)
    f32 = lambda *shape: np.zeros(shape, dtype=np.float32)  # noqa: E731
    for t_ip in (np.array([1, 1, 2], np.int64), np.array([0, 1, 1], np.int64)):
        with pytest.raises(ValueError, match="aggregate_backward: t_indptr must start at 0"):
            _C.aggregate_backward(ip, t_ip, edges, f32(2, 3), 3, "sum", f32(2, 3))
        with pytest.raises(ValueError, match="gat_attention_backward: t_indptr must start at 0"):
            _C.gat_attention_backward(
                ip, ix, t_ip, edges, f32(2), f32(2), f32(2), f32(2), 1, 0.2, None, None
            )
        with pytest.raises(
            ValueError, match="weighted_aggregate_backward: t_indptr must start at 0"
        ):
            _C.weighted_aggregate_backward(
                t_ip, edges, edges, f32(2), f32(2, 3), f32(2, 3), 2, 1, 3, None, None
            )


@pytest.mark.parametrize("kind", ["mean", "sum", "gcn"])
@pytest.mark.parametrize("n_addend", [0, 4, 7])
def test_aggregate_backward_adds_addend_to_first_rows(kind: str, n_addend: int) -> None:
    """grad_x = (dense aggregation matrix)^T @ grad_out, plus the addend on rows < n_addend."""
    block = make_block(5, 9, 4, seed=3)
    grad_out = randn(5, 6, seed=1).double()
    addend = randn(n_addend, 6, seed=2).double()
    matrix = torch.zeros(5, 9, dtype=torch.float64)
    deg = (block.indptr[1:] - block.indptr[:-1]).double()
    for v in range(5):
        weight = {"sum": 1.0, "mean": 1.0 / max(deg[v], 1), "gcn": 1 / (deg[v] + 1)}[kind]
        for k in range(int(block.indptr[v]), int(block.indptr[v + 1])):
            matrix[v, int(block.indices[k])] += weight
        if kind == "gcn":
            matrix[v, v] += 1.0 / (deg[v] + 1)
    want = matrix.T @ grad_out
    want[:n_addend] += addend
    got = fused.aggregate_backward(block, kind, grad_out.float(), addend.float())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_aggregate_backward_addend_checked() -> None:
    block = make_block(5, 9, 4, seed=3)
    t = fused.block_transpose(block)
    args = (block.indptr.numpy(), t.indptr.numpy(), t.dst.numpy(), randn(5, 6).numpy(), 6, "sum")
    with pytest.raises(ValueError, match="addend must be"):
        _C.aggregate_backward(*args, randn(9, 6).numpy(), randn(10, 6).numpy())
    with pytest.raises(ValueError, match="addend must be"):
        _C.aggregate_backward(*args, randn(9, 6).numpy(), randn(3, 5).numpy())
