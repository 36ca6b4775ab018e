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


def test_feature_tile():
    assert [aggregate_triton.block_f(f) for f in (1, 16, 17, 100, 128, 129, 602)] == [
        16, 16, 32, 128, 128, 128, 128,
    ]  # fmt: skip


def test_kernel_compiles_for_hopper():
    """Compile every variant (forward mean/sum/gcn, backward with column scales and own row)
    for sm_90 in float32, bf16 and fp16 without a GPU: no atomics, global loads and stores."""
    code = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from distmb.nn.kernels.triton_aggregate import MAX_BLOCK_F, ROWS, _csr_gather_kernel
variants = [(True, False, False), (True, False, True), (False, True, True), (False, False, False)]
for dt in ("fp32", "bf16", "fp16"):
    for row_scale, col_scale, self_loop in variants:
        sig = {"indptr_ptr": "*i64", "cols_ptr": "*i64", "x_ptr": f"*{dt}", "out_ptr": f"*{dt}",
               "row_scale_ptr": "*fp32", "col_scale_ptr": "*fp32", "n_rows": "i64",
               "n_self": "i64", "feat": "i64", "stride_x": "i64", "stride_out": "i64"}
        cx = dict(ROWS=ROWS, BLOCK_F=MAX_BLOCK_F, HAS_ROW_SCALE=row_scale,
                  HAS_COL_SCALE=col_scale, SELF_LOOP=self_loop)
        sig.update({k: "constexpr" for k in cx})
        kernel = triton.compile(ASTSource(_csr_gather_kernel, sig, constexprs=cx),
                                target=GPUTarget("cuda", 90, 32))
        ptx = kernel.asm["ptx"]
        assert "atom." not in ptx and "ld.global" in ptx and "st.global" in ptx, ptx
        assert len(kernel.asm["cubin"]) > 0
"""
    compile_triton_in_subprocess(code)
