"""The Triton CSR aggregation (distmb.nn.kernels.triton_aggregate, ``--kernels triton``) against a
numpy brute force and the PyTorch-ops path: under Triton's interpreter on CPU tensors here,
compiled on a GPU under ``pytest -m cuda``; and compiled for sm_90 without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import compile_triton_in_subprocess

from distmb.nn.aggregate import _torch_aggregate, aggregate
from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.nn.kernels.dispatch import get_kernels, set_kernels
from distmb.pipeline.sample import Block
from distmb.pipeline.sample.blocks import transposed_indptr

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
KINDS = ["mean", "sum", "gcn"]


def require(device: str) -> None:
    ok, why = aggregate_triton.usable(torch.device(device))
    if not ok:
        pytest.skip(why)


def random_block(seed: int, n_dst: int, n_src: int, max_deg: int, hub: int) -> Block:
    """Degrees 0..max_deg (a few destinations without edges) and one hub of ``hub`` edges."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, max_deg + 1, n_dst)
    deg[rng.choice(n_dst, max(1, n_dst // 5), replace=False)] = 0
    deg[rng.integers(n_dst)] = hub
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    indices = rng.integers(0, n_src, int(indptr[-1])).astype(np.int64)
    return Block(
        n_dst, n_src, 0, torch.from_numpy(indptr), torch.from_numpy(indices),
        torch.arange(n_src, dtype=torch.int64),
    )  # fmt: skip


def brute_force(block: Block, x: np.ndarray, kind: str) -> np.ndarray:
    """numpy loops over destinations and edges, in float64."""
    indptr, indices = block.indptr.numpy(), block.indices.numpy()
    out = np.zeros((block.n_dst, *x.shape[1:]), dtype=np.float64)
    for v in range(block.n_dst):
        nbrs = indices[indptr[v] : indptr[v + 1]]
        total = x[nbrs].astype(np.float64).sum(axis=0)
        if kind == "mean":
            total = total / max(len(nbrs), 1)
        elif kind == "gcn":
            total = (total + x[v]) / (len(nbrs) + 1)
        out[v] = total
    return out


def brute_force_grad(block: Block, grad_out: np.ndarray, kind: str) -> np.ndarray:
    """d(sum(out * grad_out)) / dx by the chain rule, edge by edge."""
    indptr, indices = block.indptr.numpy(), block.indices.numpy()
    grad = np.zeros((block.n_src, *grad_out.shape[1:]), dtype=np.float64)
    for v in range(block.n_dst):
        deg = indptr[v + 1] - indptr[v]
        w = {"sum": 1.0, "mean": 1.0 / max(deg, 1), "gcn": 1.0 / (deg + 1)}[kind]
        for u in indices[indptr[v] : indptr[v + 1]]:
            grad[u] += w * grad_out[v]
        if kind == "gcn":
            grad[v] += w * grad_out[v]
    return grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("seed", "n_dst", "n_src", "feat", "hub"),
    [(0, 13, 40, 37, 30), (1, 1, 3, 5, 2), (2, 50, 120, 130, 200), (3, 9, 9, (3, 7), 0)],
)
def test_matches_brute_force_and_torch(device, kind, seed, n_dst, n_src, feat, hub):
    require(device)
    block = random_block(seed, n_dst, n_src, max_deg=6, hub=hub)
    shape = feat if isinstance(feat, tuple) else (feat,)  # [n_src, H, D] too
    rng = np.random.default_rng(seed + 100)
    x_np = rng.standard_normal((n_src, *shape)).astype(np.float32)
    g_np = rng.standard_normal((n_dst, *shape)).astype(np.float32)
    dev_block = block.to(device)
    x = torch.tensor(x_np, device=device, requires_grad=True)
    out = aggregate_triton.aggregate(dev_block, x, kind)
    (grad,) = torch.autograd.grad(out, x, torch.tensor(g_np, device=device))
    np.testing.assert_allclose(out.detach().cpu().numpy(), brute_force(block, x_np, kind),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(grad.cpu().numpy(), brute_force_grad(block, g_np, kind),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    # The PyTorch-ops path (the baseline the kernel replaces), float64 there.
    x64 = torch.tensor(x_np, dtype=torch.float64, device=device, requires_grad=True)
    ref = _torch_aggregate(dev_block, x64, kind)
    (ref_grad,) = torch.autograd.grad(ref, x64, torch.tensor(g_np, dtype=torch.float64,
                                                             device=device))  # fmt: skip
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_sum_in_float32(device, dtype):
    require(device)
    block = random_block(4, 20, 60, max_deg=8, hub=40).to(device)
    x = torch.randn(60, 24, device=device).to(dtype).requires_grad_()
    out = aggregate_triton.aggregate(block, x, "mean")
    assert out.dtype == dtype
    # Reference: the same rounded inputs summed in float64. Summed in float32 and rounded
    # once, the result is within half a unit in the last place of ``dtype`` (a sum in
    # ``dtype`` would drift by up to one per edge: the hub has 40). Triton's interpreter
    # emulates the float32 -> bf16 conversion by truncation (the GPU rounds to nearest):
    # one unit there.
    ref = _torch_aggregate(block, x.detach().double(), "mean")
    ulps = 1.0 if device == "cpu" and dtype == torch.bfloat16 else 0.5
    err = (out.double() - ref).abs()
    assert (err <= ulps * torch.finfo(dtype).eps * ref.abs() + 1e-6).all(), err.max()
    (grad,) = torch.autograd.grad(out.float().sum(), x)
    assert grad.dtype == dtype and torch.isfinite(grad.float()).all()


#: Unit roundoff of float32.
FLOAT32_UNIT_ROUNDOFF = 2.0**-24


def gamma(n: int) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)`` for float32 (``u = 2**-24``): a float32
    computation of sums and products in which every term passes through at most ``n``
    roundings, in any order, is within ``gamma_n`` times the same computation on the
    absolute values of its inputs of the exact value (Higham, "Accuracy and Stability of
    Numerical Algorithms", sections 3.1 and 4.2)."""
    nu = n * FLOAT32_UNIT_ROUNDOFF
    assert nu < 1, n
    return nu / (1 - nu)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_style_against_torch_on_layers(device):
    """``--kernels triton`` behind :func:`distmb.nn.aggregate.aggregate`: a SAGE-like step's
    parameter and input gradients equal the ``torch`` path's up to float32 rounding, entry by
    entry within the error bound of :func:`gamma` (both paths are within it of the exact
    value, so they are within twice it of each other)."""
    require(device)
    block = random_block(5, 30, 70, max_deg=10, hub=50).to(device)
    lin = torch.nn.Linear(33, 7).to(device)
    x = torch.randn(70, 33, device=device)
    grads = {}
    before = get_kernels()
    try:
        for kernels in ("torch", "triton"):
            set_kernels(kernels)
            lin.zero_grad()
            x_req = x.clone().requires_grad_()
            for kind in KINDS:
                lin(aggregate(block, x_req, kind)).square().sum().backward()
            grads[kernels] = (lin.weight.grad.clone(), x_req.grad.clone())
    finally:
        set_kernels(before)
    # The same gradients in float64 on absolute values: |W|, |b|, |x|, every aggregation's
    # coefficients are >= 0 (for |a| and the input gradient's scatter).
    w_abs = lin.weight.detach().double().abs()
    b_abs = lin.bias.detach().double().abs()
    grad_w_abs = torch.zeros_like(w_abs)
    grad_x_abs = torch.zeros_like(x, dtype=torch.float64)
    for kind in KINDS:
        x_abs = x.double().abs().requires_grad_()
        a_abs = _torch_aggregate(block, x_abs, kind)
        y_abs = a_abs.detach() @ w_abs.T + b_abs
        grad_w_abs += 2 * y_abs.T @ a_abs.detach()
        grad_x_abs += torch.autograd.grad(a_abs, x_abs, 2 * y_abs @ w_abs)[0]
    # Roundings along the longest chain of one term: an aggregation (a row's terms, the
    # vertex itself for gcn, and a division or a reciprocal and a product), the layer
    # (in_features products and sums, the bias), then for the weight gradient a second
    # aggregated factor, its product and the sum over destinations, for the input gradient
    # the product with W (out_features terms), the coefficient (2) and the sum over a
    # source's edges; and the accumulation over the kinds.
    row_terms = int(torch.diff(block.indptr).max()) + 1
    source_edges = int(torch.bincount(block.indices.cpu(), minlength=block.n_src).max()) + 1
    aggregation, layer = row_terms + 2, lin.in_features + 2
    chain_w = 2 * aggregation + layer + 1 + block.n_dst + len(KINDS)
    chain_x = aggregation + layer + lin.out_features + 1 + 2 + source_edges + len(KINDS)
    checks = (("weight", chain_w, grad_w_abs), ("input", chain_x, grad_x_abs))
    torch_grads, triton_grads = grads["torch"], grads["triton"]
    for (name, chain, on_abs), ref, got in zip(checks, torch_grads, triton_grads, strict=True):
        bound = 2 * gamma(chain) * on_abs
        diff = (got.double() - ref.double()).abs()
        assert (diff <= bound).all(), (name, diff.max(), (diff / bound).nanmax())
        # A bound that means something: below a hundredth of the largest gradient (about a
        # thousandth here: the sums on absolute values are 20-300 times the entries).
        assert bound.max() < 1e-2 * ref.abs().max(), (name, bound.max())


def test_dispatch_only_on_tensors_the_kernel_takes(monkeypatch):
    calls = []
    monkeypatch.setattr(aggregate_triton, "aggregate", lambda *a: calls.append(a) or a[1][:2])
    block = random_block(6, 2, 4, max_deg=2, hub=1)
    before = get_kernels()
    try:
        set_kernels("triton")
        aggregate(block, torch.randn(4, 3, dtype=torch.float64), "sum")  # float64: torch
        assert calls == []
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # a CPU tensor outside the interpreter
        aggregate(block, torch.randn(4, 3), "sum")
        assert calls == []
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        aggregate(block, torch.randn(4, 3), "sum")
        assert len(calls) == 1
    finally:
        set_kernels(before)


def test_transposed_csr_is_cached_and_rebuilt_when_stale():
    block = random_block(7, 10, 25, max_deg=5, hub=9)
    t_indptr, t_dst = aggregate_triton.transposed_csr(block)
    assert aggregate_triton.transposed_csr(block)[0] is t_indptr
    dst = block.dst_of_edges().numpy()
    for u in range(block.n_src):  # every source lists the destinations of its edges, in order
        edges = np.flatnonzero(block.indices.numpy() == u)
        assert t_dst[t_indptr[u] : t_indptr[u + 1]].tolist() == dst[edges].tolist()
    block.indices[0] = (block.indices[0] + 1) % block.n_src  # in place: a new version
    assert aggregate_triton.transposed_csr(block)[0] is not t_indptr


def test_a_transposed_csr_set_from_tensors_is_used_until_stale():
    """``set_transposed_csr`` (--compile's operators hand the block its transposed CSR as
    tensors): ``transposed_csr`` returns those tensors, not a rebuilt copy, until the block's
    ``indices`` change; ``transposed_csr_edges`` builds its own (it also returns the order)."""
    block = random_block(7, 10, 25, max_deg=5, hub=9)
    want = aggregate_triton.transposed_csr(random_block(7, 10, 25, max_deg=5, hub=9))
    given = (want[0].clone(), want[1].clone())
    aggregate_triton.set_transposed_csr(block, *given)
    got = aggregate_triton.transposed_csr(block)
    assert got[0] is given[0] and got[1] is given[1]
    t_indptr, order, t_dst = aggregate_triton.transposed_csr_edges(block)
    assert torch.equal(t_indptr, want[0]) and torch.equal(t_dst, want[1])
    assert torch.equal(block.indices[order], torch.sort(block.indices, stable=True).values)
    aggregate_triton.set_transposed_csr(block, *given)
    block.indices[0] = (block.indices[0] + 1) % block.n_src  # in place: a new version
    assert aggregate_triton.transposed_csr(block)[0] is not given[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["mean", "gcn"])
def test_in_kernel_factors_are_pytorchs(device, kind):
    """The factors computed in the kernel from the row pointers are PyTorch's ``1.0 / d``
    values: the scaled forward equals the unscaled kernel times the factors of PyTorch's
    ops (bit for bit under the interpreter; on a GPU up to the float32 rounding of a fused
    multiply-add in the backward's sum), and so does the backward's column scale."""
    require(device)
    block = random_block(8, 40, 90, max_deg=9, hub=35).to(device)
    deg = block.indptr[1:] - block.indptr[:-1]
    factor = 1.0 / (deg.clamp(min=1) if kind == "mean" else deg + 1).to(torch.float32)
    n_self = block.n_dst if kind == "gcn" else 0
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(block.n_src, 19, generator=gen).to(device)
    g = torch.randn(block.n_dst, 19, generator=gen).to(device)
    out = aggregate_triton.csr_gather(block.indptr, block.indices, x, row_scale=kind, n_self=n_self)
    unscaled = aggregate_triton.csr_gather(block.indptr, block.indices, x, n_self=n_self)
    assert torch.equal(out, unscaled * factor[:, None])
    t_indptr, t_dst = aggregate_triton.transposed_csr(block)
    grad = aggregate_triton.csr_gather(
        t_indptr, t_dst, g, col_scale=kind, col_indptr=block.indptr, n_self=n_self
    )
    ref = aggregate_triton.csr_gather(t_indptr, t_dst, g * factor[:, None], n_self=n_self)
    if device == "cpu":
        assert torch.equal(grad, ref)
    else:
        torch.testing.assert_close(grad, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("self_loops", [True, False])
def test_symmetric_factors_are_gcns(device, self_loops):
    """GCNConv's ``"symmetric"`` factors, computed in the kernel from the row pointers
    (destinations: ``indptr``; sources: the transposed CSR's), are the PyTorch-ops layer's
    ``max(1, degree [+ self loop]).pow(-0.5)``: the forward equals the unscaled kernel over
    the column-scaled input times the row factors (bit for bit under the interpreter; on a
    GPU up to float32 rounding), and so does the backward with the factors swapped. Sources
    beyond the destinations and without out-edges get factor 1 (``max(1, 0)``)."""
    require(device)
    block = random_block(14, 23, 70, max_deg=7, hub=30).to(device)
    t_indptr, t_dst = aggregate_triton.transposed_csr(block)
    loops = int(self_loops)
    is_dst = (torch.arange(block.n_src, device=device) < block.n_dst).to(torch.int64)
    out_deg = t_indptr[1:] - t_indptr[:-1] + loops * is_dst
    in_deg = block.indptr[1:] - block.indptr[:-1] + loops
    assert (out_deg[block.n_dst :] == 0).any()
    src_norm = out_deg.clamp(min=1).to(torch.float32).pow(-0.5)[:, None]
    dst_norm = in_deg.clamp(min=1).to(torch.float32).pow(-0.5)[:, None]
    n_self = block.n_dst if self_loops else 0
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(block.n_src, 19, generator=gen).to(device)
    g = torch.randn(block.n_dst, 19, generator=gen).to(device)
    out = aggregate_triton.csr_gather(
        block.indptr, block.indices, x, row_scale="symmetric", col_scale="symmetric",
        col_indptr=t_indptr, n_self=n_self,
    )  # fmt: skip
    ref = aggregate_triton.csr_gather(block.indptr, block.indices, x * src_norm, n_self=n_self)
    grad = aggregate_triton.csr_gather(
        t_indptr, t_dst, g, row_scale="symmetric", col_scale="symmetric",
        col_indptr=block.indptr, n_self=n_self,
    )  # fmt: skip
    ref_grad = aggregate_triton.csr_gather(t_indptr, t_dst, g * dst_norm, n_self=n_self)
    kind = "symmetric_self" if self_loops else "symmetric"
    if device == "cpu":
        assert torch.equal(out, ref * dst_norm)
        assert torch.equal(grad, ref_grad * src_norm)
        assert torch.equal(aggregate_triton.aggregate_forward(block, x, kind), out)
        assert torch.equal(aggregate_triton.aggregate_backward(block, kind, g), grad)
    else:
        torch.testing.assert_close(out, ref * dst_norm, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad, ref_grad * src_norm, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("eps", [0.0, 0.375, -1.5])
def test_self_eps_weights_the_own_row(device, eps):
    """GIN's ``self_eps``: the own row weighted ``1 + eps`` (read from a tensor in the
    kernel) equals the unweighted sum plus ``(1 + eps) x[:n_dst]`` as an addend (the same
    float32 product and addition: bit for bit under the interpreter), forward and backward
    (with a further addend); and the brute force plus that term in float64."""
    require(device)
    block = random_block(15, 18, 41, max_deg=6, hub=20)
    gen = torch.Generator().manual_seed(15)
    x = torch.randn(block.n_src, 21, generator=gen)
    g = torch.randn(block.n_dst, 21, generator=gen)
    extra = torch.randn(block.n_dst, 21, generator=gen)
    eps_t = torch.tensor([eps], device=device)
    dev_block = block.to(device)
    xd, gd, ed = x.to(device), g.to(device), extra.to(device)
    out = aggregate_triton.aggregate_forward(dev_block, xd, "sum", self_eps=eps_t)
    ref = aggregate_triton.aggregate_forward(dev_block, xd, "sum", (1 + eps_t) * xd[: block.n_dst])
    grad = aggregate_triton.aggregate_backward(dev_block, "sum", gd, ed, self_eps=eps_t)
    ref_grad = aggregate_triton.aggregate_backward(dev_block, "sum", gd, (1 + eps_t) * gd)
    ref_grad[: block.n_dst] += ed
    if device == "cpu":
        assert torch.equal(out, ref)
        assert torch.equal(grad, ref_grad)
    else:  # the compiler may contract the kernels' sums differently
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-6)
    expected = (
        brute_force(block, x.double().numpy(), "sum")
        + (1 + eps) * x[: block.n_dst].double().numpy()
    )
    np.testing.assert_allclose(out.cpu().double().numpy(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="'sum' aggregation"):
        aggregate_triton.aggregate_forward(dev_block, xd, "mean", self_eps=eps_t)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", KINDS)
def test_addend_rows_and_broadcast_row(device, kind):
    """``addend`` against the brute force plus the added rows: a [n_add, F] block on the
    first rows, a broadcast [F] row (``expand``: row stride 0) on every row, a column slice
    (made contiguous); and in the backward, on the first sources, the unchanged gradient
    plus the addend (one float32 addition: bit for bit under the interpreter)."""
    require(device)
    block = random_block(9, 17, 33, max_deg=6, hub=12)
    rng = np.random.default_rng(9)
    x_np = rng.standard_normal((33, 21)).astype(np.float32)
    rows_np = rng.standard_normal((11, 21)).astype(np.float32)
    wide_np = rng.standard_normal((17, 42)).astype(np.float32)
    dev_block = block.to(device)
    x = torch.tensor(x_np, device=device)
    expected = brute_force(block, x_np, kind)
    bias = torch.tensor(rows_np[0], device=device)
    for addend_np, addend in [
        (np.pad(rows_np, ((0, 6), (0, 0))), torch.tensor(rows_np, device=device)),
        (np.broadcast_to(rows_np[0], (17, 21)), bias.expand(17, -1)),
        (wide_np[:, ::2], torch.tensor(wide_np, device=device)[:, ::2]),
    ]:
        out = aggregate_triton.aggregate_forward(dev_block, x, kind, addend)
        np.testing.assert_allclose(out.cpu().numpy(), expected + addend_np, rtol=1e-5, atol=1e-5)
    g = torch.tensor(rows_np[:, :5].repeat(2, 0)[:17], device=device)
    bare = aggregate_triton.aggregate_backward(dev_block, kind, g)
    self_grad = torch.tensor(x_np[:17, :5], device=device)
    grad = aggregate_triton.aggregate_backward(dev_block, kind, g, self_grad)
    assert torch.equal(grad[17:], bare[17:])
    if device == "cpu":
        assert torch.equal(grad[:17], bare[:17] + self_grad)
    else:  # the compiler may contract the kernels' sums differently
        torch.testing.assert_close(grad[:17], bare[:17] + self_grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("seed", "n_dst", "n_src", "max_deg", "hub"),
    [(10, 30, 200, 6, 40), (11, 1, 1, 0, 0), (12, 5, 5, 3, 0), (13, 3, 2500, 2, 1500)],
)
def test_transposed_csr_is_pytorchs_construction(device, seed, n_dst, n_src, max_deg, hub):
    """The sort + binary-search kernel against the PyTorch ops it replaced (a stable sort,
    ``searchsorted`` over every source, the CSR's expansion permuted): the same three
    tensors, for blocks with sources without edges, destinations without edges, no edges at
    all, and more than one program's worth of sources and edges."""
    require(device)
    block = random_block(seed, n_dst, n_src, max_deg=max_deg, hub=hub).to(device)
    t_indptr, order, t_dst = aggregate_triton.transposed_csr_edges(block)
    ref_indptr, ref_order = transposed_indptr(block.indices, block.n_src)
    assert torch.equal(t_indptr, ref_indptr)
    assert torch.equal(order, ref_order)
    assert torch.equal(t_dst, block.dst_of_edges()[ref_order])


def test_feature_tile():
    assert [aggregate_triton.block_f(f) for f in (1, 16, 17, 100, 128, 129, 602)] == [
        16, 16, 32, 128, 128, 128, 128,
    ]  # fmt: skip


def test_kernel_compiles_for_hopper():
    """Compile every variant (forward mean/sum/gcn with and without an addend, backward with
    column scales, own row and addend; GCNConv's symmetric factors on rows and columns with
    and without self loops, GIN's own row weighted ``1 + eps``) for sm_90 in float32, bf16
    and fp16, and the transposed CSR's kernel, without a GPU: no atomics, global loads and
    stores; the in-kernel factors' division and square root rounded to nearest (``div.rn``,
    ``sqrt.rn``, not approximations)."""
    code = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from distmb.nn.kernels.triton_aggregate import (
    MAX_BLOCK_F, ROWS, SCALES, TRANSPOSE_BLOCK, _csr_gather_kernel, _transpose_kernel)
def build(fn, sig, cx):
    sig.update({k: "constexpr" for k in cx})
    kernel = triton.compile(ASTSource(fn, sig, constexprs=cx), target=GPUTarget("cuda", 90, 32))
    ptx = kernel.asm["ptx"]
    assert "atom." not in ptx and "ld.global" in ptx and "st.global" in ptx, ptx
    assert len(kernel.asm["cubin"]) > 0
    return ptx
variants = [("mean", "sum", False, False, False), ("gcn", "sum", True, True, False),
            ("sum", "sum", False, True, False), ("sum", "mean", False, True, False),
            ("sum", "gcn", True, False, False), ("symmetric", "symmetric", True, False, False),
            ("symmetric", "symmetric", False, True, False), ("sum", "sum", True, False, True)]
for dt in ("fp32", "bf16", "fp16"):
    for row_scale, col_scale, self_loop, addend, self_eps in variants:
        sig = {"indptr_ptr": "*i64", "cols_ptr": "*i64", "x_ptr": f"*{dt}", "out_ptr": f"*{dt}",
               "col_indptr_ptr": "*i64", "addend_ptr": f"*{dt}", "self_eps_ptr": f"*{dt}",
               "n_rows": "i64", "n_self": "i64", "n_add": "i64", "feat": "i64",
               "stride_x": "i64", "stride_out": "i64", "stride_add": "i64"}
        cx = dict(ROWS=ROWS, BLOCK_F=MAX_BLOCK_F, ROW_SCALE=SCALES[row_scale],
                  COL_SCALE=SCALES[col_scale], SELF_LOOP=self_loop, HAS_ADDEND=addend,
                  SELF_EPS=self_eps)
        ptx = build(_csr_gather_kernel, sig, cx)
        assert ("div.rn.f32" in ptx) == (row_scale != "sum" or col_scale != "sum"), ptx
        assert ("sqrt.rn.f32" in ptx) == (row_scale == "symmetric"), ptx
sig = {"sorted_cols_ptr": "*i64", "order_ptr": "*i64", "indptr_ptr": "*i64",
       "t_indptr_ptr": "*i64", "t_dst_ptr": "*i64", "n_edges": "i64", "n_src": "i64",
       "n_dst": "i64", "edge_steps": "i64", "row_steps": "i64"}
build(_transpose_kernel, sig, dict(BLOCK=TRANSPOSE_BLOCK))
"""
    compile_triton_in_subprocess(code)
