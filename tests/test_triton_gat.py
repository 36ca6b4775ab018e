"""GAT's attention-weighted aggregation as Triton kernels (distmb.nn.kernels.triton_gat,
``--kernels triton``) against a float64 brute force (explicit loops over every destination's
edges) and its autograd: under Triton's interpreter on CPU tensors here, compiled on a GPU
under ``pytest -m cuda``; and compiled for sm_90 without a GPU.

Tolerances are fp32 error bounds, per element: a sum of ``n`` float32 products is within
``n * eps * (the same sum of absolute values)``; the logits' rounding adds ``|logit| * eps``
relative to each weight, and a weight below float32's smallest normal number may flush to 0.
``eps`` is float32's machine epsilon (twice the unit roundoff)."""

from __future__ import annotations

import pytest
import torch
from conftest import compile_triton_in_subprocess
from torch import Tensor

from distmb.nn import GAT, GATConv
from distmb.nn.aggregate import add_self_loops, attention_aggregate
from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.nn.kernels import triton_gat as gat_triton
from distmb.nn.kernels import triton_gat_layer as gat_layer_triton
from distmb.nn.kernels.dispatch import get_kernels, set_kernels
from distmb.pipeline.sample import Block

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
EPS32 = torch.finfo(torch.float32).eps
#: Absolute error of a weight that underflows in float32.
TINY32 = torch.finfo(torch.float32).tiny
SLOPE = 0.2


def require(device: str) -> None:
    ok, why = aggregate_triton.usable(torch.device(device))
    if not ok:
        pytest.skip(why)


def block_from_rows(n_src: int, rows: list[list[int]]) -> Block:
    """A block whose destination ``v`` has the edges ``rows[v]`` (source positions)."""
    indptr = torch.tensor([0] + [len(r) for r in rows], dtype=torch.int64).cumsum(0)
    indices = torch.tensor([u for r in rows for u in r], dtype=torch.int64)
    return Block(len(rows), n_src, 0, indptr, indices, torch.arange(n_src))


def hand_built(heads: int) -> Block:
    """Empty rows (1, 4, 6), repeated sources (row 0: 3 three times), a hub of 23 edges
    (row 2) with repeats, a destination reading itself (row 3), and 7 rows: one tile of 4
    and a partial one."""
    hub = [(5 * k + heads) % 11 for k in range(23)]
    return block_from_rows(11, [[3, 3, 3], [], hub, [3, 0], [], [10, 1, 1], []])


def brute_alpha(block: Block, el: Tensor, er: Tensor) -> Tensor:
    """alpha [E, H] by loops: per destination and head, the softmax (max subtracted) of its
    edges' LeakyReLU(el[u] + er[v])."""
    indptr, indices = block.indptr.tolist(), block.indices.tolist()
    alpha = [None] * len(indices)
    for v in range(block.n_dst):
        for h in range(el.shape[1]):
            edges = range(indptr[v], indptr[v + 1])
            if not edges:
                continue
            logits = torch.stack([el[indices[e], h] + er[v, h] for e in edges])
            logits = torch.where(logits > 0, logits, SLOPE * logits)
            w = torch.exp(logits - logits.max().detach())
            for e, w_e in zip(edges, w / w.sum(), strict=True):
                alpha[e] = [w_e] if h == 0 else [*alpha[e], w_e]
    return torch.stack([torch.stack(a) for a in alpha]) if alpha else el.new_zeros(0, 1)


def brute_force(block: Block, el: Tensor, er: Tensor, z: Tensor) -> Tensor:
    """out [n_dst, H, D] by loops: the weighted sum of z[u] over each destination's edges."""
    alpha = brute_alpha(block, el, er)
    indptr, indices = block.indptr.tolist(), block.indices.tolist()
    rows = []
    for v in range(block.n_dst):
        total = torch.zeros_like(z[0])
        for e in range(indptr[v], indptr[v + 1]):
            total = total + alpha[e][:, None] * z[indices[e]]
        rows.append(total)
    return torch.stack(rows)


def reference(block: Block, el: Tensor, er: Tensor, z: Tensor, grad_out: Tensor):
    """(out, (grad_el, grad_er, grad_z)) of the brute force in float64 (autograd)."""
    inputs = [t.detach().cpu().double().requires_grad_() for t in (el, er, z)]
    out = brute_force(block.to("cpu"), *inputs)
    grads = torch.autograd.grad(out, inputs, grad_out.detach().cpu().double())
    return out.detach(), grads


def error_bounds(block: Block, el: Tensor, er: Tensor, z: Tensor, grad_out: Tensor):
    """fp32 error bounds [out, grad_el, grad_er, grad_z] (module docstring), float64.

    Every output is a sum over at most ``n`` edges (the largest in/out degree) of products
    of ``a`` (relative error ``(|logit| + 4) * eps``) with float32 values; the scores'
    gradients add a ``D``-term dot product ``g`` and its weighted mean per edge."""
    el, er, z, g_out = (t.detach().cpu().double() for t in (el, er, z, grad_out))
    block = block.to("cpu")
    dst = block.dst_of_edges()
    src = block.indices
    n = int(max(torch.bincount(dst, minlength=1).max(), torch.bincount(src, minlength=1).max()))
    pre = el[src] + er[dst]
    logit_scale = float(torch.where(pre > 0, pre, SLOPE * pre).abs().max()) if len(src) else 0.0
    terms = (n + logit_scale + 4) * EPS32
    # |out| bound: sum_e a_e |z|; grad_z's: sum_e a_e |grad_out|.
    abs_ref = reference(block, el, er, z.abs(), g_out.abs())
    out_bound = terms * abs_ref[0]
    grad_z_bound = terms * abs_ref[1][2]
    # Scores: per edge a_e (<|dout|, |z|> + sum_e' a_e' <|dout|, |z_e'|>), summed per row.
    alpha = brute_alpha(block, el, er)
    dots = (g_out.abs()[dst] * z.abs()[src]).sum(-1)  # [E, H]
    mean_dot = torch.zeros_like(er).index_add(0, dst, alpha * dots)
    per_edge = (terms + z.shape[2] * EPS32) * alpha * (dots + mean_dot[dst])
    grad_el_bound = torch.zeros_like(el).index_add(0, src, per_edge)
    grad_er_bound = torch.zeros_like(er).index_add(0, dst, per_edge)
    return [b + TINY32 for b in (out_bound, grad_el_bound, grad_er_bound, grad_z_bound)]


def check_within(got: Tensor, want: Tensor, bound: Tensor, what: str) -> None:
    err = (got.detach().cpu().double() - want).abs()
    worst = float((err - bound).max()) if err.numel() else 0.0
    assert worst <= 0.0, f"{what}: error {float(err.max()):.3g} exceeds its bound by {worst:.3g}"


def run_kernel(block: Block, el: Tensor, er: Tensor, z: Tensor, grad_out: Tensor):
    el, er, z = (t.clone().requires_grad_() for t in (el, er, z))
    out = gat_triton.attention_aggregate(block, el, er, z, SLOPE)
    grads = torch.autograd.grad(out, [el, er, z], grad_out)
    return out, grads


CASES = {
    "hand_built_3_heads": (3, 5, 1.0),
    "one_head_wide": (1, 130, 1.0),  # two feature tiles of 128
    "large_logits": (2, 4, 60.0),  # exp(logit) overflows float32 without the max
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_backward_match_float64_brute_force(device: str, case: str) -> None:
    require(device)
    heads, dim, logit_scale = CASES[case]
    block = hand_built(heads)
    gen = torch.Generator().manual_seed(dim)
    el = logit_scale * torch.randn(block.n_src, heads, generator=gen)
    er = logit_scale * torch.randn(block.n_dst, heads, generator=gen)
    z = torch.randn(block.n_src, heads, dim, generator=gen)
    grad_out = torch.randn(block.n_dst, heads, dim, generator=gen)
    want_out, want_grads = reference(block, el, er, z, grad_out)
    bounds = error_bounds(block, el, er, z, grad_out)
    dev = [t.to(device) for t in (el, er, z, grad_out)]
    out, grads = run_kernel(block.to(device), *dev)
    assert out.dtype == torch.float32 and out.shape == (block.n_dst, heads, dim)
    check_within(out, want_out, bounds[0], "out")
    for name, got, want, bound in zip(("el", "er", "z"), grads, want_grads, bounds[1:],
                                      strict=True):  # fmt: skip
        assert got.dtype == torch.float32
        check_within(got, want, bound, f"grad_{name}")
    empty = [1, 4, 6]
    assert torch.all(out[empty] == 0) and torch.all(grads[1][empty] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_of_z_alone_and_a_block_without_edges(device: str) -> None:
    """Without gradients for the scores only z's is computed (the source kernel without
    grad_el), equal to the full backward's; a block without edges gives zeros."""
    require(device)
    block = hand_built(2).to(device)
    gen = torch.Generator().manual_seed(11)
    el, er = torch.randn(11, 2, generator=gen), torch.randn(7, 2, generator=gen)
    z, grad_out = torch.randn(11, 2, 3, generator=gen), torch.randn(7, 2, 3, generator=gen)
    el, er, z, grad_out = (t.to(device) for t in (el, er, z, grad_out))
    _, (_, _, full_grad_z) = run_kernel(block, el, er, z, grad_out)
    z_req = z.clone().requires_grad_()
    out = gat_triton.attention_aggregate(block, el, er, z_req, SLOPE)
    (grad_z,) = torch.autograd.grad(out, [z_req], grad_out)
    assert torch.equal(grad_z, full_grad_z)
    no_edges = block_from_rows(11, [[]] * 7).to(device)
    out, grads = run_kernel(no_edges, el, er, z, grad_out)
    assert not out.any() and not any(g.any() for g in grads)


def self_loop_blocks(heads: int) -> dict[str, Block]:
    """Blocks for the in-kernel self loops: the hand-built one (a destination reading itself,
    rows without edges), destinations whose sources come before, after and at their own
    position (repeated), sources beyond the destinations, and a block without edges."""
    return {
        "hand_built": hand_built(heads),
        "around_own": block_from_rows(9, [[5, 0, 8], [1, 1, 0, 7], [3, 2, 2], [], [4, 0, 6]]),
        # Every source has edges into destinations before, at and after its own position.
        "dense": block_from_rows(8, [[(5 * v + 3 * k) % 8 for k in range(13)] for v in range(6)]),
        "no_edges": block_from_rows(6, [[]] * 4),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["hand_built", "around_own", "dense", "no_edges"])
@pytest.mark.parametrize("need_scores", [True, False])
def test_self_loops_in_kernel_equal_the_looped_block(device: str, case: str, need_scores):
    """``self_loops=True`` on a block gives what the kernels give on ``add_self_loops``'
    block (the own edge summed in the same place: the same float additions), bit for bit
    under the interpreter; on a GPU up to the compiler's fused multiply-adds. Checked
    against the float64 brute force on the looped block too."""
    require(device)
    heads, dim = 2, 19
    block = self_loop_blocks(heads)[case]
    looped = add_self_loops(block)
    gen = torch.Generator().manual_seed(17)
    el = torch.randn(block.n_src, heads, generator=gen)
    er = torch.randn(block.n_dst, heads, generator=gen)
    z = torch.randn(block.n_src, heads, dim, generator=gen)
    grad_out = torch.randn(block.n_dst, heads, dim, generator=gen)
    results = []
    for b, loops in ((block, True), (looped, False)):
        inputs = [t.to(device).requires_grad_(need_scores or t is z) for t in (el, er, z)]
        out = gat_triton.attention_aggregate(b.to(device), *inputs, SLOPE, loops)
        wrt = inputs if need_scores else inputs[2:]
        results.append([out, *torch.autograd.grad(out, wrt, grad_out.to(device))])
    for got, want in zip(*results, strict=True):
        if device == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    if need_scores:
        want_out, want_grads = reference(looped, el, er, z, grad_out)
        bounds = error_bounds(looped, el, er, z, grad_out)
        check_within(results[0][0], want_out, bounds[0], "out")
        for name, got, want, bound in zip(
            ("el", "er", "z"), results[0][1:], want_grads, bounds[1:], strict=True
        ):
            check_within(got, want, bound, f"grad_{name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["hand_built", "dense", "no_edges"])
@pytest.mark.parametrize("self_loops", [False, True])
def test_attention_layer_matches_float64_autograd(device: str, case: str, self_loops: bool):
    """:func:`attention_layer` (the scores kernel, the attention, the scores' terms of z's
    gradient folded into the source kernel) against autograd through PyTorch's scores and
    the brute force in float64: the output and the gradients of z, a_l and a_r."""
    require(device)
    heads, dim = 3, 21
    block = self_loop_blocks(heads)[case]
    gen = torch.Generator().manual_seed(23)
    z = torch.randn(block.n_src, heads, dim, generator=gen)
    attn_l, attn_r = 0.3 * torch.randn(2, heads, dim, generator=gen)
    grad_out = torch.randn(block.n_dst, heads, dim, generator=gen)
    inputs = [t.to(device).requires_grad_() for t in (z, attn_l, attn_r)]
    out = gat_layer_triton.attention_layer(block.to(device), *inputs, SLOPE, self_loops)
    grads = torch.autograd.grad(out, inputs, grad_out.to(device))
    z64, l64, r64 = (t.double().requires_grad_() for t in (z, attn_l, attn_r))
    el, er = (z64 * l64).sum(-1), (z64[: block.n_dst] * r64).sum(-1)
    ref = brute_force(add_self_loops(block) if self_loops else block, el, er, z64)
    if ref.requires_grad:
        ref_grads = torch.autograd.grad(ref, [z64, l64, r64], grad_out.double())
    else:  # no edges and no loops: the output is 0 whatever the inputs
        ref_grads = tuple(torch.zeros_like(t) for t in (z64, l64, r64))
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out.cpu().double(), ref.detach(), rtol=1e-5, atol=1e-5)
    for name, got, want in zip(("z", "a_l", "a_r"), grads, ref_grads, strict=True):
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_accumulate_in_float32(device: str, dtype: torch.dtype) -> None:
    """bf16/fp16 el, er, z and output gradient: every result is the float64 brute force on
    the rounded inputs, rounded once to ``dtype`` (half a unit in the last place; one unit
    for bf16 under the interpreter, which converts by truncation) plus the fp32 bound."""
    require(device)
    heads, dim = 2, 6
    block = hand_built(heads)
    gen = torch.Generator().manual_seed(7)
    el, er, z, grad_out = (torch.randn(*shape, generator=gen).to(dtype) for shape in (
        (block.n_src, heads), (block.n_dst, heads), (block.n_src, heads, dim),
        (block.n_dst, heads, dim)))  # fmt: skip
    want_out, want_grads = reference(block, el, er, z, grad_out)
    bounds = error_bounds(block, el, er, z, grad_out)
    out, grads = run_kernel(block.to(device), *(t.to(device) for t in (el, er, z, grad_out)))
    ulps = 1.0 if device == "cpu" and dtype == torch.bfloat16 else 0.5
    rounding = ulps * torch.finfo(dtype).eps
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    check_within(out, want_out, rounding * want_out.abs() + bounds[0], "out")
    for name, got, want, bound in zip(("el", "er", "z"), grads, want_grads, bounds[1:],
                                      strict=True):  # fmt: skip
        check_within(got, want, rounding * want.abs() + bound, f"grad_{name}")


@pytest.mark.parametrize("device", DEVICES)
def test_gat_layers_with_triton_equal_torch(device: str) -> None:
    """``--kernels triton`` behind the GAT model (two layers with self loops: 2 heads
    concatenated, then 2 heads averaged without activation), in training mode: the output
    and every parameter's and the input's gradient equal the ``--kernels torch`` run's."""
    require(device)
    gen = torch.Generator().manual_seed(3)
    blocks = [add_random_block(9, 18, gen).to(device), add_random_block(4, 9, gen).to(device)]
    x = torch.randn(18, 6, generator=gen).to(device)
    torch.manual_seed(0)
    model = GAT(6, 3, 5, num_layers=2, heads=2, dropout=0.0, self_loops=True).to(device)
    results = {}
    before = get_kernels()
    try:
        for kernels in ("torch", "triton"):
            set_kernels(kernels)
            model.zero_grad()
            x_req = x.clone().requires_grad_()
            out = model.train()(blocks, x_req)
            out.square().sum().backward()
            results[kernels] = [out.detach(), x_req.grad]
            results[kernels] += [p.grad.clone() for p in model.parameters()]
    finally:
        set_kernels(before)
    for a, b in zip(results["torch"], results["triton"], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def add_random_block(n_dst: int, n_src: int, gen: torch.Generator) -> Block:
    """Random degrees 0..5 with repeated sources and one hub of 12 edges."""
    deg = torch.randint(0, 6, (n_dst,), generator=gen)
    deg[0], deg[-1] = 12, 0
    rows = [torch.randint(0, n_src, (int(d),), generator=gen).tolist() for d in deg]
    return block_from_rows(n_src, rows)


def test_dispatch_only_where_the_kernel_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton path is taken with ``--kernels triton`` on tensors it takes, never under
    attention dropout in training, and ``--kernels torch`` / float64 use PyTorch ops;
    GATConv takes it as :func:`attention_layer` (scores and attention as one node)."""
    calls, layer_calls = [], []
    real, real_layer = gat_triton.attention_aggregate, gat_layer_triton.attention_layer
    monkeypatch.setattr(gat_triton, "attention_aggregate",
                        lambda *a: calls.append(a) or real(*a))  # fmt: skip
    monkeypatch.setattr(gat_layer_triton, "attention_layer",
                        lambda *a: layer_calls.append(a) or real_layer(*a))  # fmt: skip
    block = hand_built(1)
    el, er, z = torch.randn(11, 2), torch.randn(7, 2), torch.randn(11, 2, 3)
    before = get_kernels()
    try:
        set_kernels("torch")
        torch_out = attention_aggregate(block, el, er, z, SLOPE)
        assert calls == []
        set_kernels("triton")
        attention_aggregate(block, el.double(), er.double(), z.double(), SLOPE)
        assert calls == []
        torch.testing.assert_close(attention_aggregate(block, el, er, z, SLOPE), torch_out)
        assert len(calls) == 1
        conv = GATConv(4, 3, heads=2, attn_dropout=0.5)
        conv.train()(block, torch.randn(11, 4))
        assert len(calls) == 1 and layer_calls == []
        conv.eval()(block, torch.randn(11, 4))
        assert len(calls) == 1 and len(layer_calls) == 1
        with pytest.raises(ValueError, match=r"expected z \[n_src, H=2, D\]"):
            attention_aggregate(block, el, er, z[:, :1], SLOPE)
    finally:
        set_kernels(before)


def test_kernels_compile_for_hopper() -> None:
    """Every kernel (the scores, forward, both backward passes, with and without grad_el,
    with and without self loops, with and without the scores' terms folded) compiles to a
    cubin for sm_90 in float32 and bf16 (fp16 takes bf16's conversions) without a GPU, with
    no atomics."""
    code = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from distmb.nn.kernels import triton_gat as k
from distmb.nn.kernels import triton_gat_layer as layer
common = {"heads": "i32", "dim": "i32", "negative_slope": "fp32"}
for dt in ("fp32", "bf16"):
    p = f"*{dt}"
    fwd = {"indptr_ptr": "*i64", "cols_ptr": "*i64", "el_ptr": p, "er_ptr": p, "z_ptr": p,
           "out_ptr": p, "max_ptr": "*fp32", "sum_ptr": "*fp32", "n_dst": "i64"}
    dst = {"indptr_ptr": "*i64", "cols_ptr": "*i64", "el_ptr": p, "er_ptr": p, "z_ptr": p,
           "grad_out_ptr": p, "max_ptr": "*fp32", "sum_ptr": "*fp32", "dpre_ptr": "*fp32",
           "dpre_self_ptr": "*fp32", "grad_er_ptr": p, "edge_g_ptr": "*fp32", "n_dst": "i64"}
    src = {"t_indptr_ptr": "*i64", "t_edges_ptr": "*i64", "t_dst_ptr": "*i64", "el_ptr": p,
           "er_ptr": p, "grad_out_ptr": p, "max_ptr": "*fp32", "sum_ptr": "*fp32",
           "dpre_ptr": "*fp32", "dpre_self_ptr": "*fp32", "grad_z_ptr": p, "grad_el_ptr": p,
           "grad_er_ptr": "*fp32", "attn_l_ptr": p, "attn_r_ptr": p, "n_src": "i64",
           "n_dst": "i64"}
    scores = {"z_ptr": p, "attn_l_ptr": p, "attn_r_ptr": p, "el_ptr": "*fp32",
              "er_ptr": "*fp32", "n_src": "i64", "n_dst": "i64"}
    variants = [(layer._gat_scores_kernel, scores, {})]
    for loop in (False, True):
        variants += [(k._gat_forward_kernel, fwd, {"SELF_LOOP": loop}),
                     (k._gat_backward_dst_kernel, dst, {"SELF_LOOP": loop})]
        for grad_el, fold in ((True, True), (True, False), (False, False)):
            flags = {"GRAD_EL": grad_el, "SELF_LOOP": loop, "FOLD_SCORES": fold}
            variants.append((k._gat_backward_src_kernel, src, flags))
    for kernel, sig, flags in variants:
        sig = {**sig, **{a: t for a, t in common.items() if a in kernel.arg_names}}
        cx = dict(ROWS=k.ROWS, BLOCK_F=64, **flags)
        sig.update({c: "constexpr" for c in cx})
        compiled = triton.compile(ASTSource(kernel, sig, constexprs=cx),
                                  target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        assert "atom." not in ptx and "ld.global" in ptx and "st.global" in ptx, ptx
        assert len(compiled.asm["cubin"]) > 0
"""
    compile_triton_in_subprocess(code)
