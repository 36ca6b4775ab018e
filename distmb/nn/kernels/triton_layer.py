"""The Triton path's linear-and-aggregate layer node (:class:`LinearAggregate`): the
aggregation kernel of :mod:`distmb.nn.kernels.triton_aggregate` and the layer's matrix
products in one autograd node, shared by SAGEConv and GCNConv."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from distmb.nn.kernels import ops as kernel_ops
from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.pipeline.sample import Block


class LinearAggregate(torch.autograd.Function):
    """A layer's AGG and linear part on the Triton path as one autograd node (no ReLU, no
    dropout): ``W_n · AGG(x) + W_s · x[:n_dst] + b`` with the aggregation ``kind`` of
    :mod:`distmb.nn.kernels.triton_aggregate` (SAGEConv's ``mean``/``sum``/``gcn``; GCNConv's
    ``symmetric``/``symmetric_self`` without ``W_s``), fewer launches than the same through
    ``nn.Linear`` and autograd. Arguments of ``apply``: ``x_src`` float[n_src, in],
    ``w_neigh`` [out, in], ``w_self`` [out, in] or None, ``bias`` [out], the block, the kind.

    Aggregate first (``out_dim >= in_dim``): ``addmm(b, AGG(x), W_n^T)`` then
    ``addmm_(x[:n_dst], W_s^T)`` (PyTorch's ops: mm, mm, add, add). Project first: ``z = x
    @ W_n^T``, then ``AGG(z)`` with ``addmm(b, x[:n_dst], W_s^T)`` (or ``b`` alone) added in
    the kernel. Backward: ``x`` is used twice (all rows aggregated, the first ``n_dst`` as
    the self term); autograd would write the slice's zero-padded gradient and add it, here
    the self term's gradient is the aggregation backward kernel's addend (aggregate first)
    or added in place by ``addmm_`` (project first), and nothing is computed for ``x`` when
    it needs no gradient (a first layer's features).

    The same values as the unfused ops up to float rounding (``addmm`` and the kernel's
    addend sum in another order). float32/bf16/fp16 inputs in the parameters' dtype, no
    autocast (:func:`~distmb.nn.kernels.triton_aggregate.takes_layer`).
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x_src: Tensor,
        w_neigh: Tensor,
        w_self: Tensor | None,
        bias: Tensor,
        block: Block,
        kind: str,
    ) -> Tensor:
        n_dst = block.n_dst
        project = w_neigh.shape[0] < w_neigh.shape[1]
        h = None
        if project:
            z = torch.mm(x_src, w_neigh.t())
            if w_self is None:
                addend = bias.expand(n_dst, -1)
            else:
                addend = torch.addmm(bias, x_src[:n_dst], w_self.t())
            out = aggregate_triton.aggregate_forward(block, z, kind, addend)
        else:
            h = aggregate_triton.aggregate_forward(block, x_src, kind)
            out = torch.addmm(bias, h, w_neigh.t())
            if w_self is not None:
                out.addmm_(x_src[:n_dst], w_self.t())
        ctx.save_for_backward(x_src, w_neigh, w_self, h)
        ctx.block, ctx.kind, ctx.project = block, kind, project
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, wn, ws, h = ctx.saved_tensors
        block, kind = ctx.block, ctx.kind
        need_x, need_wn, need_ws, need_b = ctx.needs_input_grad[:4]
        x_dst = x[: block.n_dst]
        grad_x = grad_wn = grad_ws = grad_b = None
        if need_b:
            grad_b = grad_out.sum(0)
        if ws is not None and need_ws:
            grad_ws = grad_out.t().mm(x_dst)
        if ctx.project:
            if need_x or need_wn:
                grad_z = aggregate_triton.aggregate_backward(block, kind, grad_out)
                if need_wn:
                    grad_wn = grad_z.t().mm(x)
                if need_x:
                    grad_x = grad_z.mm(wn)
                    if ws is not None:
                        grad_x[: block.n_dst].addmm_(grad_out, ws)
        else:
            if need_wn:
                grad_wn = grad_out.t().mm(h)
            if need_x:
                grad_self = None if ws is None else grad_out.mm(ws)
                grad_x = aggregate_triton.aggregate_backward(
                    block, kind, grad_out.mm(wn), grad_self
                )
        return grad_x, grad_wn, grad_ws, grad_b, None, None


def linear_aggregate(
    x_src: Tensor,
    w_neigh: Tensor,
    w_self: Tensor | None,
    bias: Tensor,
    block: Block,
    kind: str,
) -> Tensor:
    """:class:`LinearAggregate` (arguments of its ``apply``): float[n_dst, out]. While
    ``torch.compile`` traces (``--compile``) the same node as the traceable operators of
    :mod:`distmb.nn.kernels.ops` (the same launches, values and gradients)."""
    if torch.compiler.is_compiling():
        return kernel_ops.linear_aggregate(x_src, w_neigh, w_self, bias, block, kind)
    return LinearAggregate.apply(x_src, w_neigh, w_self, bias, block, kind)
