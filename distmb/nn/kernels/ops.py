"""The Triton path's layer nodes as PyTorch custom operators (namespace ``distmb``), so that
``torch.compile(model, dynamic=True, fullgraph=True)`` (``--compile``) traces a whole model
without a graph break: each is opaque to the compiler (its implementation runs eagerly at
run time, the Triton kernels launched as in the eager path) and has a fake implementation
(output shapes, symbolic in the batch's sizes) and a backward, itself a custom operator.

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

The layers use them only while compiling (:func:`torch.compiler.is_compiling`): the eager
path keeps its autograd functions (the op census counts their launches, and a custom
operator's dispatch costs host time per call). The same kernels run in the same order with
the same arguments either way, so the values and gradients are the eager path's bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import custom_op, register_autograd, register_fake

from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.nn.kernels.triton_gat import STATS_DTYPE, gat_backward, gat_forward
from distmb.nn.kernels.triton_gat_layer import gat_scores
from distmb.pipeline.sample import Block

#: The operators' namespace (``torch.ops.distmb``).
NAMESPACE = "distmb"
#: A gradient that is not needed: an operator cannot return None, so it returns this
#: shape's empty tensor, which the autograd formula turns into None.
NO_GRAD_SHAPE = (0,)


def _block(indptr: Tensor, indices: Tensor, n_src: int) -> Block:
    """A block of these CSR tensors for the kernels' Python wrappers (no halo leaves; its
    ``src_ids`` are never read: an empty tensor)."""
    return Block(int(indptr.numel()) - 1, int(n_src), 0, indptr, indices, indices.new_empty(0))


def _none_unless(needed: bool, grad: Tensor) -> Tensor | None:
    return grad if needed else None


def _no_grad(like: Tensor) -> Tensor:
    return like.new_empty(NO_GRAD_SHAPE)


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


# -- the aggregation kernel over tensors ------------------------------------------------------


def _gather(
    indptr: Tensor,
    indices: Tensor,
    t_indptr: Tensor | None,
    x: Tensor,
    kind: str,
    addend: Tensor | None = None,
    self_eps: Tensor | None = None,
) -> Tensor:
    """:func:`~distmb.nn.kernels.triton_aggregate.aggregate_forward` over the CSR tensors
    (``t_indptr`` needed by the ``"symmetric"`` kinds): x [n_src, F] -> [n_dst, F]."""
    row_scale, col_scale, own_row = aggregate_triton.KINDS[kind]
    return aggregate_triton.csr_gather(
        indptr,
        indices,
        x,
        row_scale=row_scale,
        col_scale=col_scale,
        col_indptr=None if col_scale == "sum" else t_indptr,
        n_self=int(indptr.numel()) - 1 if own_row or self_eps is not None else 0,
        addend=addend,
        self_eps=self_eps,
    )


def _gather_backward(
    indptr: Tensor,
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
    grad_out: Tensor,
    kind: str,
    addend: Tensor | None = None,
    self_eps: Tensor | None = None,
) -> Tensor:
    """:func:`~distmb.nn.kernels.triton_aggregate.aggregate_backward` over the CSR tensors:
    grad_out [n_dst, F] -> [n_src, F].

    Raises:
        ValueError: the transposed CSR is missing.
    """
    if t_indptr is None or t_dst is None:
        raise ValueError("the aggregation's input gradient needs the transposed CSR")
    row_scale, col_scale, own_row = aggregate_triton.KINDS[kind]
    return aggregate_triton.csr_gather(
        t_indptr,
        t_dst,
        grad_out,
        row_scale=col_scale,
        col_scale=row_scale,
        col_indptr=None if row_scale == "sum" else indptr,
        n_self=int(indptr.numel()) - 1 if own_row or self_eps is not None else 0,
        addend=addend,
        self_eps=self_eps,
    )


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
    # LinearAggregate.forward's launches, over tensors; h: the aggregation (aggregate first).
    n_dst = int(indptr.numel()) - 1
    if w_neigh.shape[0] < w_neigh.shape[1]:  # project first
        z = torch.mm(x_src, w_neigh.t())
        if w_self is None:
            addend = bias.expand(n_dst, -1)
        else:
            addend = torch.addmm(bias, x_src[:n_dst], w_self.t())
        return _gather(indptr, indices, t_indptr, z, kind, addend), _no_grad(x_src)
    h = _gather(indptr, indices, t_indptr, x_src, kind)
    out = torch.addmm(bias, h, w_neigh.t())
    if w_self is not None:
        out.addmm_(x_src[:n_dst], w_self.t())
    return out, h


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
    if w_neigh.shape[0] < w_neigh.shape[1]:
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
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
    kind: str,
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # LinearAggregate.backward's launches; ``needs``: (x, w_neigh, w_self, bias).
    need_x, need_wn, need_ws, need_b = needs
    n_dst = int(indptr.numel()) - 1
    x_dst = x[:n_dst]
    # Not needed: an empty tensor each (an operator's outputs may not alias each other).
    grad_x, grad_wn, grad_ws, grad_b = (_no_grad(grad_out) for _ in range(4))
    if need_b:
        grad_b = grad_out.sum(0)
    if ws is not None and need_ws:
        grad_ws = grad_out.t().mm(x_dst)
    if wn.shape[0] < wn.shape[1]:  # project first
        if need_x or need_wn:
            grad_z = _gather_backward(indptr, t_indptr, t_dst, grad_out, kind)
            if need_wn:
                grad_wn = grad_z.t().mm(x)
            if need_x:
                grad_x = grad_z.mm(wn)
                if ws is not None:
                    grad_x[:n_dst].addmm_(grad_out, ws)
    else:
        if need_wn:
            grad_wn = grad_out.t().mm(h)
        if need_x:
            grad_self = None if ws is None else grad_out.mm(ws)
            grad_x = _gather_backward(indptr, t_indptr, t_dst, grad_out.mm(wn), kind, grad_self)
    return grad_x, grad_wn, grad_ws, grad_b


@register_fake(f"{NAMESPACE}::linear_aggregate_backward")
def _(
    grad_out: Tensor,
    x: Tensor,
    wn: Tensor,
    ws: Tensor | None,
    h: Tensor,
    indptr: Tensor,
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
    x_src, w_neigh, w_self, _, indptr, _, t_indptr, t_dst, kind = inputs
    ctx.save_for_backward(x_src, w_neigh, w_self, output[1], indptr, t_indptr, t_dst)
    ctx.kind = kind


def _linear_aggregate_grad(ctx, grad_out: Tensor, _grad_h: Tensor | None) -> tuple:  # noqa: ANN001
    x, wn, ws, h, indptr, t_indptr, t_dst = ctx.saved_tensors
    needs = [bool(n) for n in ctx.needs_input_grad[:4]]
    grads = torch.ops.distmb.linear_aggregate_backward(
        grad_out, x, wn, ws, h, indptr, t_indptr, t_dst, ctx.kind, needs
    )
    return (*(_none_unless(n, g) for n, g in zip(needs, grads, strict=True)), *[None] * 5)


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
    """:class:`~distmb.nn.kernels.triton_layer.LinearAggregate` as traceable operators: the
    same arguments, values and gradients; the transposed CSR built first where the forward
    (the ``"symmetric"`` kinds) or ``x_src``'s gradient needs it."""
    t_indptr = t_dst = None
    if aggregate_triton.KINDS[kind][1] != "sum" or (
        x_src.requires_grad and torch.is_grad_enabled()
    ):
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
    # _TritonGINAggregate.forward's launch (the transposed CSR: for the backward only).
    return _gather(indptr, indices, None, x_src, "sum", self_eps=eps)


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
    t_indptr: Tensor | None,
    t_dst: Tensor | None,
    needs: list[bool],
) -> tuple[Tensor, Tensor]:
    # _TritonGINAggregate.backward's launches; ``needs``: (x, eps).
    need_x, need_eps = needs
    grad_x, grad_eps = _no_grad(grad_out), _no_grad(grad_out)
    if need_x:
        grad_x = _gather_backward(indptr, t_indptr, t_dst, grad_out, "sum", self_eps=eps)
    if need_eps:
        x_dst = x[: int(indptr.numel()) - 1]
        grad_eps = torch.dot(grad_out.reshape(-1), x_dst.reshape(-1)).reshape(1)
    return grad_x, grad_eps


@register_fake(f"{NAMESPACE}::gin_aggregate_backward")
def _(
    grad_out: Tensor,
    x: Tensor,
    eps: Tensor,
    indptr: Tensor,
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
    x_src, eps, indptr, _, t_indptr, t_dst = inputs
    ctx.save_for_backward(x_src, eps, indptr, t_indptr, t_dst)


def _gin_grad(ctx, grad_out: Tensor) -> tuple:  # noqa: ANN001
    x, eps, indptr, t_indptr, t_dst = ctx.saved_tensors
    needs = [bool(n) for n in ctx.needs_input_grad[:2]]
    grads = torch.ops.distmb.gin_aggregate_backward(
        grad_out, x, eps, indptr, t_indptr, t_dst, needs
    )
    return (*(_none_unless(n, g) for n, g in zip(needs, grads, strict=True)), *[None] * 4)


register_autograd(f"{NAMESPACE}::gin_aggregate", _gin_grad, setup_context=_gin_setup)


def gin_aggregate(x_src: Tensor, eps: Tensor, block: Block) -> Tensor:
    """GIN's ``(1 + eps) x_src[:n_dst] + sum_{u -> v} x_u``
    (:class:`~distmb.nn.gin._TritonGINAggregate`) as traceable operators: x_src [n_src, F],
    eps [1] -> [n_dst, F]; the transposed CSR built first when ``x_src`` needs a gradient."""
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
    # _TritonAttentionLayer.forward's launches; also returns what its backward keeps.
    z, attn_l, attn_r = z.contiguous(), attn_l.contiguous(), attn_r.contiguous()
    block = _block(indptr, indices, z.shape[0])
    el, er = gat_scores(z, attn_l, attn_r, block.n_dst)
    out, row_max, row_sum = gat_forward(block, el, er, z, negative_slope, self_loops)
    return out, el, er, row_max, row_sum


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
    # _TritonAttentionLayer.backward's launches (the transposed CSR built here, as the eager
    # node builds it on its first backward); ``needs``: (z, attn_l, attn_r).
    z, attn_l, attn_r = z.contiguous(), attn_l.contiguous(), attn_r.contiguous()
    block = _block(indptr, indices, z.shape[0])
    grad_el, grad_er, grad_z = gat_backward(
        block, el, er, z, negative_slope, row_max, row_sum, grad_out.contiguous(),
        need_scores=True, self_loops=self_loops, fold=(attn_l, attn_r),
    )  # fmt: skip
    need_z, need_l, need_r = needs
    grad_l, grad_r = _no_grad(grad_out), _no_grad(grad_out)
    if need_l:
        grad_l = (grad_el.unsqueeze(-1) * z).sum(0).to(attn_l.dtype)
    if need_r:
        grad_r = (grad_er.unsqueeze(-1) * z[: block.n_dst]).sum(0).to(attn_r.dtype)
    return grad_z if need_z else _no_grad(grad_out), grad_l, grad_r


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
    return (*(_none_unless(n, g) for n, g in zip(needs, grads, strict=True)), *[None] * 4)


register_autograd(f"{NAMESPACE}::gat_attention", _gat_grad, setup_context=_gat_setup)


def attention_layer(
    block: Block,
    z: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    negative_slope: float,
    self_loops: bool = False,
) -> Tensor:
    """:func:`~distmb.nn.kernels.triton_gat_layer.attention_layer` as traceable operators:
    the same arguments, values and gradients (float[n_dst, H, D] in ``z``'s dtype)."""
    out, *_ = torch.ops.distmb.gat_attention(
        z, attn_l, attn_r, block.indptr, block.indices, float(negative_slope), self_loops
    )
    return out
