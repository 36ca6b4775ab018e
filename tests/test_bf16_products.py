"""The fused UPDATE kernels' bfloat16 products (``--precision bf16`` on the CPU).

Inside :func:`~distmb.nn.kernels.cpu_update.bf16_products` every matrix product of the fused
kernels takes its operands rounded to bfloat16 and sums in float32. Each kernel is checked
against a float64 product of the same operands rounded by torch (``Tensor.bfloat16()``), with
float32's tolerance: a kernel that did not round (float32 products), rounded the wrong operand
or truncated would miss it by about 2^-9 of each term, a hundred times the tolerance. Both the
AVX512-BF16 code and the portable C++ run (the portable one forced by
``_C.set_update_bf16_portable`` where the build has both). The layers and models carry their
forward's products into the backward, which autograd may run outside the context.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from conftest import make_block
from test_fused_update import assert_close32, ref_update
from torch import Tensor

from distmb import _C
from distmb.engine.precision import MixedPrecision
from distmb.nn import GATConv, SAGEConv
from distmb.nn.kernels import cpu_aggregate as fused_aggregate
from distmb.nn.kernels import cpu_update as fused_update
from distmb.nn.kernels.dispatch import get_kernels, set_kernels
from distmb.nn.models import GAT, GraphSAGE

# (n, c, k): odd widths (a pair's high half past the end), rows that miss the 8-row tiles and
# the 64 / 128-row blocks, a row count past one backward block.
SHAPES = [(0, 5, 3), (1, 1, 1), (7, 13, 47), (67, 17, 33), (131, 100, 40), (300, 24, 40)]


@pytest.fixture(params=["native", "portable"])
def products(request: pytest.FixtureRequest) -> Iterator[str]:
    """The bfloat16 products in force for the test: AVX512-BF16 where the build has it (else
    skipped: the portable run covers that build), or the portable C++."""
    if request.param == "native" and not fused_update.bf16_native():
        pytest.skip("this build has no AVX512-BF16: the portable products are its products")
    _C.set_update_bf16_portable(request.param == "portable")
    try:
        with fused_update.bf16_products():
            yield request.param
    finally:
        _C.set_update_bf16_portable(False)


@pytest.fixture
def fused_kernels() -> Iterator[None]:
    before = get_kernels()
    set_kernels("fused")
    yield
    set_kernels(before)


def r(t: Tensor) -> Tensor:
    """t rounded to bfloat16 by torch (round to nearest even), as float64."""
    return t.detach().bfloat16().double()


def randn(*shape: int, gen: torch.Generator, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=gen) * scale


def unpack_bits(bits: Tensor, k: int) -> Tensor:
    """bool[n, k] from the packed gate bits uint8[n, ceil(k / 8)] (column j: bit j % 8)."""
    unpacked = np.unpackbits(bits.numpy(), axis=1, bitorder="little")[:, :k]
    return torch.from_numpy(unpacked.astype(bool))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("activation,p", [(True, 0.3), (False, 0.0)], ids=str)
def test_update_forward_and_backward(
    products: str, shape: tuple[int, int, int], activation: bool, p: float
) -> None:
    n, c, k = shape
    gen = torch.Generator().manual_seed(n + c + k)
    xs = [randn(n, c, gen=gen), randn(n, c + 3, gen=gen)]
    ws = [randn(k, c, gen=gen, scale=c**-0.5), randn(k, c + 3, gen=gen, scale=c**-0.5)]
    bias, addend = randn(k, gen=gen), randn(n, k, gen=gen)
    out, bits = fused_update.update_forward(xs, ws, addend, bias, activation, p, 99)
    keep = fused_update.dropout_mask(99, n, k, p) if activation and p > 0 else None
    rounded = [(r(x), r(w)) for x, w in zip(xs, ws, strict=True)]
    assert_close32(out, ref_update(rounded, bias, addend, activation, keep, p), 2 * c + 5)

    scale = fused_update.dropout_scale(p) if activation else 1.0
    grad_out = randn(n, k, gen=gen)
    grad_pre, grad_bias, grad_xs, grad_ws = fused_update.update_backward(
        grad_out, bits, scale, xs, ws, [True, True], [True, True], True, True
    )
    # The pre-activation gradient and the bias gradient stay float32: the gate and scale
    # applied to grad_out, and its column sums.
    gate = unpack_bits(bits, k) if activation else torch.ones(n, k, dtype=torch.bool)
    want_pre = torch.where(gate, grad_out * scale, torch.zeros(()))
    assert torch.equal(grad_pre, want_pre)
    assert_close32(grad_bias, want_pre.double().sum(0), n)
    for x, w, gx, gw in zip(xs, ws, grad_xs, grad_ws, strict=True):
        assert_close32(gx, r(grad_pre) @ r(w), k)
        assert_close32(gw, r(grad_pre).T @ r(x), n)


@pytest.mark.parametrize("shape", [(67, 17, 33), (300, 100, 40)], ids=str)
def test_rows_read_in_place(products: str, shape: tuple[int, int, int]) -> None:
    """A source read through row ids (no gathered copy) rounds the rows it reads."""
    n, c, k = shape
    gen = torch.Generator().manual_seed(n)
    table = randn(n + 20, c, gen=gen)
    ids = torch.randperm(n + 20, generator=gen)[:n]
    w = randn(k, c, gen=gen, scale=c**-0.5)
    out = np.empty((n, k), np.float32)
    bias = np.zeros(k, np.float32)
    _C.update_forward(
        [(table.numpy(), ids.numpy())], [w.numpy()], None, bias, False, 0.0, 0, out, None,
        bf16=True,
    )  # fmt: skip
    assert_close32(torch.from_numpy(out), r(table[ids]) @ r(w).T, c)
    grad_out = randn(n, k, gen=gen)
    grad_w = np.empty((k, c), np.float32)
    _C.update_backward(
        grad_out.numpy(), None, 1.0, [(table.numpy(), ids.numpy())], [w.numpy()], [None],
        [grad_w], None, None, bf16=True,
    )  # fmt: skip
    assert_close32(torch.from_numpy(grad_w), r(grad_out).T @ r(table[ids]), n)


def test_aggregated_backward_is_the_two_calls(products: str) -> None:
    """update_backward_aggregated builds each output-gradient row as aggregate_backward would
    and then rounds it as update_backward does: the same bits."""
    gen = torch.Generator().manual_seed(3)
    n, c, k = 150, 19, 33
    nxt = make_block(90, n, 6, seed=4)
    x, w, bias = randn(n, c, gen=gen), randn(k, c, gen=gen, scale=0.3), randn(k, gen=gen)
    _, bits = fused_update.update_forward([x], [w], None, bias, True, 0.25, 5)
    grad_dst, addend = randn(90, k, gen=gen), randn(40, k, gen=gen)
    grad_b, _, (grad_w,) = fused_update.update_backward_aggregated(
        nxt, "mean", grad_dst, addend, bits, 4 / 3, [x], [w], [False], [True], True
    )
    grad_out = fused_aggregate.aggregate_backward(nxt, "mean", grad_dst, addend)[:n]
    _, want_b, _, (want_w,) = fused_update.update_backward(
        grad_out, bits, 4 / 3, [x], [w], [False], [True], True, False
    )
    assert torch.equal(grad_w, want_w) and torch.equal(grad_b, want_b)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (70, 20, 1, 47), (131, 33, 4, 8)], ids=str)
@pytest.mark.parametrize("activation", [True, False])
def test_gat_projection(products: str, shape: tuple[int, ...], activation: bool) -> None:
    n, c, heads, d = shape
    gen = torch.Generator().manual_seed(n + c)
    x = randn(n, c, gen=gen).requires_grad_()
    w = randn(heads * d, c, gen=gen, scale=c**-0.5).requires_grad_()
    shapes = [(heads * d,), (heads, d), (heads, d)]
    b, al, ar = (randn(*s, gen=gen).requires_grad_() for s in shapes)
    z, el, er = fused_update.gat_projection(x, w, b, al, ar, activation)
    pre = r(x) @ r(w).T + b.double()
    want_z = pre.clamp_min(0) if activation else pre
    assert_close32(z, want_z, c)
    zh = z.double().view(n, heads, d)
    assert_close32(el, (zh * al.double()).sum(-1), d)
    assert_close32(er, (zh * ar.double()).sum(-1), d)
    # With the scores' gradients zero the pre-activation gradient is grad_z gated: its
    # rounding is then the only one between the kernel and the reference.
    grad_z = randn(n, heads * d, gen=gen)
    zeros = torch.zeros(n, heads)
    gx, gw = torch.autograd.grad((z, el, er), (x, w), (grad_z, zeros, zeros))
    gp = torch.where(z > 0, grad_z, torch.zeros(())) if activation else grad_z
    assert_close32(gx, r(gp) @ r(w), heads * d)
    assert_close32(gw, r(gp).T @ r(x), n)


def test_portable_and_native_products_agree() -> None:
    if not fused_update.bf16_native():
        pytest.skip("this build has no AVX512-BF16")
    gen = torch.Generator().manual_seed(11)
    x, w, bias = randn(200, 75, gen=gen), randn(40, 75, gen=gen, scale=0.1), randn(40, gen=gen)
    outs = []
    for portable in (False, True):
        _C.set_update_bf16_portable(portable)
        try:
            with fused_update.bf16_products():
                outs.append(fused_update.update_forward([x], [w], None, bias, True, 0.0, 0)[0])
        finally:
            _C.set_update_bf16_portable(False)
    assert_close32(outs[1], outs[0].double(), 75)


def test_products_are_rounded_and_only_inside_the_context() -> None:
    """The float32 products outside the context, the rounded ones inside (then restored, also
    after an error), per thread."""
    gen = torch.Generator().manual_seed(5)
    x, w, bias = randn(64, 96, gen=gen), randn(32, 96, gen=gen, scale=0.1), torch.zeros(32)
    fp32 = fused_update.update_forward([x], [w], None, bias, False, 0.0, 0)[0]
    assert_close32(fp32, x.double() @ w.double().T, 96)
    with fused_update.bf16_products():
        assert fused_update.products_bf16()
        bf16 = fused_update.update_forward([x], [w], None, bias, False, 0.0, 0)[0]
        seen: list[bool] = []
        other = threading.Thread(target=lambda: seen.append(fused_update.products_bf16()))
        other.start()
        other.join()
        assert seen == [False]
    assert not fused_update.products_bf16()
    # The rounding shows: the exact product is outside float32's tolerance.
    with pytest.raises(AssertionError):
        assert_close32(bf16, x.double() @ w.double().T, 96)
    assert_close32(bf16, r(x) @ r(w).T, 96)
    with pytest.raises(RuntimeError), fused_update.bf16_products():
        raise RuntimeError
    assert not fused_update.products_bf16()


def model_grads(
    model: torch.nn.Module, blocks: list, x: Tensor, mode: str
) -> tuple[Tensor, list[Tensor]]:
    """A training forward and the parameter gradients: ``fp32``, or bf16 products with the
    backward run ``inside`` or ``outside`` the context."""
    torch.manual_seed(0)
    params = list(model.parameters())
    if mode == "fp32":
        out = model(blocks, x)
        return out, list(torch.autograd.grad(out.square().sum(), params))
    with fused_update.bf16_products():
        out = model(blocks, x)
        if mode == "inside":
            return out, list(torch.autograd.grad(out.square().sum(), params))
    return out, list(torch.autograd.grad(out.square().sum(), params))


@pytest.mark.parametrize("model_name", ["sage", "sage_project", "gat"])
def test_models_carry_their_products_into_the_backward(
    fused_kernels: None, model_name: str
) -> None:
    """GraphSAGE (its first two layers one fused node; a layer that projects first) and GAT:
    the bf16 forward differs from float32's by bfloat16 rounding, and the backward, run
    outside the context as autograd may, repeats the one run inside it bit for bit."""
    torch.manual_seed(1)
    blocks = [make_block(120, 300, 6, seed=1), make_block(40, 120, 6, seed=2)]
    blocks.append(make_block(10, 40, 6, seed=3))
    in_dim = 64 if model_name == "sage_project" else 12
    if model_name == "gat":
        model = GAT(in_dim, 8, 5, 3, heads=2, dropout=0.2)
    else:
        model = GraphSAGE(in_dim, 32 if model_name == "sage" else 16, 5, 3, dropout=0.2)
    model.train()
    x = torch.randn(300, in_dim)
    out32, grads32 = model_grads(model, blocks, x, "fp32")
    out_in, grads_in = model_grads(model, blocks, x, "inside")
    out_out, grads_out = model_grads(model, blocks, x, "outside")
    assert torch.equal(out_in, out_out)
    for inside, outside, fp32 in zip(grads_in, grads_out, grads32, strict=True):
        assert torch.equal(inside, outside)
        # Near float32's as a whole (8 significant bits through three layers; a ReLU the
        # rounding flips moves single entries far).
        assert (inside - fp32).norm() <= 0.15 * fp32.norm()
    assert not torch.equal(out_in, out32)
    torch.testing.assert_close(out_in, out32, rtol=0.05, atol=0.05)
    assert any(not torch.equal(a, b) for a, b in zip(grads_in, grads32, strict=True))


def test_sage_update_and_gat_projection_carry_their_products_into_the_backward() -> None:
    """The autograd functions of the kernels' Python API, their backward run outside the
    context: the gradients of bfloat16 products (against the rounded operands' float64
    products), not of float32 ones."""
    gen = torch.Generator().manual_seed(8)
    n, c, heads, d = 90, 33, 4, 5
    x = randn(n, c, gen=gen).requires_grad_()
    w = randn(heads * d, c, gen=gen, scale=c**-0.5).requires_grad_()
    b, al, ar = (
        randn(*s, gen=gen).requires_grad_() for s in [(heads * d,), (heads, d), (heads, d)]
    )
    g = randn(n, heads * d, gen=gen)
    with fused_update.bf16_products():
        out = fused_update.sage_update([(x, w)], b, activation=False)
        z, el, er = fused_update.gat_projection(x, w, b, al, ar, activation=False)
    gx, gw = torch.autograd.grad(out, [x, w], g)
    assert_close32(gx, r(g) @ r(w), heads * d)
    assert_close32(gw, r(g).T @ r(x), n)
    zeros = torch.zeros(n, heads)
    gx, gw = torch.autograd.grad((z, el, er), [x, w], (g, zeros, zeros))
    assert_close32(gx, r(g) @ r(w), heads * d)
    assert_close32(gw, r(g).T @ r(x), n)


def test_mixed_precision_turns_the_products_on_for_the_fused_kernels_only() -> None:
    cpu = torch.device("cpu")
    for kernels, fused in [("fused", True), ("auto", True), ("torch", False)]:
        mp = MixedPrecision("bf16", kernels, cpu)
        assert mp.fused_bf16 is fused and mp.dtype == torch.bfloat16
        assert (mp.note is not None) is fused
        with mp.autocast():
            assert fused_update.products_bf16() is fused
            assert torch.is_autocast_enabled("cpu")
        assert not fused_update.products_bf16()
    assert not MixedPrecision("bf16", "fused", torch.device("cuda")).fused_bf16
    assert not MixedPrecision("fp32", "fused", cpu).fused_bf16
    note = MixedPrecision("bf16", "fused", cpu).note
    assert ("AVX512-BF16)" in note) is fused_update.bf16_native()


def test_layers_take_the_products(fused_kernels: None) -> None:
    """SAGEConv and GATConv route their fused products through the context."""
    block = make_block(30, 80, 5, seed=7)
    x = torch.randn(80, 24)
    for conv in (SAGEConv(24, 16, activation=True), GATConv(24, 4, heads=2)):
        conv.eval()
        fp32 = conv(block, x)
        with fused_update.bf16_products():
            bf16 = conv(block, x)
        assert not torch.equal(bf16, fp32)
        torch.testing.assert_close(bf16, fp32, rtol=0.03, atol=0.03)


def test_a_loop_of_ones_own_trains_with_the_documented_contexts(fused_kernels: None) -> None:
    """docs/api.md's loop: autocast and ``distmb.nn.bf16_products`` around the forward, the
    backward outside; the fused layers' products went bfloat16 and the loss fell."""
    import torch.nn.functional as F

    import distmb

    assert distmb.nn.bf16_products is fused_update.bf16_products
    graph = distmb.load_dataset("synthetic:nodes=600,avg_degree=6,feat_dim=12,classes=3")
    torch.manual_seed(0)
    model = GraphSAGE(graph.feat_dim, 32, graph.num_classes, 2, dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    seen: list[bool] = []
    update_forward = fused_update.update_forward

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.append(fused_update.products_bf16())
        return update_forward(*args, **kwargs)

    losses = []
    loader = distmb.NeighborLoader(graph, graph.train_idx, [5, 5], batch_size=64, shuffle=True)
    fused_update.update_forward = spy
    try:
        for _ in range(3):
            for batch in loader:
                with torch.autocast("cpu", dtype=torch.bfloat16), distmb.nn.bf16_products():
                    loss = F.cross_entropy(model(batch.blocks, batch.x).float(), batch.labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    finally:
        fused_update.update_forward = update_forward
    assert seen and all(seen)
    assert losses[-1] < losses[0]
