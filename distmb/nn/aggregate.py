"""Aggregation over a :class:`~distmb.pipeline.sample.Block` (the AGG of equations 1 and 2).

These are small pure functions with one contract each; they are the seam where fused C++
kernels replace the PyTorch implementations one by one. Every function takes the block's CSR
(``indptr`` int64[n_dst + 1] over destinations, ``indices`` int64[E] source positions) and
dense float tensors, returns a new tensor and supports autograd w.r.t. its float inputs.

- :func:`aggregate`: unweighted neighbour reduction (``"mean"``, ``"sum"``, ``"gcn"``).
- :func:`edge_softmax`: softmax of per-edge scores over each destination's edges.
- :func:`weighted_aggregate`: per-head weighted sum of source rows over each destination's
  edges.
- :func:`attention_softmax`: GAT's ``edge_softmax(LeakyReLU(el[src] + er[dst]))`` in one
  step.
- :func:`attention_aggregate`: :func:`attention_softmax` then :func:`weighted_aggregate`
  (GAT's aggregation without attention dropout).
- :func:`add_self_loops`: the block with one extra ``(v, v)`` edge per destination.

Two implementations sit behind every function, chosen per call by
:func:`distmb.nn.kernels.dispatch.get_kernels`:

``"fused"`` (default): the C++ kernels of ``csrc/kernels/aggregate.cpp`` and
``aggregate_gat.cpp`` through :mod:`distmb.nn.kernels.cpu_aggregate` (OpenMP over
destinations, SIMD over features, the GAT edge weight broadcast over the lanes of its head;
backward passes gather over the block's cached transposed CSR instead of scattering). They
compute in float32 only: inputs of any other dtype (e.g. the float64 of ``gradcheck``) take the
``"torch"`` path.

``"triton"``: :func:`aggregate` on CUDA tensors (float32, bf16, fp16) through the Triton
kernel of :mod:`distmb.nn.kernels.triton_aggregate` (FastGL's Memory-Aware aggregation: a tile of
destination rows keeps its partial sums in registers while it walks the rows' edges; the
backward is the same kernel over the block's transposed CSR), and :func:`attention_aggregate`
through those of :mod:`distmb.nn.kernels.triton_gat` (the softmax and the weighted sum in
registers per tile of rows and head). The other functions, and tensors the kernels cannot
take (float64, CPU without the interpreter), use the ``"torch"`` path.

``"torch"`` (any device, PyTorch ops): :func:`aggregate` multiplies a CSR sparse matrix (values
``1``, ``1/deg`` or ``1/(deg+1)``) with the dense sources, and its backward multiplies the
transposed CSR matrix (built by a stable sort of ``indices``) with the output gradient. On
mini-batch-sized blocks this measured 2-5x faster forward and about 1.5-2x faster forward +
backward than gather + ``index_add_``, ``torch.segment_reduce`` and PyTorch's own sparse
autograd. :func:`weighted_aggregate` gathers with ``index_select`` (whose
backward is ``index_add``; ``x[indices]``'s is a slower accumulating ``index_put``), scales and
``index_add``-s: its weights need gradients, which a per-head CSR product did not give faster.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from distmb.nn.kernels import cpu_aggregate as fused_aggregate
from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.nn.kernels import triton_gat as gat_triton
from distmb.nn.kernels.dispatch import get_kernels
from distmb.pipeline.sample import Block
from distmb.pipeline.sample.blocks import edge_destinations, transposed_indptr

#: Aggregator names accepted by :func:`aggregate`.
AGGREGATORS = ("mean", "sum", "gcn")
#: Autocast dtypes (``--precision``) that :func:`aggregate`'s PyTorch path sums in float32.
LOW_PRECISION = (torch.bfloat16, torch.float16)

with warnings.catch_warnings():
    # PyTorch warns once per process that sparse CSR tensors are "beta"; consume that
    # warning here, where it carries no information, instead of in the first training step.
    warnings.simplefilter("ignore", UserWarning)
    torch.sparse_csr_tensor(
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0),
        (1, 1),
        check_invariants=False,
    )


def edge_dst(block: Block) -> Tensor:
    """int64[E]: destination position of every edge of ``block`` (its CSR expanded)."""
    return block.dst_of_edges()


def in_degrees(block: Block) -> Tensor:
    """int64[n_dst]: number of edges of every destination."""
    return block.indptr[1:] - block.indptr[:-1]


def _csr(indptr: Tensor, indices: Tensor, values: Tensor, shape: tuple[int, int]) -> Tensor:
    return torch.sparse_csr_tensor(indptr, indices, values, shape, check_invariants=False)


class _CSRMatMul(torch.autograd.Function):
    """``A @ x`` for a constant CSR matrix ``A`` [n_dst, n_src] and dense x [n_src, F].

    The backward computes ``A^T @ grad`` with the transposed CSR matrix; there is no gradient
    w.r.t. the values of ``A``.
    """

    @staticmethod
    def forward(ctx, indptr: Tensor, indices: Tensor, values: Tensor, x: Tensor) -> Tensor:
        n_dst, n_src = indptr.numel() - 1, x.shape[0]
        ctx.save_for_backward(indptr, indices, values)
        ctx.n_src = n_src
        # In the dtype of x and values, even under autocast (--precision), which would cast
        # the product to a dtype the CPU's sparse kernel does not have.
        with torch.autocast(x.device.type, enabled=False):
            return _csr(indptr, indices, values, (n_dst, n_src)) @ x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[None, None, None, Tensor | None]:
        if not ctx.needs_input_grad[3]:
            return None, None, None, None
        indptr, indices, values = ctx.saved_tensors
        n_dst, n_src = indptr.numel() - 1, ctx.n_src
        t_indptr, order = transposed_indptr(indices, n_src)
        dst = edge_destinations(indptr, indices.numel())
        a_t = _csr(t_indptr, dst[order], values[order], (n_src, n_dst))
        return None, None, None, a_t @ grad_out.contiguous()


def _use_fused(*tensors: Tensor) -> bool:
    """The fused kernels are selected and can take these tensors (float32, CPU)."""
    return get_kernels() == "fused" and fused_aggregate.supports(*tensors)


def _use_triton(*tensors: Tensor) -> bool:
    """The Triton aggregation is selected and can take these tensors (CUDA; CPU under the
    interpreter)."""
    return get_kernels() == "triton" and aggregate_triton.supports(*tensors)


def check_layer_input(layer: str, x_src: Tensor, in_dim: int) -> None:
    """Refuse a layer input that is not ``float[n_src, in_dim]`` (``layer``: the layer
    class's name, for the message)."""
    if x_src.dim() != 2 or x_src.shape[1] != in_dim:
        raise ValueError(f"{layer} expects x_src [n_src, {in_dim}], got {tuple(x_src.shape)}")


def _check_sources(block: Block, x_src: Tensor, name: str = "x_src") -> None:
    if x_src.shape[0] != block.n_src:
        raise ValueError(
            f"{name} has {x_src.shape[0]} rows but the block has n_src={block.n_src} sources"
        )


def aggregate(block: Block, x_src: Tensor, kind: str) -> Tensor:
    """Reduce the source rows over each destination's edges.

    Args:
        block: the message-flow graph (``n_dst`` destinations, the prefix of the sources).
        x_src: float[n_src, *F] source rows (e.g. [n_src, D] or [n_src, H, D]).
        kind: ``"mean"`` (sum / in-degree, 0 for a destination without edges), ``"sum"`` or
            ``"gcn"`` (DGL SAGEConv's: (sum of neighbours + own row) / (in-degree + 1), the
            own row being ``x_src[v]`` for destination ``v``).

    Returns:
        float[n_dst, *F], the dtype of ``x_src``.

    Raises:
        ValueError: for an unknown ``kind`` or ``x_src`` with other than ``n_src`` rows.
    """
    if kind not in AGGREGATORS:
        raise ValueError(f"unknown aggregator {kind!r}; expected one of {AGGREGATORS}")
    _check_sources(block, x_src)
    if _use_fused(x_src):
        return fused_aggregate.aggregate(block, x_src, kind)
    if _use_triton(x_src):
        return aggregate_triton.aggregate(block, x_src, kind)
    return _torch_aggregate(block, x_src, kind)


def _torch_aggregate(block: Block, x_src: Tensor, kind: str) -> Tensor:
    """The ``"torch"`` implementation of :func:`aggregate` (arguments checked)."""
    feat_shape = x_src.shape[1:]
    x2d = x_src.reshape(block.n_src, -1)
    if x2d.dtype in LOW_PRECISION:
        # bf16/fp16 (--precision): the sparse product has no CPU kernel for them; sum in
        # float32 on every device, as the Triton kernel does, and return the input's dtype.
        x2d = x2d.float()
    deg = in_degrees(block)
    if kind == "sum":
        values = torch.ones(block.num_edges, dtype=x2d.dtype, device=x2d.device)
    else:
        denom = deg.clamp(min=1) if kind == "mean" else deg + 1
        values = torch.repeat_interleave(
            1.0 / denom.to(x2d.dtype), deg, output_size=block.num_edges
        )
    out = _CSRMatMul.apply(block.indptr, block.indices, values, x2d)
    if kind == "gcn":
        out = out + x2d[: block.n_dst] / (deg + 1).to(x2d.dtype).unsqueeze(1)
    return out.to(x_src.dtype).reshape(block.n_dst, *feat_shape)


def edge_softmax(block: Block, scores: Tensor) -> Tensor:
    """Softmax of edge scores over the edges of each destination.

    Numerically stable: the per-destination maximum (a constant for the gradient) is
    subtracted before ``exp``.

    Args:
        block: the message-flow graph.
        scores: float[E, H] (any trailing shape [E, *] works), one score per edge and head.

    Returns:
        float[E, H]: for each destination and head, non-negative weights summing to 1 over its
        edges (destinations without edges have no entries).
    """
    if scores.shape[0] != block.num_edges:
        raise ValueError(
            f"scores has {scores.shape[0]} rows but the block has {block.num_edges} edges"
        )
    if _use_fused(scores):
        return fused_aggregate.edge_softmax(block, scores)
    return _torch_edge_softmax(block, scores)


def _torch_edge_softmax(block: Block, scores: Tensor) -> Tensor:
    """The ``"torch"`` implementation of :func:`edge_softmax` (arguments checked)."""
    with torch.no_grad():
        seg_max = torch.segment_reduce(
            scores.detach(), "max", offsets=block.indptr, axis=0, unsafe=True
        )
    dst = edge_dst(block)
    exp = torch.exp(scores - seg_max[dst])
    denom = torch.zeros(
        (block.n_dst, *scores.shape[1:]), dtype=scores.dtype, device=scores.device
    ).index_add(0, dst, exp)
    return exp / denom[dst]


def weighted_aggregate(block: Block, weights: Tensor, x_src: Tensor) -> Tensor:
    """Per-head weighted sum over each destination's edges: ``out[v, h] = sum_e w[e, h] x[u_e, h]``.

    Args:
        block: the message-flow graph.
        weights: float[E, H], one weight per edge and head (e.g. :func:`edge_softmax`).
        x_src: float[n_src, H, D] source rows per head.

    Returns:
        float[n_dst, H, D]; 0 for a destination without edges.
    """
    _check_sources(block, x_src)
    if x_src.dim() != 3 or tuple(weights.shape) != (block.num_edges, x_src.shape[1]):
        raise ValueError(
            f"expected weights [E, H] and x_src [n_src, H, D]; got {tuple(weights.shape)} "
            f"and {tuple(x_src.shape)}"
        )
    if _use_fused(weights, x_src):
        return fused_aggregate.weighted_aggregate(block, weights, x_src)
    return _torch_weighted_aggregate(block, weights, x_src)


def _torch_weighted_aggregate(block: Block, weights: Tensor, x_src: Tensor) -> Tensor:
    """The ``"torch"`` implementation of :func:`weighted_aggregate` (arguments checked)."""
    messages = x_src.index_select(0, block.indices) * weights.unsqueeze(-1)
    out = torch.zeros((block.n_dst, *x_src.shape[1:]), dtype=x_src.dtype, device=x_src.device)
    return out.index_add(0, edge_dst(block), messages)


def attention_softmax(block: Block, el: Tensor, er: Tensor, negative_slope: float) -> Tensor:
    """GAT attention coefficients: ``edge_softmax(LeakyReLU(el[u] + er[v]))`` over the edges
    ``(u -> v)``, i.e. ``alpha_uv`` of equation 2.

    The ``"fused"`` path computes the logits, the softmax and their backward in one kernel
    each, without materialising the logits or gathering ``el`` / ``er`` per edge in PyTorch.

    Args:
        block: the message-flow graph.
        el: float[n_src, H], the source term ``<a_l, z_u>`` of every source.
        er: float[n_dst, H], the destination term ``<a_r, z_v>`` of every destination.
        negative_slope: slope of the LeakyReLU.

    Returns:
        float[E, H], non-negative, summing to 1 over each destination's edges per head.

    Raises:
        ValueError: ``el`` / ``er`` not of shapes [n_src, H] / [n_dst, H].
    """
    _check_scores(block, el, er)
    if _use_fused(el, er):
        return fused_aggregate.gat_attention(block, el, er, negative_slope)
    scores = F.leaky_relu(
        el.index_select(0, block.indices) + er.index_select(0, edge_dst(block)),
        negative_slope=negative_slope,
    )
    return _torch_edge_softmax(block, scores)


def _check_scores(block: Block, el: Tensor, er: Tensor) -> None:
    _check_sources(block, el, "el")
    if el.dim() != 2 or tuple(er.shape) != (block.n_dst, el.shape[1]):
        raise ValueError(
            f"expected el [n_src, H] and er [n_dst={block.n_dst}, H]; got {tuple(el.shape)} "
            f"and {tuple(er.shape)}"
        )


def attention_aggregate(
    block: Block,
    el: Tensor,
    er: Tensor,
    z: Tensor,
    negative_slope: float,
    self_loops: bool = False,
) -> Tensor:
    """GAT's aggregation: ``weighted_aggregate(block, attention_softmax(block, el, er,
    negative_slope), z)``, i.e. ``out[v, h] = sum_u alpha_uv[h] z[u, h]`` of equation 2, over
    ``add_self_loops(block)`` with ``self_loops``.

    With ``"triton"`` kernels (and tensors they take) one Triton kernel computes the softmax
    and the weighted sum without materialising the attention coefficients, and adds the self
    loops without building the looped block (:mod:`distmb.nn.kernels.triton_gat`);
    otherwise the block is built and the two functions are called.

    Args:
        block: the message-flow graph.
        el: float[n_src, H], the source term ``<a_l, z_u>`` of every source.
        er: float[n_dst, H], the destination term ``<a_r, z_v>`` of every destination.
        z: float[n_src, H, D], the source rows per head.
        negative_slope: slope of the LeakyReLU on the logits.
        self_loops: every destination also attends to itself (:func:`add_self_loops`).

    Returns:
        float[n_dst, H, D]; 0 for a destination without edges.

    Raises:
        ValueError: ``el`` / ``er`` / ``z`` not of shapes [n_src, H] / [n_dst, H] /
            [n_src, H, D].
    """
    _check_scores(block, el, er)
    if z.dim() != 3 or tuple(z.shape[:2]) != tuple(el.shape):
        raise ValueError(f"expected z [n_src, H={el.shape[1]}, D]; got {tuple(z.shape)}")
    if _use_triton(el, er, z):
        return gat_triton.attention_aggregate(block, el, er, z, negative_slope, self_loops)
    if self_loops:
        block = add_self_loops(block)
    return weighted_aggregate(block, attention_softmax(block, el, er, negative_slope), z)


def add_self_loops(block: Block) -> Block:
    """The block with one extra edge ``(v, v)`` per destination (last in its edge list).

    Destination ``v`` is source ``v`` (the prefix), so the edge reads the destination's own
    row. Existing self edges are kept (a destination may then have two).

    Returns:
        A new :class:`Block` with ``num_edges + n_dst`` edges; sizes and ``src_ids`` unchanged.
    """
    n_dst = block.n_dst
    deg = in_degrees(block)
    device = block.indptr.device
    indptr = torch.zeros(n_dst + 1, dtype=torch.int64, device=device)
    torch.cumsum(deg + 1, 0, out=indptr[1:])
    indices = torch.empty(block.num_edges + n_dst, dtype=torch.int64, device=device)
    edge_pos = torch.arange(block.num_edges, dtype=torch.int64, device=device)
    indices[edge_pos + edge_dst(block)] = block.indices
    indices[indptr[1:] - 1] = torch.arange(n_dst, dtype=torch.int64, device=device)
    return Block(n_dst, block.n_src, block.n_halo, indptr, indices, block.src_ids)
