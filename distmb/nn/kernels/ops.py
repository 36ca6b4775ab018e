"""The Triton path's layer nodes as the layers take them: eagerly their autograd functions
(:class:`~distmb.nn.kernels.triton_layer.LinearAggregate`,
:class:`~distmb.nn.kernels.triton_layer.GINAggregate`,
:func:`~distmb.nn.kernels.triton_gat_layer.attention_layer`), and while ``torch.compile``
traces (:func:`torch.compiler.is_compiling`, ``--compile``) the same nodes as PyTorch custom
operators (namespace ``distmb``), so that ``torch.compile(model, dynamic=True,
fullgraph=True)`` traces a whole model without a graph break: each is opaque to the compiler
(its implementation runs eagerly at run time, the Triton kernels launched as in the eager
path) and has a fake implementation (output shapes, symbolic in the batch's sizes) and a
backward, itself a custom operator. :func:`linear_aggregate` (SAGEConv, GCNConv),
:func:`gin_aggregate` and :func:`attention_layer` choose.

Why opaque custom operators (``torch.library.custom_op``) and not ``torch.library.triton_op``:
a ``triton_op`` is traced into by the compiler, which then needs the Triton kernels as
user-defined kernels it compiles, on CUDA tensors; the same graphs must also run on CPU
tensors under Triton's interpreter (CI), where the compiler cannot trace a kernel launch.
An opaque operator runs the same Python launch code on either device and lets the compiler
optimise everything around it (the ReLUs, dropouts, the loss, the optimizer's inputs).

The operators take a block's tensors, not a :class:`~distmb.pipeline.sample.Block`: the CSR
(``indptr`` int64[n_dst + 1], ``indices`` int64[E]) and, where a kernel needs it, the
transposed CSR (:func:`transposed_csr`, built before the layer's operator: its row pointers
``t_indptr`` int64[n_src + 1] and the destination of every transposed edge ``t_dst``
int64[E]). The sizes are the tensors' (``n_dst = indptr.shape[0] - 1``, ``n_src =
x.shape[0]``), so a compiled graph is symbolic in them and one graph serves every batch.
Inside, an operator rebuilds the block from them (the transposed CSR in its cache) and calls
the node's own forward or backward function, the one its autograd function calls: the same
kernels run in the same order with the same arguments either way, so the values and
gradients are the eager path's bit for bit. Eagerly the layers keep the autograd functions:
the op census counts their launches, and a custom operator's dispatch costs host time per
call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.library import custom_op, register_autograd, register_fake

from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.nn.kernels import triton_gat_layer, triton_layer
from distmb.nn.kernels.triton_gat import STATS_DTYPE
from distmb.pipeline.sample import Block

#: The operators' namespace (``torch.ops.distmb``).
NAMESPACE = "distmb"
#: A gradient that is not needed: an operator cannot return None, so it returns this
#: shape's empty tensor, which the autograd formula turns into None.
NO_GRAD_SHAPE = (0,)


def _block(
    indptr: Tensor,
    indices: Tensor,
    n_src: int,
    t_indptr: Tensor | None = None,
    t_dst: Tensor | None = None,
) -> Block:
    """The block of these CSR tensors for the nodes' functions (no halo leaves; its
    ``src_ids`` are never read: an empty tensor), with the transposed CSR where given (else
    built where a kernel needs it)."""
    block = Block(int(indptr.numel()) - 1, int(n_src), 0, indptr, indices, indices.new_empty(0))
    if t_indptr is not None and t_dst is not None:
        aggregate_triton.set_transposed_csr(block, t_indptr, t_dst)
    return block


def _or_empty(grad: Tensor | None, like: Tensor) -> Tensor:
    """``grad``, or for None an empty tensor of ``like``'s device and dtype (a new one each
    time: an operator's outputs may not alias each other)."""
    return like.new_empty(NO_GRAD_SHAPE) if grad is None else grad


def _grads_or_none(needs: Sequence[bool], grads: Sequence[Tensor], n_other: int) -> tuple:
    """An autograd formula's result: the needed ``grads``, None for the others and for the
    ``n_other`` inputs that take no gradient."""
    return (*(g if n else None for n, g in zip(needs, grads, strict=True)), *[None] * n_other)


# -- the transposed CSR -----------------------------------------------------------------------


@custom_op(f"{NAMESPACE}::transposed_csr", mutates_args=())
def _transposed_csr(indptr: Tensor, indices: Tensor, n_src: int) -> tuple[Tensor, Tensor]:
    t_indptr, t_dst = aggregate_triton.transposed_csr(_block(indptr, indices, n_src))
    return t_indptr, t_dst


@register_fake(f"{NAMESPACE}::transposed_csr")
def _(indptr: Tensor, indices: Tensor, n_src: int) -> tuple[Tensor, Tensor]:
    return indptr.new_empty(n_src + 1), indices.new_empty(indices.shape[0])


def transposed_csr(block: Block) -> tuple[Tensor, Tensor]:
    """The block's transposed CSR (:func:`~distmb.nn.kernels.triton_aggregate.transposed_csr`:
    ``t_indptr`` int64[n_src + 1], ``t_dst`` int64[E]) as a traceable operator (built on
    every call: a compiled graph keeps it from the forward to the backward)."""
    return torch.ops.distmb.transposed_csr(block.indptr, block.indices, block.n_src)


# -- SAGEConv's and GCNConv's node ------------------------------------------------------------


@custom_op(f"{NAMESPACE}::linear_aggregate", mutates_args=())
def _linear_aggregate(
    x_src: Tensor,
    w_neigh: Tensor,
    w_self: Tensor | None,
    bias: Tensor,
    indptr: Tensor,
    indices: Tensor,
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
    kind: str,
) -> tuple[Tensor, Tensor]:
    # (out, h): h the aggregation the backward keeps (aggregate first), else empty.
    block = _block(indptr, indices, x_src.shape[0], t_indptr, t_dst)
    out, h = triton_layer.linear_aggregate_forward(x_src, w_neigh, w_self, bias, block, kind)
    return out, _or_empty(h, x_src)


@register_fake(f"{NAMESPACE}::linear_aggregate")
def _(
    x_src: Tensor,
    w_neigh: Tensor,
    w_self: Tensor | None,
    bias: Tensor,
    indptr: Tensor,
    indices: Tensor,
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
    kind: str,
) -> tuple[Tensor, Tensor]:
    n_dst = indptr.shape[0] - 1
    out = x_src.new_empty((n_dst, w_neigh.shape[0]))
    if triton_layer.projects_first(w_neigh):
        return out, x_src.new_empty(NO_GRAD_SHAPE)
    return out, x_src.new_empty((n_dst, x_src.shape[1]))


@custom_op(f"{NAMESPACE}::linear_aggregate_backward", mutates_args=())
def _linear_aggregate_backward(
    grad_out: Tensor,
    x: Tensor,
    wn: Tensor,
    ws: Tensor | None,
    h: Tensor,
    indptr: Tensor,
    indices: Tensor,
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
    kind: str,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # ``needs``: (x, w_neigh, w_self, bias); an empty tensor for each gradient not computed.
    block = _block(indptr, indices, x.shape[0], t_indptr, t_dst)
    grads = triton_layer.linear_aggregate_backward(grad_out, x, wn, ws, h, block, kind, needs)
    return tuple(_or_empty(g, grad_out) for g in grads)  # type: ignore[return-value]


@register_fake(f"{NAMESPACE}::linear_aggregate_backward")
def _(
    grad_out: Tensor,
    x: Tensor,
    wn: Tensor,
    ws: Tensor | None,
    h: Tensor,
    indptr: Tensor,
    indices: Tensor,
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
    kind: str,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    shapes = (x.shape, wn.shape, wn.shape, (wn.shape[0],))
    return tuple(  # type: ignore[return-value]
        grad_out.new_empty(shape if need else NO_GRAD_SHAPE)
        for shape, need in zip(shapes, needs, strict=True)
    )


def _linear_aggregate_setup(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:  # noqa: ANN001
    x_src, w_neigh, w_self, _, indptr, indices, t_indptr, t_dst, kind = inputs
    ctx.save_for_backward(x_src, w_neigh, w_self, output[1], indptr, indices, t_indptr, t_dst)
    ctx.kind = kind


def _linear_aggregate_grad(ctx, grad_out: Tensor, _grad_h: Tensor | None) -> tuple:  # noqa: ANN001
    needs = [bool(n) for n in ctx.needs_input_grad[:4]]
    grads = torch.ops.distmb.linear_aggregate_backward(
        grad_out, *ctx.saved_tensors, ctx.kind, needs
    )
    return _grads_or_none(needs, grads, 5)


register_autograd(
    f"{NAMESPACE}::linear_aggregate", _linear_aggregate_grad, setup_context=_linear_aggregate_setup
)


def linear_aggregate(
    x_src: Tensor,
    w_neigh: Tensor,
    w_self: Tensor | None,
    bias: Tensor,
    block: Block,
    kind: str,
) -> Tensor:
    """SAGEConv's and GCNConv's node (:class:`~distmb.nn.kernels.triton_layer.LinearAggregate`,
    the arguments of its ``apply``): float[n_dst, out]. While compiling, its operators, the
    transposed CSR built first where the forward (the ``"symmetric"`` kinds) or a backward
    aggregation (``x_src``'s gradient; ``w_neigh``'s when projecting first) needs it."""
    if not torch.compiler.is_compiling():
        return triton_layer.LinearAggregate.apply(x_src, w_neigh, w_self, bias, block, kind)
    backward_aggregates = torch.is_grad_enabled() and (
        x_src.requires_grad or (triton_layer.projects_first(w_neigh) and w_neigh.requires_grad)
    )
    t_indptr = t_dst = None
    if aggregate_triton.KINDS[kind][1] != "sum" or backward_aggregates:
        t_indptr, t_dst = transposed_csr(block)
    out, _ = torch.ops.distmb.linear_aggregate(
        x_src, w_neigh, w_self, bias, block.indptr, block.indices, t_indptr, t_dst, kind
    )
    return out


# -- GINConv's node ---------------------------------------------------------------------------


@custom_op(f"{NAMESPACE}::gin_aggregate", mutates_args=())
def _gin_aggregate(
    x_src: Tensor,
    eps: Tensor,
    indptr: Tensor,
    indices: Tensor,
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
) -> Tensor:
    # The transposed CSR: for the backward only.
    return triton_layer.gin_aggregate_forward(x_src, eps, _block(indptr, indices, x_src.shape[0]))


@register_fake(f"{NAMESPACE}::gin_aggregate")
def _(
    x_src: Tensor,
    eps: Tensor,
    indptr: Tensor,
    indices: Tensor,
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
) -> Tensor:
    return x_src.new_empty((indptr.shape[0] - 1, x_src.shape[1]))


@custom_op(f"{NAMESPACE}::gin_aggregate_backward", mutates_args=())
def _gin_aggregate_backward(
    grad_out: Tensor,
    x: Tensor,
    eps: Tensor,
    indptr: Tensor,
    indices: Tensor,
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
    needs: list[bool],
) -> tuple[Tensor, Tensor]:
    # ``needs``: (x, eps); an empty tensor for each gradient not computed.
    block = _block(indptr, indices, x.shape[0], t_indptr, t_dst)
    grads = triton_layer.gin_aggregate_backward(grad_out, x, eps, block, needs)
    return tuple(_or_empty(g, grad_out) for g in grads)  # type: ignore[return-value]


@register_fake(f"{NAMESPACE}::gin_aggregate_backward")
def _(
    grad_out: Tensor,
    x: Tensor,
    eps: Tensor,
    indptr: Tensor,
    indices: Tensor,
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
    needs: list[bool],
) -> tuple[Tensor, Tensor]:
    need_x, need_eps = needs
    return (
        grad_out.new_empty(x.shape if need_x else NO_GRAD_SHAPE),
        grad_out.new_empty((1,) if need_eps else NO_GRAD_SHAPE),
    )


def _gin_setup(ctx, inputs: tuple, output: Tensor) -> None:  # noqa: ANN001
    ctx.save_for_backward(*inputs)


def _gin_grad(ctx, grad_out: Tensor) -> tuple:  # noqa: ANN001
    needs = [bool(n) for n in ctx.needs_input_grad[:2]]
    grads = torch.ops.distmb.gin_aggregate_backward(grad_out, *ctx.saved_tensors, needs)
    return _grads_or_none(needs, grads, 4)


register_autograd(f"{NAMESPACE}::gin_aggregate", _gin_grad, setup_context=_gin_setup)


def gin_aggregate(x_src: Tensor, eps: Tensor, block: Block) -> Tensor:
    """GIN's ``(1 + eps) x_src[:n_dst] + sum_{u -> v} x_u``
    (:class:`~distmb.nn.kernels.triton_layer.GINAggregate`): x_src [n_src, F], eps [1] ->
    [n_dst, F]. While compiling, its operators, the transposed CSR built first when
    ``x_src`` needs a gradient."""
    if not torch.compiler.is_compiling():
        return triton_layer.GINAggregate.apply(x_src, eps, block)
    t_indptr = t_dst = None
    if x_src.requires_grad and torch.is_grad_enabled():
        t_indptr, t_dst = transposed_csr(block)
    return torch.ops.distmb.gin_aggregate(x_src, eps, block.indptr, block.indices, t_indptr, t_dst)


# -- GATConv's node ---------------------------------------------------------------------------


@custom_op(f"{NAMESPACE}::gat_attention", mutates_args=())
def _gat_attention(
    z: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    indptr: Tensor,
    indices: Tensor,
    negative_slope: float,
    self_loops: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    # out, then what the backward keeps: el, er, row_max, row_sum.
    block = _block(indptr, indices, z.shape[0])
    return triton_gat_layer.attention_forward(block, z, attn_l, attn_r, negative_slope, self_loops)


@register_fake(f"{NAMESPACE}::gat_attention")
def _(
    z: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    indptr: Tensor,
    indices: Tensor,
    negative_slope: float,
    self_loops: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    n_src, heads, dim = z.shape
    n_dst = indptr.shape[0] - 1
    stats = (n_dst, heads)
    return (
        z.new_empty((n_dst, heads, dim)),
        z.new_empty((n_src, heads), dtype=STATS_DTYPE),
        *(z.new_empty(stats, dtype=STATS_DTYPE) for _ in range(3)),
    )


@custom_op(f"{NAMESPACE}::gat_attention_backward", mutates_args=())
def _gat_attention_backward(
    grad_out: Tensor,
    z: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    el: Tensor,
    er: Tensor,
    row_max: Tensor,
    row_sum: Tensor,
    indptr: Tensor,
    indices: Tensor,
    negative_slope: float,
    self_loops: bool,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor]:
    # ``needs``: (z, attn_l, attn_r); the transposed CSR built here, as the eager node builds
    # it on its first backward; an empty tensor for each gradient not computed.
    block = _block(indptr, indices, z.shape[0])
    grads = triton_gat_layer.attention_backward(
        grad_out, z, attn_l, attn_r, (el, er, row_max, row_sum), block, negative_slope,
        self_loops, needs,
    )  # fmt: skip
    return tuple(_or_empty(g, grad_out) for g in grads)  # type: ignore[return-value]


@register_fake(f"{NAMESPACE}::gat_attention_backward")
def _(
    grad_out: Tensor,
    z: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    el: Tensor,
    er: Tensor,
    row_max: Tensor,
    row_sum: Tensor,
    indptr: Tensor,
    indices: Tensor,
    negative_slope: float,
    self_loops: bool,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor]:
    shapes = (z.shape, attn_l.shape, attn_r.shape)
    dtypes = (z.dtype, attn_l.dtype, attn_r.dtype)
    return tuple(  # type: ignore[return-value]
        grad_out.new_empty(shape if need else NO_GRAD_SHAPE, dtype=dtype)
        for shape, dtype, need in zip(shapes, dtypes, needs, strict=True)
    )


def _gat_setup(ctx, inputs: tuple, output: tuple) -> None:  # noqa: ANN001
    z, attn_l, attn_r, indptr, indices, negative_slope, self_loops = inputs
    _, el, er, row_max, row_sum = output
    ctx.save_for_backward(z, attn_l, attn_r, el, er, row_max, row_sum, indptr, indices)
    ctx.negative_slope, ctx.self_loops = negative_slope, self_loops


def _gat_grad(ctx, grad_out: Tensor, *_stats: Tensor | None) -> tuple:  # noqa: ANN001
    needs = [bool(n) for n in ctx.needs_input_grad[:3]]
    grads = torch.ops.distmb.gat_attention_backward(
        grad_out, *ctx.saved_tensors, ctx.negative_slope, ctx.self_loops, needs
    )
    return _grads_or_none(needs, grads, 4)


register_autograd(f"{NAMESPACE}::gat_attention", _gat_grad, setup_context=_gat_setup)


def attention_layer(
    block: Block,
    z: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    negative_slope: float,
    self_loops: bool = False,
) -> Tensor:
    """GATConv's scores and attention
    (:func:`~distmb.nn.kernels.triton_gat_layer.attention_layer`, its arguments):
    float[n_dst, H, D] in ``z``'s dtype. While compiling, its operators."""
    if not torch.compiler.is_compiling():
        return triton_gat_layer.attention_layer(
            block, z, attn_l, attn_r, negative_slope, self_loops
        )
    out, *_ = torch.ops.distmb.gat_attention(
        z, attn_l, attn_r, block.indptr, block.indices, float(negative_slope), self_loops
    )
    return out
