"""Fused C++ AGG kernels (``csrc/kernels/aggregate.cpp``; GAT's in ``aggregate_gat.cpp``) as
autograd functions.

These are the ``"fused"`` implementations behind :mod:`distmb.nn.aggregate`, which checks
arguments and dispatches here (see :func:`distmb.nn.kernels.dispatch.get_kernels`). Every function
takes a :class:`~distmb.pipeline.sample.Block` (``indptr`` int64[n_dst + 1], ``indices`` int64[E])
and **float32** CPU tensors; non-contiguous inputs are made contiguous first. The kernels are
float32 only: :mod:`distmb.nn.aggregate` keeps float64 (gradcheck) and other dtypes on the
PyTorch path. Each backward is computed once (``once_differentiable``: no double backward).

Backward passes that produce per-source gradients gather over the block's transposed CSR
(sources -> edges), built by a parallel counting sort on first use and cached on the block
object (:func:`block_transpose`), so a block shared by several operations of a step (GAT's
attention softmax and weighted aggregation) is transposed once. The results do not depend on
the OpenMP thread count (``distmb._C.set_num_threads``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from distmb import _C
from distmb.pipeline.rows import IndexedRows
from distmb.pipeline.sample import Block

#: The only dtype the fused kernels compute in.
DTYPE = torch.float32
#: Attribute of a :class:`Block` instance caching its :class:`BlockTranspose`.
_TRANSPOSE_ATTR = "_fused_transpose"


def supports(*tensors: Tensor) -> bool:
    """Whether the fused kernels can take these tensors (float32 on the CPU)."""
    return all(t.dtype == DTYPE and t.device.type == "cpu" for t in tensors)


@dataclass(frozen=True)
class BlockTranspose:
    """Transposed CSR of a block (sources -> edges).

    Attributes:
        indptr: int64[n_src + 1].
        edges: int64[E], the edge ids of every source, ascending within a source.
        dst: int64[E], the destination of ``edges[k]``.
        key: what the transpose was built from (identity and version of the block's
            ``indptr`` / ``indices`` tensors, ``n_src``); a mismatch means it is stale.
    """

    indptr: Tensor
    edges: Tensor
    dst: Tensor
    key: tuple[int, int, int, int, int]


def _np(t: Tensor) -> np.ndarray:
    """A contiguous CPU tensor's numpy view (no copy when it already is contiguous)."""
    return t.detach().contiguous().numpy()


def _csr(block: Block) -> tuple[np.ndarray, np.ndarray]:
    return _np(block.indptr), _np(block.indices)


def block_transpose(block: Block) -> BlockTranspose:
    """The block's transposed CSR, built on first use and cached on the block object.

    The cache is rebuilt when ``block.indptr`` / ``block.indices`` were replaced or modified
    in place, or ``n_src`` changed.

    Raises:
        IndexError: a source index outside ``[0, n_src)`` or a decreasing ``indptr``.
    """
    key = block.structure_key()
    cached = getattr(block, _TRANSPOSE_ATTR, None)
    if isinstance(cached, BlockTranspose) and cached.key == key:
        return cached
    indptr, indices = _csr(block)
    t_indptr, t_edges, t_dst = _C.block_transpose(indptr, indices, block.n_src)
    result = BlockTranspose(
        torch.from_numpy(t_indptr), torch.from_numpy(t_edges), torch.from_numpy(t_dst), key
    )
    setattr(block, _TRANSPOSE_ATTR, result)
    return result


def _optional_out(needed: bool, *shape: int) -> Tensor | None:
    return torch.empty(shape, dtype=DTYPE) if needed else None


def _numpy_or_none(t: Tensor | None) -> np.ndarray | None:
    return None if t is None else t.numpy()


# --------------------------------------------------------------------------- mean / sum / gcn


def aggregate_forward(block: Block, x: Tensor | IndexedRows, kind: str) -> Tensor:
    """``aggregate`` of x float32[n_src, F] (contiguous) -> float32[n_dst, F], no autograd.

    ``x`` may be rows read in place (:class:`~distmb.pipeline.rows.IndexedRows`, ``kind`` not
    ``"gcn"``): the edges then name the table's rows directly (``ids[indices]``, int64[edges]),
    and no gathered copy of the sources is made; a table stored in two bytes a value is
    summed in float32, each value widened exactly as it is read."""
    out = torch.empty(block.n_dst, x.shape[1], dtype=DTYPE)
    if isinstance(x, IndexedRows):
        if kind == "gcn":  # its self term reads x[v] by destination position
            raise ValueError("aggregate_forward: the gcn aggregator needs gathered rows")
        if x.shape[0] != block.n_src:
            raise ValueError(f"x has {x.shape[0]} rows but the block has n_src={block.n_src}")
        table_rows = torch.index_select(x.ids, 0, block.indices)
        table, stored = x.table_bits()  # a two-byte table is widened as it is read
        _C.aggregate_forward(
            _np(block.indptr), table_rows.numpy(), x.table.shape[0], table,
            x.shape[1], kind, out.numpy(), stored,
        )  # fmt: skip
        return out
    indptr, indices = _csr(block)
    _C.aggregate_forward(indptr, indices, block.n_src, _np(x), x.shape[1], kind, out.numpy())
    return out


def aggregate_backward(
    block: Block, kind: str, grad_out: Tensor, addend: Tensor | None = None
) -> Tensor:
    """float32[n_src, F]: the gradient of :func:`aggregate_forward` for grad_out
    float32[n_dst, F], plus ``addend`` float32[n_addend <= n_src, F] on the first rows.

    The addend is the gradient of another use of the first source rows (a layer's self
    term): summing it here saves a zero-filled full-size tensor and a full-size addition.
    """
    t = block_transpose(block)
    dim = grad_out.shape[1]
    grad_x = torch.empty(block.n_src, dim, dtype=DTYPE)
    _C.aggregate_backward(
        _np(block.indptr),
        t.indptr.numpy(),
        t.dst.numpy(),
        _np(grad_out),
        dim,
        kind,
        grad_x.numpy(),
        None if addend is None else _np(addend),
    )
    return grad_x


class _Aggregate(torch.autograd.Function):
    """``aggregate`` over x float32[n_src, F] (contiguous) -> float32[n_dst, F]."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, block: Block, kind: str) -> Tensor:
        ctx.block, ctx.kind = block, kind
        return aggregate_forward(block, x, kind)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor | None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return aggregate_backward(ctx.block, ctx.kind, grad_out), None, None


def aggregate(block: Block, x_src: Tensor, kind: str) -> Tensor:
    """Fused :func:`distmb.nn.aggregate.aggregate` (arguments already checked there).

    Args:
        block: the block.
        x_src: float32[n_src, *F].
        kind: ``"mean"``, ``"sum"`` or ``"gcn"``.

    Returns:
        float32[n_dst, *F].
    """
    feat_shape = x_src.shape[1:]
    x2d = x_src.reshape(block.n_src, int(np.prod(feat_shape, dtype=np.int64)))
    out = _Aggregate.apply(x2d.contiguous(), block, kind)
    return out.reshape(block.n_dst, *feat_shape)


# --------------------------------------------------------------------------- attention


class _EdgeSoftmax(torch.autograd.Function):
    """Edge softmax of scores float32[E, H] (contiguous) -> alpha float32[E, H]."""

    @staticmethod
    def forward(ctx: FunctionCtx, scores: Tensor, block: Block) -> Tensor:
        heads = scores.shape[1]
        alpha = torch.empty_like(scores, memory_format=torch.contiguous_format)
        _C.edge_softmax_forward(_np(block.indptr), _np(scores), heads, alpha.numpy())
        ctx.save_for_backward(alpha)
        ctx.block = block
        return alpha

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_alpha: Tensor) -> tuple[Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        (alpha,) = ctx.saved_tensors
        grad_scores = torch.empty_like(alpha)
        _C.edge_softmax_backward(
            _np(ctx.block.indptr),
            alpha.numpy(),
            _np(grad_alpha),
            alpha.shape[1],
            grad_scores.numpy(),
        )
        return grad_scores, None


def edge_softmax(block: Block, scores: Tensor) -> Tensor:
    """Fused :func:`distmb.nn.aggregate.edge_softmax`.

    Args:
        block: the block.
        scores: float32[E, *H] (trailing dimensions are flattened into heads).

    Returns:
        float32[E, *H].
    """
    flat = scores.reshape(block.num_edges, int(np.prod(scores.shape[1:], dtype=np.int64)))
    return _EdgeSoftmax.apply(flat.contiguous(), block).reshape(scores.shape)


class _GatAttention(torch.autograd.Function):
    """alpha float32[E, H] = edge softmax of LeakyReLU(el[src] + er[dst])."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, el: Tensor, er: Tensor, block: Block, negative_slope: float
    ) -> Tensor:
        indptr, indices = _csr(block)
        heads = el.shape[1]
        alpha = torch.empty(block.num_edges, heads, dtype=DTYPE)
        _C.gat_attention_forward(
            indptr, indices, block.n_src, _np(el), _np(er), heads, negative_slope, alpha.numpy()
        )
        ctx.save_for_backward(el, er, alpha)
        ctx.block, ctx.negative_slope = block, negative_slope
        return alpha

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, grad_alpha: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None]:
        el, er, alpha = ctx.saved_tensors
        block: Block = ctx.block
        need_el, need_er = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_el or need_er):
            return None, None, None, None
        heads = el.shape[1]
        t = block_transpose(block)
        grad_el = _optional_out(need_el, block.n_src, heads)
        grad_er = _optional_out(need_er, block.n_dst, heads)
        indptr, indices = _csr(block)
        _C.gat_attention_backward(
            indptr,
            indices,
            t.indptr.numpy(),
            t.edges.numpy(),
            _np(el),
            _np(er),
            alpha.numpy(),
            _np(grad_alpha),
            heads,
            ctx.negative_slope,
            _numpy_or_none(grad_el),
            _numpy_or_none(grad_er),
        )
        return grad_el, grad_er, None, None


def gat_attention(block: Block, el: Tensor, er: Tensor, negative_slope: float) -> Tensor:
    """Fused :func:`distmb.nn.aggregate.attention_softmax`.

    Args:
        block: the block.
        el: float32[n_src, H], per-source logit term.
        er: float32[n_dst, H], per-destination logit term.
        negative_slope: slope of the LeakyReLU.

    Returns:
        float32[E, H].
    """
    return _GatAttention.apply(el.contiguous(), er.contiguous(), block, float(negative_slope))


class _WeightedAggregate(torch.autograd.Function):
    """out float32[n_dst, H, D] = sum_e weights[e, h] * x[src_e, h, :] (contiguous inputs)."""

    @staticmethod
    def forward(ctx: FunctionCtx, weights: Tensor, x: Tensor, block: Block) -> Tensor:
        indptr, indices = _csr(block)
        _, heads, dim = x.shape
        out = torch.empty(block.n_dst, heads, dim, dtype=DTYPE)
        _C.weighted_aggregate_forward(
            indptr, indices, block.n_src, _np(weights), _np(x), heads, dim, out.numpy()
        )
        ctx.save_for_backward(weights, x)
        ctx.block = block
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        weights, x = ctx.saved_tensors
        block: Block = ctx.block
        need_w, need_x = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_w or need_x):
            return None, None, None
        _, heads, dim = x.shape
        t = block_transpose(block)
        grad_w = _optional_out(need_w, block.num_edges, heads)
        grad_x = _optional_out(need_x, block.n_src, heads, dim)
        _C.weighted_aggregate_backward(
            t.indptr.numpy(),
            t.edges.numpy(),
            t.dst.numpy(),
            _np(weights),
            _np(x),
            _np(grad_out),
            block.n_dst,
            heads,
            dim,
            _numpy_or_none(grad_x),
            _numpy_or_none(grad_w),
        )
        return grad_w, grad_x, None


def weighted_aggregate(block: Block, weights: Tensor, x_src: Tensor) -> Tensor:
    """Fused :func:`distmb.nn.aggregate.weighted_aggregate`.

    Args:
        block: the block.
        weights: float32[E, H].
        x_src: float32[n_src, H, D].

    Returns:
        float32[n_dst, H, D].
    """
    return _WeightedAggregate.apply(weights.contiguous(), x_src.contiguous(), block)


def stream_copy(src: Tensor, dst: Tensor) -> None:
    """``dst[:] = src`` for contiguous float32 tensors of equal size, by the OpenMP copy kernel
    (the copy-bandwidth reference of ``benchmarks/kernels.py``)."""
    _C.stream_copy(src.numpy(), dst.numpy())
