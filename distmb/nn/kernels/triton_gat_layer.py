"""GATConv's attention from its projection as one autograd node on the Triton path
(:func:`attention_layer`): the scores ``el = <z, a_l>``, ``er = <z[:n_dst], a_r>`` in one
Triton kernel (:func:`gat_scores`), then the attention-weighted aggregation of
:mod:`distmb.nn.kernels.triton_gat`, whose backward source kernel also sums the scores'
terms of ``z``'s gradient (``fold``). Runs where :mod:`~distmb.nn.kernels.triton_gat` runs:
CUDA tensors, and CPU tensors under Triton's interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from distmb.nn.kernels.triton_aggregate import NUM_WARPS, block_f, device_context, require_triton
from distmb.nn.kernels.triton_gat import STATS_DTYPE, gat_backward, gat_forward
from distmb.pipeline.sample import Block
from distmb.pipeline.sample.idmap_triton import triton

if triton is not None:
    import triton.language as tl

#: Sources per program of :func:`gat_scores` (one dot product per source and head).
SCORE_ROWS = 32


if triton is not None:

    @triton.jit(do_not_specialize=["n_src", "n_dst", "heads", "dim"])
    def _gat_scores_kernel(
        z_ptr,
        attn_l_ptr,
        attn_r_ptr,
        el_ptr,
        er_ptr,
        n_src,
        n_dst,
        heads,
        dim,
        ROWS: tl.constexpr,
        BLOCK_F: tl.constexpr,
    ):
        """``el[u, h] = <z[u, h], a_l[h]>`` of ROWS sources and one head, and ``er[u, h] =
        <z[u, h], a_r[h]>`` of those that are destinations (``u < n_dst``): float32 sums
        over the features, in a fixed order (no atomics)."""
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        rmask = rows < n_src
        h = tl.program_id(1).to(tl.int64)
        el = tl.zeros((ROWS,), dtype=tl.float32)
        er = tl.zeros((ROWS,), dtype=tl.float32)
        for f0 in range(0, dim, BLOCK_F):
            f = f0 + tl.arange(0, BLOCK_F)
            fmask = f < dim
            zv = tl.load(
                z_ptr + (rows * heads + h)[:, None] * dim + f[None, :],
                mask=rmask[:, None] & fmask[None, :],
                other=0.0,
            ).to(tl.float32)
            a_l = tl.load(attn_l_ptr + h * dim + f, mask=fmask, other=0.0).to(tl.float32)
            a_r = tl.load(attn_r_ptr + h * dim + f, mask=fmask, other=0.0).to(tl.float32)
            el += tl.sum(zv * a_l[None, :], axis=1)
            er += tl.sum(zv * a_r[None, :], axis=1)
        tl.store(el_ptr + rows * heads + h, el, mask=rmask)
        tl.store(er_ptr + rows * heads + h, er, mask=rmask & (rows < n_dst))


def gat_scores(z: Tensor, attn_l: Tensor, attn_r: Tensor, n_dst: int) -> tuple[Tensor, Tensor]:
    """GATConv's ``(el, er)``, no autograd: ``el = (z * a_l).sum(-1)`` float32[n_src, H] and
    ``er = (z[:n_dst] * a_r).sum(-1)`` float32[n_dst, H], one launch for both.

    Args:
        z: float[n_src, H, D] contiguous.
        attn_l, attn_r: float[H, D] contiguous.
        n_dst: the destinations (the first rows of ``z``).
    """
    require_triton()
    n_src, heads, dim = (int(d) for d in z.shape)
    el = torch.empty((n_src, heads), dtype=STATS_DTYPE, device=z.device)
    er = torch.empty((n_dst, heads), dtype=STATS_DTYPE, device=z.device)
    if n_src == 0 or heads == 0:
        return el, er
    if dim == 0:
        return el.zero_(), er.zero_()
    grid = (triton.cdiv(n_src, SCORE_ROWS), heads)
    with device_context(z.device):
        _gat_scores_kernel[grid](
            z, attn_l, attn_r, el, er, n_src, n_dst, heads, dim,
            ROWS=SCORE_ROWS, BLOCK_F=block_f(dim), num_warps=NUM_WARPS,
        )  # fmt: skip
    return el, er


def attention_forward(
    block: Block,
    z: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    negative_slope: float,
    self_loops: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`attention_layer`'s forward, no autograd (its arguments): ``out`` float[n_dst,
    H, D] in ``z``'s dtype, then what the backward keeps: the scores ``el`` float32[n_src,
    H], ``er`` float32[n_dst, H] (:func:`gat_scores`) and the softmax's ``row_max``,
    ``row_sum`` float32[n_dst, H] (:func:`~distmb.nn.kernels.triton_gat.gat_forward`)."""
    z, attn_l, attn_r = z.contiguous(), attn_l.contiguous(), attn_r.contiguous()
    el, er = gat_scores(z, attn_l, attn_r, block.n_dst)
    out, row_max, row_sum = gat_forward(block, el, er, z, negative_slope, self_loops)
    return out, el, er, row_max, row_sum


def attention_backward(
    grad_out: Tensor,
    z: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    saved: Sequence[Tensor],
    block: Block,
    negative_slope: float,
    self_loops: bool,
    needs: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """:func:`attention_layer`'s backward, no autograd: grad_out float[n_dst, H, D] -> the
    gradients of ``(z, attn_l, attn_r)`` (their shapes and dtypes), None where ``needs``
    (three flags, in that order) is false. ``saved``: :func:`attention_forward`'s ``(el,
    er, row_max, row_sum)``; the other arguments the forward's. The block's transposed CSR is
    built on first use and cached on the block
    (:func:`~distmb.nn.kernels.triton_aggregate.transposed_csr_edges`)."""
    z, attn_l, attn_r = z.contiguous(), attn_l.contiguous(), attn_r.contiguous()
    el, er, row_max, row_sum = saved
    grad_el, grad_er, grad_z = gat_backward(
        block, el, er, z, negative_slope, row_max, row_sum, grad_out.contiguous(),
        need_scores=True, self_loops=self_loops, fold=(attn_l, attn_r),
    )  # fmt: skip
    need_z, need_l, need_r = needs
    grad_l = (grad_el.unsqueeze(-1) * z).sum(0).to(attn_l.dtype) if need_l else None
    grad_r = None
    if need_r:
        grad_r = (grad_er.unsqueeze(-1) * z[: block.n_dst]).sum(0).to(attn_r.dtype)
    return grad_z if need_z else None, grad_l, grad_r


class _TritonAttentionLayer(torch.autograd.Function):
    """:func:`attention_layer`: the scores and the attention as one node; gradients w.r.t.
    ``z``, ``a_l`` and ``a_r`` (:func:`attention_forward`, :func:`attention_backward`)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx,
        z: Tensor,
        attn_l: Tensor,
        attn_r: Tensor,
        block: Block,
        negative_slope: float,
        self_loops: bool,
    ) -> Tensor:
        out, *saved = attention_forward(block, z, attn_l, attn_r, negative_slope, self_loops)
        ctx.block, ctx.negative_slope = block, negative_slope  # type: ignore[attr-defined]
        ctx.self_loops = self_loops  # type: ignore[attr-defined]
        ctx.save_for_backward(z, attn_l, attn_r, *saved)
        return out

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: FunctionCtx, grad_out: Tensor
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None]:
        z, attn_l, attn_r, *saved = ctx.saved_tensors  # type: ignore[attr-defined]
        grads = attention_backward(
            grad_out, z, attn_l, attn_r, saved, ctx.block,  # type: ignore[attr-defined]
            ctx.negative_slope, ctx.self_loops,  # type: ignore[attr-defined]
            ctx.needs_input_grad[:3],  # type: ignore[attr-defined]
        )  # fmt: skip
        return *grads, None, None, None


def attention_layer(
    block: Block,
    z: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    negative_slope: float,
    self_loops: bool = False,
) -> Tensor:
    """GATConv's attention from its projection: ``attention_aggregate(block, el, er, z,
    negative_slope, self_loops)`` with ``el = (z * a_l).sum(-1)`` and ``er = (z[:n_dst] *
    a_r).sum(-1)``, as one autograd node (no attention dropout).

    Fewer launches than the same through PyTorch's ops: the scores are one kernel
    (:func:`gat_scores`, float32), and in the backward their terms of ``z``'s gradient are
    summed by the source kernel (``fold``) where autograd would multiply, slice, pad and add
    four times; ``a_l``'s and ``a_r``'s gradients are a product and a sum each.

    Args:
        block: the message-flow graph (its CSR on ``z``'s device).
        z: float[n_src, H, D], the projected sources (the first ``n_dst`` the destinations).
        attn_l, attn_r: float[H, D], the attention vectors.
        negative_slope: the LeakyReLU's slope on the logits.
        self_loops: every destination also attends to itself.

    Returns:
        float[n_dst, H, D] in ``z``'s dtype.
    """
    return _TritonAttentionLayer.apply(z, attn_l, attn_r, block, negative_slope, self_loops)
