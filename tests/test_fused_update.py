"""Fused UPDATE kernels (csrc/kernels/update/, nn.kernels.cpu_update) against float64 references.

Every kernel runs in float32 and is compared with the same equations evaluated in float64 by
PyTorch (values and autograd gradients of a random linear functional of the outputs), on
awkward shapes (rows not a multiple of the row tile or block, widths not multiples of the
vector width, N = 0 and 1) and with 1 and 2 OpenMP threads. Dropout is compared against a
reference that applies the mask exposed by :func:`distmb.nn.kernels.cpu_update.dropout_mask`.
Layer tests run SAGEConv / GATConv with kernels "fused" and "torch" in the same process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from conftest import KERNEL_THREADS, make_block
from torch import Tensor

from distmb import _C
from distmb.nn import (
    AGGREGATORS,
    GATConv,
    GCNConv,
    SAGEConv,
    build_model,
)
from distmb.nn.kernels import cpu_aggregate as fused_aggregate
from distmb.nn.kernels import cpu_update as fused_update
from distmb.nn.kernels.dispatch import get_kernels, set_kernels
from distmb.pipeline.sample import Block

F64 = torch.float64
#: float32 kernels vs float64 reference: relative tolerance, and absolute tolerance per unit
#: of sqrt(summed terms) (rounding errors of a float32 sum grow like sqrt(length) * eps).
RTOL, ATOL_UNIT = 2e-5, 2e-6
#: z-score bound of the binomial keep-rate tests (false alarm rate ~ 6e-7 per check).
Z_BOUND = 5.0

# (n, c, k): rows, input width, output width. 8-row tiles, 64-row forward / 128-row backward
# blocks, 16/32-wide column tiles: these miss every multiple on purpose.
# (n, c, k). 1100 rows: several backward row blocks per work chunk at 1 and 2 threads, so the
# weight gradient accumulates over blocks and the next block is prefetched while one computes.
SAGE_SHAPES = [
    (0, 5, 3), (1, 1, 1), (1, 3, 5), (7, 13, 47), (67, 17, 33), (131, 100, 40), (1100, 24, 40)
]  # fmt: skip
# (n, c, heads, d).
GAT_SHAPES = [
    (0, 3, 2, 4), (1, 1, 1, 1), (9, 13, 3, 5), (70, 20, 1, 47), (131, 33, 4, 8), (1100, 9, 2, 12)
]  # fmt: skip


@pytest.fixture
def kernels_backend() -> Iterator[None]:
    before = get_kernels()
    yield
    set_kernels(before)


def rand(*shape: int, gen: torch.Generator, scale: float = 1.0) -> Tensor:
    return (torch.randn(*shape, generator=gen) * scale).requires_grad_(True)


def assert_close32(got: Tensor, want: Tensor, terms: int) -> None:
    """float32 ``got`` vs float64 ``want``, a sum of about ``terms`` products per entry."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    peak = want.abs().max().item() if want.numel() else 0.0
    atol = ATOL_UNIT * math.sqrt(terms + 1) * (1.0 + peak)
    torch.testing.assert_close(got.double(), want.double(), rtol=RTOL, atol=atol)


def grads(out: Tensor | tuple[Tensor, ...], inputs: list[Tensor], seed: int) -> list[Tensor]:
    """Gradients of sum_i <out_i, g_i> for fixed random g_i (zeros for unused inputs)."""
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(seed)
    gs = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
    got = torch.autograd.grad(outs, inputs, grad_outputs=gs, allow_unused=True)
    return [torch.zeros_like(t) if d is None else d for t, d in zip(inputs, got, strict=True)]


# --------------------------------------------------------------------------- SAGE UPDATE


def ref_update(
    sources: list[tuple[Tensor, Tensor]],
    bias: Tensor,
    addend: Tensor | None,
    activation: bool,
    keep: Tensor | None,
    p: float,
) -> Tensor:
    """Float64 ``Dropout(ReLU(sum x W^T + addend + b))`` with a given keep mask."""
    h = bias.double()
    for x, w in sources:
        h = h + x.double() @ w.double().T
    if addend is not None:
        h = h + addend.double()
    if activation:
        h = torch.relu(h)
        if keep is not None:
            h = h * keep.double() / (1.0 - p)
    return h


@pytest.mark.parametrize("shape", SAGE_SHAPES, ids=str)
@pytest.mark.parametrize(
    "nsrc,with_addend", [(2, False), (1, True), (0, True), (1, False)], ids=str
)
@pytest.mark.parametrize("activation,p", [(True, 0.0), (True, 0.4), (False, 0.0)], ids=str)
def test_sage_update_matches_float64(
    threads: int,
    shape: tuple[int, int, int],
    nsrc: int,
    with_addend: bool,
    activation: bool,
    p: float,
) -> None:
    n, c, k = shape
    gen = torch.Generator().manual_seed(n * 1000 + c * 10 + k)
    sources = [(rand(n, c, gen=gen), rand(k, c, gen=gen, scale=c**-0.5)) for _ in range(nsrc)]
    bias = rand(k, gen=gen)
    addend = rand(n, k, gen=gen) if with_addend else None
    seed = 12345 + n
    out = fused_update.sage_update(sources, bias, addend, activation, p, seed=seed)
    keep = fused_update.dropout_mask(seed, n, k, p) if activation and p > 0 else None
    want = ref_update(sources, bias, addend, activation, keep, p)
    terms = nsrc * c + 2
    assert_close32(out, want, terms)

    inputs = [t for pair in sources for t in pair] + [bias] + ([addend] if with_addend else [])
    for got, ref in zip(grads(out, inputs, 7), grads(want, inputs, 7), strict=True):
        assert_close32(got, ref, n + k + c)


def test_sage_update_gradients_only_where_needed() -> None:
    gen = torch.Generator().manual_seed(0)
    x, w, b = rand(9, 4, gen=gen), rand(3, 4, gen=gen), rand(3, gen=gen)
    x.requires_grad_(False)
    out = fused_update.sage_update([(x, w)], b)
    out.sum().backward()
    assert x.grad is None and w.grad is not None and b.grad is not None
    # Inference without autograd.
    with torch.no_grad():
        assert not fused_update.sage_update([(x, w)], b).requires_grad


def test_linear_matches_matmul(threads: int) -> None:
    gen = torch.Generator().manual_seed(1)
    x, w = rand(75, 19, gen=gen), rand(21, 19, gen=gen)
    out = fused_update.linear(x, w)
    want = x.double() @ w.double().T
    assert_close32(out, want, 19)
    for got, ref in zip(grads(out, [x, w], 3), grads(want, [x, w], 3), strict=True):
        assert_close32(got, ref, 75 + 21)


def test_sage_update_errors() -> None:
    gen = torch.Generator().manual_seed(2)
    x, w, b = rand(4, 3, gen=gen), rand(2, 3, gen=gen), rand(2, gen=gen)
    with pytest.raises(ValueError, match="dropout probability"):
        fused_update.sage_update([(x, w)], b, p=1.5)
    with pytest.raises(ValueError, match="at least one source"):
        fused_update.sage_update([], b)
    with pytest.raises(ValueError, match="at most 2"):
        fused_update.sage_update([(x, w)] * 3, b)
    out = np.empty((4, 2), dtype=np.float32)
    xd = x.detach().numpy()
    with pytest.raises(ValueError, match="float32"):
        _C.update_forward([xd.astype(np.float64)], [w.detach().numpy()], None,
                          b.detach().numpy(), False, 0.0, 0, out, None)  # fmt: skip
    with pytest.raises(ValueError, match="shape"):
        _C.update_forward([xd[:3]], [w.detach().numpy()], None, b.detach().numpy(),
                          False, 0.0, 0, out, None)  # fmt: skip


# --------------------------------------------------------------------------- dropout masks


def forward_raw(n: int, k: int, p: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pre, out, gate bits) of one ReLU + dropout update_forward on fixed random data."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, 6, generator=gen).numpy()
    w = torch.randn(k, 6, generator=gen).numpy()
    b = torch.randn(k, generator=gen).numpy()
    out = np.empty((n, k), dtype=np.float32)
    bits = np.empty((n, (k + 7) // 8), dtype=np.uint8)
    _C.update_forward([x], [w], None, b, True, p, seed, out, bits)
    pre = x.astype(np.float64) @ w.astype(np.float64).T + b
    return pre, out, bits


def test_gate_bits_layout_and_output() -> None:
    n, k, p, seed = 45, 37, 0.3, 99
    pre, out, bits = forward_raw(n, k, p, seed)
    keep = fused_update.dropout_mask(seed, n, k, p).numpy()
    gate = keep & (pre > 0)
    assert np.array_equal(bits, np.packbits(gate, axis=1, bitorder="little"))
    assert np.array_equal(out > 0, gate)
    np.testing.assert_allclose(out, np.where(gate, pre / (1 - p), 0.0), rtol=1e-5, atol=1e-5)


def test_dropout_mask_reproducible_and_thread_independent() -> None:
    n, k, p = 300, 70, 0.5
    before = _C.get_num_threads()
    try:
        runs = {}
        for t in KERNEL_THREADS:
            _C.set_num_threads(t)
            runs[t] = (fused_update.dropout_mask(7, n, k, p), *forward_raw(n, k, p, 7)[1:])
    finally:
        _C.set_num_threads(before)
    (m1, out1, bits1), (m2, out2, bits2) = runs[1], runs[2]
    assert torch.equal(m1, m2) and np.array_equal(bits1, bits2) and np.array_equal(out1, out2)
    assert torch.equal(m1, fused_update.dropout_mask(7, n, k, p))
    assert not torch.equal(m1, fused_update.dropout_mask(8, n, k, p))
    # A mask is a function of (seed, row, column): a prefix of rows / columns is the same.
    assert torch.equal(fused_update.dropout_mask(7, 10, 5, p), m1[:10, :5])
    assert fused_update.dropout_mask(7, 4, 4, 0.0).all()
    assert not fused_update.dropout_mask(7, 4, 4, 1.0).any()


@pytest.mark.parametrize("p", [0.1, 0.5, 0.85])
def test_dropout_keep_rate(p: float) -> None:
    """Binomial z-tests on 2.4M units: the keep rate, and the joint rate of the column pairs
    that share one 64-bit hash (independence of the two halves), and of adjacent rows."""
    n, k = 2000, 1200
    keep = fused_update.dropout_mask(2024, n, k, p).double()
    q = 1.0 - p
    total = keep.numel()
    z = (keep.mean().item() - q) / math.sqrt(q * (1 - q) / total)
    assert abs(z) < Z_BOUND, f"keep rate {keep.mean().item():.5f} vs {q} (z = {z:.1f})"
    for both, m in [
        (keep[:, 0::2] * keep[:, 1::2], total // 2),  # the two halves of one hash
        (keep[0::2] * keep[1::2], total // 2),  # rows 2i and 2i + 1
    ]:
        z = (both.mean().item() - q * q) / math.sqrt(q * q * (1 - q * q) / m)
        assert abs(z) < Z_BOUND, f"joint keep rate {both.mean().item():.5f} vs {q * q}"


def test_seed_from_torch_generator(kernels_backend: None) -> None:
    """Training-mode dropout draws its seed from torch's generator: manual_seed and a saved
    RNG state reproduce it, and consecutive calls differ."""
    set_kernels("fused")
    gen = torch.Generator().manual_seed(3)
    x, w, b = rand(50, 8, gen=gen), rand(16, 8, gen=gen), rand(16, gen=gen)
    torch.manual_seed(11)
    first = fused_update.sage_update([(x, w)], b, p=0.5)
    second = fused_update.sage_update([(x, w)], b, p=0.5)
    assert not torch.equal(first, second)
    torch.manual_seed(11)
    assert torch.equal(fused_update.sage_update([(x, w)], b, p=0.5), first)
    state = torch.get_rng_state()
    third = fused_update.sage_update([(x, w)], b, p=0.5)
    torch.set_rng_state(state)
    assert torch.equal(fused_update.sage_update([(x, w)], b, p=0.5), third)
    torch.manual_seed(11)
    seed = fused_update.draw_seed()
    keep = fused_update.dropout_mask(seed, 50, 16, 0.5)
    torch.testing.assert_close(first, torch.relu(x @ w.T + b) * keep * 2.0)
    # No dropout outside training: the generator is not touched.
    state = torch.get_rng_state()
    fused_update.sage_update([(x, w)], b, p=0.5, training=False)
    assert torch.equal(torch.get_rng_state(), state)


# --------------------------------------------------------------------------- GAT projection


def ref_gat(
    x: Tensor, w: Tensor, b: Tensor, al: Tensor, ar: Tensor, activation: bool
) -> tuple[Tensor, Tensor, Tensor]:
    z = x.double() @ w.double().T + b.double()
    if activation:
        z = torch.relu(z)
    heads, d = al.shape
    zh = z.view(-1, heads, d)
    return z, (zh * al.double()).sum(-1), (zh * ar.double()).sum(-1)


@pytest.mark.parametrize("shape", GAT_SHAPES, ids=str)
@pytest.mark.parametrize("activation", [True, False])
def test_gat_projection_matches_float64(
    threads: int, shape: tuple[int, int, int, int], activation: bool
) -> None:
    n, c, heads, d = shape
    gen = torch.Generator().manual_seed(n + c + heads + d)
    x, w = rand(n, c, gen=gen), rand(heads * d, c, gen=gen, scale=c**-0.5)
    b, al, ar = rand(heads * d, gen=gen), rand(heads, d, gen=gen), rand(heads, d, gen=gen)
    got = fused_update.gat_projection(x, w, b, al, ar, activation)
    want = ref_gat(x, w, b, al, ar, activation)
    for g, r, terms in zip(got, want, [c, c + d, c + d], strict=True):
        assert_close32(g, r, terms)
    inputs = [x, w, b, al, ar]
    for g, r in zip(grads(got, inputs, 9), grads(want, inputs, 9), strict=True):
        assert_close32(g, r, n + heads * d + c)


# --------------------------------------------------------------------------- layers


def run_layer(
    conv: torch.nn.Module, block: Block, x: Tensor, kernels: str, seed: int = 0
) -> tuple[Tensor, list[Tensor]]:
    """Output and gradients (w.r.t. x and every parameter) with the given kernels."""
    set_kernels(kernels)
    torch.manual_seed(seed)
    out = conv(block, x)
    inputs = [x, *conv.parameters()]
    return out, grads(out, inputs, 21)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the calls of the fused entry points (to show the fused path really ran)."""
    calls = {"sage": 0, "gat": 0}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return counted

    monkeypatch.setattr(fused_update, "update_forward", wrap("sage", fused_update.update_forward))
    monkeypatch.setattr(fused_update, "gat_projection", wrap("gat", fused_update.gat_projection))
    return calls


@pytest.mark.parametrize("aggr", AGGREGATORS)
@pytest.mark.parametrize("dims", [(12, 5), (5, 12), (9, 9)], ids=str)
@pytest.mark.parametrize("activation", [True, False])
def test_sage_conv_fused_matches_torch(
    kernels_backend: None,
    spy: dict[str, int],
    aggr: str,
    dims: tuple[int, int],
    activation: bool,
) -> None:
    torch.manual_seed(0)
    conv = SAGEConv(*dims, aggr=aggr, activation=activation)
    with torch.no_grad():
        conv.bias.normal_()
    block = make_block(23, 40, 6, seed=dims[0])
    x = torch.randn(40, dims[0], requires_grad=True)
    out_f, grads_f = run_layer(conv, block, x, "fused")
    fused_calls = spy["sage"]
    assert fused_calls > 0
    out_t, grads_t = run_layer(conv, block, x, "torch")
    assert spy["sage"] == fused_calls
    torch.testing.assert_close(out_f, out_t, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads_f, grads_t, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


#: Layers with an output dropout, built with dropout ``p`` for in/out widths ``dims``.
DROPOUT_LAYERS: dict[str, Callable[[tuple[int, int], float], torch.nn.Module]] = {
    "sage": lambda dims, p: SAGEConv(*dims, aggr="mean", activation=True, dropout=p),
    "gcn": lambda dims, p: GCNConv(*dims, activation=True, dropout=p),
}


@pytest.mark.parametrize("layer", sorted(DROPOUT_LAYERS))
@pytest.mark.parametrize("dims", [(12, 5), (5, 12)], ids=str)
def test_conv_fused_dropout_uses_exposed_mask(
    kernels_backend: None, layer: str, dims: tuple[int, int]
) -> None:
    """Training-mode dropout: fused == the torch path without dropout times the mask of the
    seed the layer drew (values and gradients); without dropout (eval) both paths agree."""
    p = 0.4
    torch.manual_seed(1)
    conv = DROPOUT_LAYERS[layer](dims, p)
    with torch.no_grad():
        conv.bias.normal_()
    block = make_block(30, 50, 5, seed=4)
    x = torch.randn(50, dims[0], requires_grad=True)
    conv.train()
    out_f, grads_f = run_layer(conv, block, x, "fused", seed=77)
    torch.manual_seed(77)
    keep = fused_update.dropout_mask(fused_update.draw_seed(), 30, dims[1], p)
    assert 0 < keep.sum() < keep.numel()
    conv.eval()
    out_eval_fused = conv(block, x)
    set_kernels("torch")  # the torch path without dropout, then the same mask by hand
    ref = conv(block, x)
    torch.testing.assert_close(out_eval_fused, ref, rtol=1e-5, atol=1e-5)
    ref = ref * keep / (1.0 - p)
    torch.testing.assert_close(out_f, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads_f, grads(ref, [x, *conv.parameters()], 21), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("concat,activation", [(True, True), (False, False)])
@pytest.mark.parametrize("self_loops", [False, True])
def test_gat_conv_fused_matches_torch(
    kernels_backend: None,
    spy: dict[str, int],
    heads: int,
    concat: bool,
    activation: bool,
    self_loops: bool,
) -> None:
    torch.manual_seed(2)
    conv = GATConv(7, 6, heads, activation=activation, concat=concat, self_loops=self_loops)
    with torch.no_grad():
        conv.bias.normal_()
    block = make_block(19, 33, 5, seed=heads)
    x = torch.randn(33, 7, requires_grad=True)
    out_f, grads_f = run_layer(conv, block, x, "fused")
    assert spy["gat"] == 1
    out_t, grads_t = run_layer(conv, block, x, "torch")
    assert spy["gat"] == 1
    torch.testing.assert_close(out_f, out_t, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads_f, grads_t, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["sage", "gat"])
def test_models_fused_matches_torch_and_float64_falls_back(
    kernels_backend: None, spy: dict[str, int], name: str
) -> None:
    torch.manual_seed(4)
    model = build_model(name, 10, 8, 3, num_layers=2, heads=2, dropout=0.5).eval()
    blocks = [make_block(20, 40, 4, seed=1), make_block(6, 20, 4, seed=2)]
    x = torch.randn(40, 10)
    set_kernels("fused")
    fused = model(blocks, x)
    fused_calls = spy[name]
    assert fused_calls >= 2
    set_kernels("torch")
    torch.testing.assert_close(fused, model(blocks, x), rtol=1e-5, atol=1e-5)
    # float64 has no fused kernels: the layers take the torch path even with "fused".
    set_kernels("fused")
    model = model.double()
    model(blocks, x.double())
    assert spy[name] == fused_calls


@pytest.mark.parametrize("aggr", AGGREGATORS)
@pytest.mark.parametrize("dims", [(12, 5), (5, 12)], ids=str)
def test_sage_conv_fused_without_input_gradient(
    kernels_backend: None, monkeypatch: pytest.MonkeyPatch, aggr: str, dims: tuple[int, int]
) -> None:
    """A first layer (features need no gradient): the weight gradients equal the torch
    path's, and aggregating first, no aggregation backward runs at all."""
    calls = []
    real = fused_aggregate.aggregate_backward
    monkeypatch.setattr(
        fused_aggregate, "aggregate_backward", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    torch.manual_seed(0)
    conv = SAGEConv(*dims, aggr=aggr, activation=True)
    block = make_block(23, 40, 6, seed=dims[0])
    x = torch.randn(40, dims[0])
    params = list(conv.parameters())
    results = []
    for kernels in ("fused", "torch"):
        set_kernels(kernels)
        out = conv(block, x)
        results.append((out, grads(out, params, 21)))
    (out_f, grads_f), (out_t, grads_t) = results
    torch.testing.assert_close(out_f, out_t, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads_f, grads_t, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    project_first = dims[1] < dims[0]
    assert (len(calls) > 0) == project_first


# ---- standalone dropout (GAT's output) ------------------------------------------------------


@pytest.mark.parametrize(("n", "k"), [(1, 1), (37, 70), (300, 64), (129, 1024), (5, 33)])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
def test_standalone_dropout_equals_the_mask_it_documents(n: int, k: int, p: float) -> None:
    """Forward: x * keep / (1 - p) with dropout_mask's keep; backward: the same mask on the
    gradient (reference: torch ops on the documented mask)."""
    gen = torch.Generator().manual_seed(n * 1000 + k)
    x = torch.randn(n, k, generator=gen, requires_grad=True)
    grad = torch.randn(n, k, generator=gen)
    out = fused_update.dropout(x, p, training=True, seed=99)
    keep = fused_update.dropout_mask(99, n, k, p).float()
    scale = fused_update.dropout_scale(p)
    expected = x.detach() * keep * scale
    if p == 0.0:
        assert out is x  # no dropout: the input itself
        return
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.backward(grad)
    torch.testing.assert_close(x.grad, grad * keep * scale, rtol=0, atol=0)


def test_standalone_dropout_is_thread_independent_and_seeded() -> None:
    x = torch.randn(257, 96)
    before = _C.get_num_threads()
    try:
        outs = []
        for t in KERNEL_THREADS:
            _C.set_num_threads(t)
            outs.append(fused_update.dropout(x, 0.5, seed=5))
    finally:
        _C.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], fused_update.dropout(x, 0.5, seed=6))
    assert fused_update.dropout(x, 0.5, training=False) is x
    torch.manual_seed(3)
    a = fused_update.dropout(x, 0.5)
    torch.manual_seed(3)
    assert torch.equal(a, fused_update.dropout(x, 0.5))  # the seed comes from torch's generator
    with pytest.raises(ValueError, match="dropout probability"):
        fused_update.dropout(x, 1.5)
    with pytest.raises(ValueError, match=r"float32\[N, K\]"):
        fused_update.dropout(torch.randn(2, 3, 4), 0.5)


def test_gat_output_dropout_uses_the_documented_masks() -> None:
    """A hidden GATConv in training mode drops its output with fused_update.dropout's masks
    under the fused kernels: same output as the layer in eval mode times the mask."""
    torch.manual_seed(0)
    layer = GATConv(8, 4, heads=2, activation=True, dropout=0.5)
    block = make_block(7, 20, 4, seed=1)
    x = torch.randn(block.n_src, 8)
    before = get_kernels()
    try:
        set_kernels("fused")
        layer.eval()
        clean = layer(block, x)
        layer.train()
        torch.manual_seed(11)
        seed = fused_update.draw_seed()
        torch.manual_seed(11)
        dropped = layer(block, x)
    finally:
        set_kernels(before)
    keep = fused_update.dropout_mask(seed, *clean.shape, 0.5).float()
    torch.testing.assert_close(dropped, clean * keep * 2.0, rtol=1e-6, atol=1e-6)
