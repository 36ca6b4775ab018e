"""The Triton path's aggregation layer nodes: SAGEConv's and GCNConv's linear and
aggregation part (:class:`LinearAggregate`) and GINConv's aggregation (:class:`GINAggregate`),
each one autograd node over the aggregation kernel of
:mod:`distmb.nn.kernels.triton_aggregate`.

Each node's forward and backward are plain functions over a :class:`Block`
(:func:`linear_aggregate_forward` / :func:`linear_aggregate_backward`,
:func:`gin_aggregate_forward` / :func:`gin_aggregate_backward`), which the autograd functions
here and the custom operators of :mod:`distmb.nn.kernels.ops` (``--compile``) both call; the
layers take either through :mod:`~distmb.nn.kernels.ops`' entry points.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.pipeline.sample import Block


def projects_first(w_neigh: Tensor) -> bool:
    """Whether :class:`LinearAggregate` projects before it aggregates: ``w_neigh`` [out, in]
    narrows (``out < in``), so the aggregation runs on the narrower width."""
    return w_neigh.shape[0] < w_neigh.shape[1]


def linear_aggregate_forward(
    x_src: Tensor,
    w_neigh: Tensor,
    w_self: Tensor | None,
    bias: Tensor,
    block: Block,
    kind: str,
) -> tuple[Tensor, Tensor | None]:
    """:class:`LinearAggregate`'s forward, no autograd.

    Args:
        x_src: float[n_src, in].
        w_neigh: [out, in]; w_self: [out, in] or None; bias: [out] (``x_src``'s dtype).
        block: the layer's block (its transposed CSR read from the block's cache, built
            there on first use by the ``"symmetric"`` kinds).
        kind: a key of :data:`~distmb.nn.kernels.triton_aggregate.KINDS`.

    Returns:
        ``out`` float[n_dst, out], and what the backward needs besides the inputs: the
        aggregation ``h`` float[n_dst, in] (aggregate first) or None (project first).
    """
    n_dst = block.n_dst
    if projects_first(w_neigh):
        z = torch.mm(x_src, w_neigh.t())
        if w_self is None:
            addend = bias.expand(n_dst, -1)
        else:
            addend = torch.addmm(bias, x_src[:n_dst], w_self.t())
        return aggregate_triton.aggregate_forward(block, z, kind, addend), None
    h = aggregate_triton.aggregate_forward(block, x_src, kind)
    out = torch.addmm(bias, h, w_neigh.t())
    if w_self is not None:
        out.addmm_(x_src[:n_dst], w_self.t())
    return out, h


def linear_aggregate_backward(
    grad_out: Tensor,
    x_src: Tensor,
    w_neigh: Tensor,
    w_self: Tensor | None,
    h: Tensor | None,
    block: Block,
    kind: str,
    needs: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """:class:`LinearAggregate`'s backward, no autograd: the gradients of ``(x_src, w_neigh,
    w_self, bias)`` (their shapes and dtype), None where ``needs`` (four flags, in that order)
    is false or ``w_self`` is None.

    Args:
        grad_out: float[n_dst, out].
        x_src, w_neigh, w_self, block, kind: the forward's.
        h: the forward's aggregation (:func:`linear_aggregate_forward`; read aggregate first
            only).
        needs: which gradients to compute.
    """
    need_x, need_wn, need_ws, need_b = needs
    n_dst = block.n_dst
    grad_x = grad_wn = grad_ws = grad_b = None
    if need_b:
        grad_b = grad_out.sum(0)
    if w_self is not None and need_ws:
        grad_ws = grad_out.t().mm(x_src[:n_dst])
    if projects_first(w_neigh):
        if need_x or need_wn:
            grad_z = aggregate_triton.aggregate_backward(block, kind, grad_out)
            if need_wn:
                grad_wn = grad_z.t().mm(x_src)
            if need_x:
                grad_x = grad_z.mm(w_neigh)
                if w_self is not None:
                    grad_x[:n_dst].addmm_(grad_out, w_self)
    else:
        if need_wn:
            grad_wn = grad_out.t().mm(h)
        if need_x:
            grad_self = None if w_self is None else grad_out.mm(w_self)
            grad_x = aggregate_triton.aggregate_backward(
                block, kind, grad_out.mm(w_neigh), grad_self
            )
    return grad_x, grad_wn, grad_ws, grad_b


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
    autocast (:func:`~distmb.nn.kernels.triton_aggregate.takes_layer`). The computation:
    :func:`linear_aggregate_forward` and :func:`linear_aggregate_backward`.
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
        out, h = linear_aggregate_forward(x_src, w_neigh, w_self, bias, block, kind)
        ctx.save_for_backward(x_src, w_neigh, w_self, h)
        ctx.block, ctx.kind = block, kind
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x_src, w_neigh, w_self, h = ctx.saved_tensors
        grads = linear_aggregate_backward(
            grad_out, x_src, w_neigh, w_self, h, ctx.block, ctx.kind, ctx.needs_input_grad[:4]
        )
        return *grads, None, None


def gin_aggregate_forward(x_src: Tensor, eps: Tensor, block: Block) -> Tensor:
    """:class:`GINAggregate`'s forward, no autograd: x_src float[n_src, F], eps [1] ->
    ``(1 + eps) x_src[:n_dst] + sum_{u -> v} x_u`` float[n_dst, F]."""
    return aggregate_triton.aggregate_forward(block, x_src, "sum", self_eps=eps)


def gin_aggregate_backward(
    grad_out: Tensor,
    x_src: Tensor,
    eps: Tensor,
    block: Block,
    needs: Sequence[bool],
) -> tuple[Tensor | None, Tensor | None]:
    """:class:`GINAggregate`'s backward, no autograd: grad_out float[n_dst, F] -> the
    gradients of ``(x_src, eps)`` ([n_src, F], [1]), None where ``needs`` (two flags, in
    that order) is false."""
    need_x, need_eps = needs
    grad_x = grad_eps = None
    if need_x:
        grad_x = aggregate_triton.aggregate_backward(block, "sum", grad_out, self_eps=eps)
    if need_eps:
        x_dst = x_src[: block.n_dst]
        grad_eps = torch.dot(grad_out.reshape(-1), x_dst.reshape(-1)).reshape(1)
    return grad_x, grad_eps


class GINAggregate(torch.autograd.Function):
    """GIN's ``(1 + eps) · x_src[:n_dst] + sum_{u -> v} x_u`` on the Triton path as one
    autograd node and one kernel each way
    (:func:`~distmb.nn.kernels.triton_aggregate.aggregate_forward` with ``self_eps``: the own
    row weighted ``1 + eps`` in the kernel, in float32, added after the neighbour sum as the
    PyTorch ops add it). Backward: ``x``'s gradient is the transposed sum with the own row
    weighted ``1 + eps`` again (autograd would add a zero-padded slice gradient), ``eps``'s
    the dot product ``<grad_out, x_src[:n_dst]>`` (summed in another order than autograd's
    product and sum: the same up to float rounding), nothing for an input that needs none.

    Args of forward: x_src [n_src, F], eps [1] (a parameter or a buffer) in ``x_src``'s
    dtype, the block; output [n_dst, F] in ``x_src``'s dtype. The computation:
    :func:`gin_aggregate_forward` and :func:`gin_aggregate_backward`.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x_src: Tensor, eps: Tensor, block: Block) -> Tensor:
        ctx.save_for_backward(x_src, eps)
        ctx.block = block
        return gin_aggregate_forward(x_src, eps, block)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x_src, eps = ctx.saved_tensors
        grads = gin_aggregate_backward(grad_out, x_src, eps, ctx.block, ctx.needs_input_grad[:2])
        return *grads, None
