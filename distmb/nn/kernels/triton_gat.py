"""GAT's attention-weighted aggregation as Triton CSR kernels (``--kernels triton``).

:func:`distmb.nn.aggregate.attention_aggregate`, i.e. ``attention_softmax`` followed by
``weighted_aggregate`` without the attention weights between them, in the style of
:mod:`distmb.nn.kernels.triton_aggregate`: one program per tile of :data:`ROWS` destination
rows x one head x a block of features, float32 in registers whatever the input dtype. For a
block's CSR (``indptr`` int64[n_dst + 1], ``indices`` int64[E] source positions), heads ``H``
and ``D`` features per head::

    pre[e, h]   = el[u_e, h] + er[v_e, h]                     (edge e = u_e -> v_e)
    logit[e, h] = pre if pre > 0 else negative_slope * pre    (LeakyReLU)
    a[e, h]     = exp(logit[e, h] - m[v, h]) / s[v, h]         (softmax over the edges of v)
    out[v, h, :] = sum_{e into v} a[e, h] * z[u_e, h, :]       (0 for v without edges)

with ``m[v, h]`` the largest logit of ``v``'s edges and ``s[v, h]`` the sum of their
``exp(logit - m)``: a numerically stable softmax. The forward walks each row's edges twice
(the maximum, reading ``el`` only; then the exponentials and the weighted sum of ``z`` in
registers) and keeps ``m`` and ``s`` (float32[n_dst, H]) for the backward, which recomputes
``a`` from them instead of storing ``a`` per edge.

**Backward**, with ``g[e, h] = <dout[v_e, h], z[u_e, h]>``::

    grad_z[u, h]  = sum_{e out of u} a[e, h] * dout[v_e, h]
    dpre[e, h]    = a[e, h] * (g[e, h] - sum_{e' into v_e} a[e', h] g[e', h]) * lrelu'(pre[e, h])
    grad_er[v, h] = sum_{e into v} dpre[e, h],    grad_el[u, h] = sum_{e out of u} dpre[e, h]

(the softmax Jacobian; ``lrelu'`` is 1 for ``pre > 0``, else ``negative_slope``, as
PyTorch's). A destination kernel over the CSR computes ``dpre`` (float32[E, H], one buffer)
and ``grad_er``, walking each row's edges twice: the weighted mean of ``g``, then ``dpre``
(``g`` recomputed rather than taken from ``<dout, out>``, so that bf16/fp16 outputs do not
round it). A source kernel over the block's transposed CSR (cached on the block, shared with
:mod:`~distmb.nn.kernels.triton_aggregate`) gathers ``grad_z`` and ``grad_el``. No atomics:
every sum has a fixed order, so results are reproducible bit for bit, for the reasons
:mod:`~distmb.nn.kernels.triton_aggregate` gives.

Attention dropout has no place between the softmax and the sum here: GATConv takes this path
only when it is inactive (``attn_dropout`` 0 or eval mode).

Runs on CUDA tensors; on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``).
Inputs float32, bfloat16 or float16 (each of ``el``, ``er``, ``z`` in its own); accumulation
in float32; every gradient in its input's dtype.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from distmb.nn.kernels.triton_aggregate import NUM_WARPS, ROWS, block_f, transposed_csr_edges
from distmb.pipeline.sample import Block
from distmb.pipeline.sample.idmap_triton import triton

if triton is not None:
    import triton.language as tl

#: Softmax statistics are kept in float32 (``m``, ``s`` and ``dpre``).
STATS_DTYPE = torch.float32


def _device_context(device: torch.device) -> contextlib.AbstractContextManager:
    """Launch on ``device`` (a CUDA device's context; nothing for the interpreter)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


if triton is not None:

    @triton.jit
    def _edge_logit(el_ptr, col, h, heads, er_row, emask, negative_slope):
        """(pre, logit) float32[ROWS] of the rows' current edges (0 where ``emask`` is off)."""
        pre = tl.load(el_ptr + col * heads + h, mask=emask, other=0.0).to(tl.float32) + er_row
        return pre, tl.where(pre > 0, pre, pre * negative_slope)

    @triton.jit(do_not_specialize=["n_dst", "heads", "dim"])
    def _gat_forward_kernel(
        indptr_ptr,
        cols_ptr,
        el_ptr,
        er_ptr,
        z_ptr,
        out_ptr,
        max_ptr,
        sum_ptr,
        n_dst,
        heads,
        dim,
        negative_slope,
        ROWS: tl.constexpr,
        BLOCK_F: tl.constexpr,
    ):
        """``out`` [ROWS rows, head, BLOCK_F features]; the first feature block also writes
        the rows' ``m`` and ``s`` (module docstring)."""
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        rmask = rows < n_dst
        h = tl.program_id(1).to(tl.int64)
        f_block = tl.program_id(2)
        f = f_block.to(tl.int64) * BLOCK_F + tl.arange(0, BLOCK_F)
        fmask = f < dim
        start = tl.load(indptr_ptr + rows, mask=rmask, other=0)
        deg = tl.load(indptr_ptr + rows + 1, mask=rmask, other=0) - start
        max_deg = tl.max(deg, axis=0)
        er_row = tl.load(er_ptr + rows * heads + h, mask=rmask, other=0.0).to(tl.float32)
        row_max = tl.full((ROWS,), float("-inf"), tl.float32)
        for k in range(0, max_deg):
            emask = rmask & (k < deg)
            col = tl.load(cols_ptr + start + k, mask=emask, other=0)
            _, logit = _edge_logit(el_ptr, col, h, heads, er_row, emask, negative_slope)
            row_max = tl.maximum(row_max, tl.where(emask, logit, float("-inf")))
        row_sum = tl.zeros((ROWS,), dtype=tl.float32)
        acc = tl.zeros((ROWS, BLOCK_F), dtype=tl.float32)
        for k in range(0, max_deg):
            emask = rmask & (k < deg)
            col = tl.load(cols_ptr + start + k, mask=emask, other=0)
            _, logit = _edge_logit(el_ptr, col, h, heads, er_row, emask, negative_slope)
            p = tl.exp(tl.where(emask, logit - row_max, float("-inf")))
            row_sum += p
            v = tl.load(
                z_ptr + (col * heads + h)[:, None] * dim + f[None, :],
                mask=emask[:, None] & fmask[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += p[:, None] * v
        acc = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
        tl.store(
            out_ptr + (rows * heads + h)[:, None] * dim + f[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=rmask[:, None] & fmask[None, :],
        )
        if f_block == 0:
            tl.store(max_ptr + rows * heads + h, row_max, mask=rmask)
            tl.store(sum_ptr + rows * heads + h, row_sum, mask=rmask)

    @triton.jit
    def _edge_dot(
        grad_out_ptr, z_ptr, rows, col, h, heads, dim, emask,
        ROWS: tl.constexpr, BLOCK_F: tl.constexpr,
    ):  # fmt: skip
        """g float32[ROWS] = <dout[row, h], z[col, h]> for the rows' current edges."""
        g = tl.zeros((ROWS,), dtype=tl.float32)
        for f0 in range(0, dim, BLOCK_F):
            f = f0 + tl.arange(0, BLOCK_F)
            m2 = emask[:, None] & (f < dim)[None, :]
            d_out = tl.load(
                grad_out_ptr + (rows * heads + h)[:, None] * dim + f[None, :], mask=m2, other=0.0
            ).to(tl.float32)
            zv = tl.load(
                z_ptr + (col * heads + h)[:, None] * dim + f[None, :], mask=m2, other=0.0
            ).to(tl.float32)
            g += tl.sum(d_out * zv, axis=1)
        return g

    @triton.jit(do_not_specialize=["n_dst", "heads", "dim"])
    def _gat_backward_dst_kernel(
        indptr_ptr,
        cols_ptr,
        el_ptr,
        er_ptr,
        z_ptr,
        grad_out_ptr,
        max_ptr,
        sum_ptr,
        dpre_ptr,
        grad_er_ptr,
        n_dst,
        heads,
        dim,
        negative_slope,
        ROWS: tl.constexpr,
        BLOCK_F: tl.constexpr,
    ):
        """``dpre`` of the edges of ROWS rows and one head, and those rows' ``grad_er``."""
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        rmask = rows < n_dst
        h = tl.program_id(1).to(tl.int64)
        start = tl.load(indptr_ptr + rows, mask=rmask, other=0)
        deg = tl.load(indptr_ptr + rows + 1, mask=rmask, other=0) - start
        max_deg = tl.max(deg, axis=0)
        er_row = tl.load(er_ptr + rows * heads + h, mask=rmask, other=0.0).to(tl.float32)
        row_max = tl.load(max_ptr + rows * heads + h, mask=rmask, other=0.0)
        row_sum = tl.load(sum_ptr + rows * heads + h, mask=rmask, other=1.0)
        row_sum = tl.where(row_sum > 0, row_sum, 1.0)  # rows without edges
        weighted_g = tl.zeros((ROWS,), dtype=tl.float32)
        for k in range(0, max_deg):
            emask = rmask & (k < deg)
            col = tl.load(cols_ptr + start + k, mask=emask, other=0)
            _, logit = _edge_logit(el_ptr, col, h, heads, er_row, emask, negative_slope)
            a = tl.exp(tl.where(emask, logit - row_max, float("-inf"))) / row_sum
            weighted_g += a * _edge_dot(
                grad_out_ptr, z_ptr, rows, col, h, heads, dim, emask, ROWS, BLOCK_F
            )
        grad_er = tl.zeros((ROWS,), dtype=tl.float32)
        for k in range(0, max_deg):
            emask = rmask & (k < deg)
            col = tl.load(cols_ptr + start + k, mask=emask, other=0)
            pre, logit = _edge_logit(el_ptr, col, h, heads, er_row, emask, negative_slope)
            a = tl.exp(tl.where(emask, logit - row_max, float("-inf"))) / row_sum
            g = _edge_dot(grad_out_ptr, z_ptr, rows, col, h, heads, dim, emask, ROWS, BLOCK_F)
            dpre = a * (g - weighted_g) * tl.where(pre > 0, 1.0, negative_slope)
            tl.store(dpre_ptr + (start + k) * heads + h, dpre, mask=emask)
            grad_er += dpre
        tl.store(grad_er_ptr + rows * heads + h, grad_er.to(grad_er_ptr.dtype.element_ty),
                 mask=rmask)  # fmt: skip

    @triton.jit(do_not_specialize=["n_src", "heads", "dim"])
    def _gat_backward_src_kernel(
        t_indptr_ptr,
        t_edges_ptr,
        t_dst_ptr,
        el_ptr,
        er_ptr,
        grad_out_ptr,
        max_ptr,
        sum_ptr,
        dpre_ptr,
        grad_z_ptr,
        grad_el_ptr,
        n_src,
        heads,
        dim,
        negative_slope,
        ROWS: tl.constexpr,
        BLOCK_F: tl.constexpr,
        GRAD_EL: tl.constexpr,
    ):
        """``grad_z`` [ROWS sources, head, BLOCK_F features] over the transposed CSR; the
        first feature block also writes the sources' ``grad_el`` (with ``GRAD_EL``)."""
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        rmask = rows < n_src
        h = tl.program_id(1).to(tl.int64)
        f_block = tl.program_id(2)
        f = f_block.to(tl.int64) * BLOCK_F + tl.arange(0, BLOCK_F)
        fmask = f < dim
        start = tl.load(t_indptr_ptr + rows, mask=rmask, other=0)
        deg = tl.load(t_indptr_ptr + rows + 1, mask=rmask, other=0) - start
        max_deg = tl.max(deg, axis=0)
        el_row = tl.load(el_ptr + rows * heads + h, mask=rmask, other=0.0).to(tl.float32)
        acc = tl.zeros((ROWS, BLOCK_F), dtype=tl.float32)
        grad_el = tl.zeros((ROWS,), dtype=tl.float32)
        for k in range(0, max_deg):
            emask = rmask & (k < deg)
            dst = tl.load(t_dst_ptr + start + k, mask=emask, other=0)
            pre = el_row + tl.load(er_ptr + dst * heads + h, mask=emask, other=0.0).to(tl.float32)
            logit = tl.where(pre > 0, pre, pre * negative_slope)
            row_max = tl.load(max_ptr + dst * heads + h, mask=emask, other=0.0)
            row_sum = tl.load(sum_ptr + dst * heads + h, mask=emask, other=1.0)
            a = tl.exp(tl.where(emask, logit - row_max, float("-inf"))) / row_sum
            d_out = tl.load(
                grad_out_ptr + (dst * heads + h)[:, None] * dim + f[None, :],
                mask=emask[:, None] & fmask[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += a[:, None] * d_out
            if GRAD_EL:
                edge = tl.load(t_edges_ptr + start + k, mask=emask, other=0)
                grad_el += tl.load(dpre_ptr + edge * heads + h, mask=emask, other=0.0)
        tl.store(
            grad_z_ptr + (rows * heads + h)[:, None] * dim + f[None, :],
            acc.to(grad_z_ptr.dtype.element_ty),
            mask=rmask[:, None] & fmask[None, :],
        )
        if GRAD_EL:
            if f_block == 0:
                tl.store(grad_el_ptr + rows * heads + h,
                         grad_el.to(grad_el_ptr.dtype.element_ty), mask=rmask)  # fmt: skip


def _require_triton() -> None:
    if triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")


def gat_forward(
    block: Block, el: Tensor, er: Tensor, z: Tensor, negative_slope: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward kernel, no autograd.

    Args:
        block: the message-flow graph (its CSR on ``z``'s device).
        el: float[n_src, H] contiguous, the source terms.
        er: float[n_dst, H] contiguous, the destination terms.
        z: float[n_src, H, D] contiguous, the source rows per head.
        negative_slope: the LeakyReLU's slope on the logits.

    Returns:
        ``out`` [n_dst, H, D] in ``z``'s dtype, and the softmax's ``m`` and ``s``, float32
        [n_dst, H] (``-inf`` and 0 for a destination without edges).
    """
    _require_triton()
    n_dst, heads, dim = block.n_dst, int(z.shape[1]), int(z.shape[2])
    out = torch.zeros((n_dst, heads, dim), dtype=z.dtype, device=z.device)
    row_max = torch.full((n_dst, heads), float("-inf"), dtype=STATS_DTYPE, device=z.device)
    row_sum = torch.zeros((n_dst, heads), dtype=STATS_DTYPE, device=z.device)
    if block.num_edges == 0 or heads == 0 or dim == 0:
        return out, row_max, row_sum
    tile_f = block_f(dim)
    grid = (triton.cdiv(n_dst, ROWS), heads, triton.cdiv(dim, tile_f))
    with _device_context(z.device):
        _gat_forward_kernel[grid](
            block.indptr, block.indices, el, er, z, out, row_max, row_sum,
            n_dst, heads, dim, float(negative_slope),
            ROWS=ROWS, BLOCK_F=tile_f, num_warps=NUM_WARPS,
        )  # fmt: skip
    return out, row_max, row_sum


def gat_backward(
    block: Block,
    el: Tensor,
    er: Tensor,
    z: Tensor,
    negative_slope: float,
    row_max: Tensor,
    row_sum: Tensor,
    grad_out: Tensor,
    need_scores: bool = True,
) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """The backward kernels, no autograd: ``(grad_el, grad_er, grad_z)`` in the dtypes of
    ``el``, ``er``, ``z`` (the first two None without ``need_scores``).

    Args (besides :func:`gat_forward`'s): ``row_max``, ``row_sum``: its ``m`` and ``s``;
    ``grad_out``: float[n_dst, H, D] contiguous.
    """
    _require_triton()
    n_dst, n_src = block.n_dst, block.n_src
    heads, dim = int(z.shape[1]), int(z.shape[2])
    device = z.device
    grad_z = torch.zeros_like(z)
    grad_el = torch.zeros_like(el) if need_scores else None
    grad_er = torch.zeros_like(er) if need_scores else None
    if block.num_edges == 0 or heads == 0 or dim == 0:
        return grad_el, grad_er, grad_z
    tile_f = block_f(dim)
    dpre = grad_z  # never read without need_scores (GRAD_EL is a compile-time constant)
    with _device_context(device):
        if need_scores:
            dpre = torch.empty((block.num_edges, heads), dtype=STATS_DTYPE, device=device)
            _gat_backward_dst_kernel[(triton.cdiv(n_dst, ROWS), heads)](
                block.indptr, block.indices, el, er, z, grad_out, row_max, row_sum, dpre,
                grad_er, n_dst, heads, dim, float(negative_slope),
                ROWS=ROWS, BLOCK_F=tile_f, num_warps=NUM_WARPS,
            )  # fmt: skip
        t_indptr, t_edges, t_dst = transposed_csr_edges(block)
        _gat_backward_src_kernel[(triton.cdiv(n_src, ROWS), heads, triton.cdiv(dim, tile_f))](
            t_indptr, t_edges, t_dst, el, er, grad_out, row_max, row_sum, dpre, grad_z,
            grad_el if need_scores else grad_z, n_src, heads, dim, float(negative_slope),
            ROWS=ROWS, BLOCK_F=tile_f, GRAD_EL=need_scores, num_warps=NUM_WARPS,
        )  # fmt: skip
    return grad_el, grad_er, grad_z


class _TritonAttentionAggregate(torch.autograd.Function):
    """``attention_aggregate(block, el, er, z, negative_slope)``; gradients w.r.t. el, er, z."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx, block: Block, el: Tensor, er: Tensor, z: Tensor, negative_slope: float
    ) -> Tensor:
        el, er, z = el.contiguous(), er.contiguous(), z.contiguous()
        out, row_max, row_sum = gat_forward(block, el, er, z, negative_slope)
        ctx.block, ctx.negative_slope = block, negative_slope  # type: ignore[attr-defined]
        ctx.save_for_backward(el, er, z, row_max, row_sum)
        return out

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: FunctionCtx, grad_out: Tensor
    ) -> tuple[None, Tensor | None, Tensor | None, Tensor | None, None]:
        _, need_el, need_er, need_z, _ = ctx.needs_input_grad  # type: ignore[attr-defined]
        if not (need_el or need_er or need_z):
            return None, None, None, None, None
        el, er, z, row_max, row_sum = ctx.saved_tensors  # type: ignore[attr-defined]
        grad_el, grad_er, grad_z = gat_backward(
            ctx.block, el, er, z, ctx.negative_slope,  # type: ignore[attr-defined]
            row_max, row_sum, grad_out.contiguous(), need_scores=need_el or need_er,
        )  # fmt: skip
        return (
            None,
            grad_el if need_el else None,
            grad_er if need_er else None,
            grad_z if need_z else None,
            None,
        )


def attention_aggregate(
    block: Block, el: Tensor, er: Tensor, z: Tensor, negative_slope: float
) -> Tensor:
    """:func:`distmb.nn.aggregate.attention_aggregate` (arguments checked there) with the
    Triton kernels: float[n_dst, H, D] in ``z``'s dtype."""
    return _TritonAttentionAggregate.apply(block, el, er, z, negative_slope)
