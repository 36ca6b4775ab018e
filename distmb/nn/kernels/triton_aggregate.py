"""FastGL's Memory-Aware aggregation as a Triton CSR kernel (``--kernels triton``).

:func:`distmb.nn.aggregate.aggregate` (``"mean"``, ``"sum"``, ``"gcn"``) as one Triton program
per tile of :data:`ROWS` destination rows x :data:`BLOCK_F` features: the tile's partial sums
stay in registers (fp32, whatever the input dtype) while the program walks the rows' edges,
reading every source row once per edge and writing every output element once. FastGL keeps
them in shared memory for the same reason (section 4.2): the naive scatter (gather +
``index_add``) re-reads and re-writes the partial sum from global memory for every edge.

Kernel contract (:func:`csr_gather`), for rows ``r < n_rows`` and features ``f < feat``::

    out[r, f] = row_scale[r] * ( sum_{e in indptr[r]:indptr[r+1]} col_scale[cols[e]] * x[cols[e], f]
                                 + (r < n_self) * col_scale[r] * x[r, f] )

with a missing ``row_scale`` / ``col_scale`` meaning 1 and the second term only when
``self_loop``. The forward of ``mean`` is ``row_scale = 1 / max(deg, 1)``; ``gcn``'s is
``row_scale = 1 / (deg + 1)`` with the own row (``n_self = n_dst``).

**Backward.** ``grad_x = A^T @ grad_out`` is the same kernel over the transposed CSR (rows:
sources, columns: destinations) with the destinations' scale as ``col_scale`` (and, for
``gcn``, the own-row term again). The transposed CSR is built once per block by a stable
sort of ``indices`` (torch ops, on the device) and cached on the block object, like the C++
kernels' (:func:`distmb.nn.kernels.cpu_aggregate.block_transpose`). The alternative, scattering
``grad_out[v] * w`` into ``grad_x`` with atomic adds from the forward's row tiles, was not
taken: the float sums would depend on thread scheduling (runs not reproducible bit for bit,
unlike every other kernel of the project), atomic adds on bf16/fp16 gradients are slow or
unsupported on older GPUs, and the read-modify-write of every partial sum in global memory
is exactly the traffic Memory-Aware removes. The sort costs one pass over the block's edges.

Runs on CUDA tensors; on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``),
which is how CI tests it. Inputs float32, bfloat16 or float16; accumulation in float32.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from distmb.pipeline.sample import Block
from distmb.pipeline.sample.blocks import transposed_indptr
from distmb.pipeline.sample.idmap_triton import triton, usable

if triton is not None:
    import triton.language as tl

#: Destination rows per program (the register tile's first dimension).
ROWS = 4
#: Largest feature tile per program (the register tile's second dimension); a smaller power
#: of two (at least :data:`MIN_BLOCK_F`) is used for narrower features.
MAX_BLOCK_F = 128
#: Smallest feature tile.
MIN_BLOCK_F = 16
#: Warps per program.
NUM_WARPS = 4
#: Dtypes the kernel reads and writes (it accumulates in float32).
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Attribute of a :class:`Block` instance caching its transposed CSR for the backward.
_TRANSPOSE_ATTR = "_triton_transpose"


def supports(*tensors: Tensor) -> bool:
    """Whether the kernel can take these tensors: a supported dtype, on a device Triton runs
    on (CUDA; CPU under the interpreter)."""
    return all(t.dtype in DTYPES and usable(t.device)[0] for t in tensors)


def block_f(feat: int) -> int:
    """Feature tile for ``feat`` features: the next power of two, in
    [:data:`MIN_BLOCK_F`, :data:`MAX_BLOCK_F`]."""
    return min(MAX_BLOCK_F, max(MIN_BLOCK_F, 1 << max(0, (feat - 1).bit_length())))


if triton is not None:

    @triton.jit(do_not_specialize=["n_rows", "n_self", "feat"])
    def _csr_gather_kernel(
        indptr_ptr,
        cols_ptr,
        x_ptr,
        out_ptr,
        row_scale_ptr,
        col_scale_ptr,
        n_rows,
        n_self,
        feat,
        stride_x,
        stride_out,
        ROWS: tl.constexpr,
        BLOCK_F: tl.constexpr,
        HAS_ROW_SCALE: tl.constexpr,
        HAS_COL_SCALE: tl.constexpr,
        SELF_LOOP: tl.constexpr,
    ):
        """One [ROWS, BLOCK_F] tile of ``out`` (contract in the module docstring)."""
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        rmask = rows < n_rows
        f = tl.program_id(1).to(tl.int64) * BLOCK_F + tl.arange(0, BLOCK_F)
        fmask = f < feat
        start = tl.load(indptr_ptr + rows, mask=rmask, other=0)
        deg = tl.load(indptr_ptr + rows + 1, mask=rmask, other=0) - start
        acc = tl.zeros((ROWS, BLOCK_F), dtype=tl.float32)
        max_deg = tl.max(deg, axis=0)
        for k in range(0, max_deg):
            emask = rmask & (k < deg)
            col = tl.load(cols_ptr + start + k, mask=emask, other=0)
            v = tl.load(
                x_ptr + col[:, None] * stride_x + f[None, :],
                mask=emask[:, None] & fmask[None, :],
                other=0.0,
            ).to(tl.float32)
            if HAS_COL_SCALE:
                w = tl.load(col_scale_ptr + col, mask=emask, other=0.0)
                v = v * w[:, None]
            acc += v
        if SELF_LOOP:
            smask = rmask & (rows < n_self)
            v = tl.load(
                x_ptr + rows[:, None] * stride_x + f[None, :],
                mask=smask[:, None] & fmask[None, :],
                other=0.0,
            ).to(tl.float32)
            if HAS_COL_SCALE:
                w = tl.load(col_scale_ptr + rows, mask=smask, other=0.0)
                v = v * w[:, None]
            acc += v
        if HAS_ROW_SCALE:
            acc = acc * tl.load(row_scale_ptr + rows, mask=rmask, other=0.0)[:, None]
        tl.store(
            out_ptr + rows[:, None] * stride_out + f[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=rmask[:, None] & fmask[None, :],
        )


def csr_gather(
    indptr: Tensor,
    cols: Tensor,
    x: Tensor,
    *,
    row_scale: Tensor | None = None,
    col_scale: Tensor | None = None,
    n_self: int = 0,
) -> Tensor:
    """The kernel of the module docstring: ``out`` [n_rows, F] in ``x``'s dtype.

    Args:
        indptr: int64[n_rows + 1] CSR row pointers.
        cols: int64[E] column of every edge, in ``[0, x.shape[0])``.
        x: float32/bfloat16/float16 [n_cols, F] (made contiguous).
        row_scale: float32[n_rows] or None (1).
        col_scale: float32[n_cols] or None (1).
        n_self: rows ``r < n_self`` also add their own row ``x[r]`` (0: none).

    Raises:
        RuntimeError: Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")
    x = x.contiguous()
    n_rows, feat = indptr.numel() - 1, int(x.shape[1])
    out = torch.empty((n_rows, feat), dtype=x.dtype, device=x.device)
    if n_rows == 0 or feat == 0:
        return out
    tile_f = block_f(feat)
    grid = (triton.cdiv(n_rows, ROWS), triton.cdiv(feat, tile_f))
    device = x.device
    dummy = out  # never read: the HAS_* flags are compile-time constants
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        _csr_gather_kernel[grid](
            indptr,
            cols,
            x,
            out,
            dummy if row_scale is None else row_scale,
            dummy if col_scale is None else col_scale,
            n_rows,
            n_self,
            feat,
            x.stride(0),
            out.stride(0),
            ROWS=ROWS,
            BLOCK_F=tile_f,
            HAS_ROW_SCALE=row_scale is not None,
            HAS_COL_SCALE=col_scale is not None,
            SELF_LOOP=n_self > 0,
            num_warps=NUM_WARPS,
        )
    return out


def transposed_csr(block: Block) -> tuple[Tensor, Tensor]:
    """(indptr int64[n_src + 1], destination int64[E]) of :func:`transposed_csr_edges`."""
    t_indptr, _, t_dst = transposed_csr_edges(block)
    return t_indptr, t_dst


def transposed_csr_edges(block: Block) -> tuple[Tensor, Tensor, Tensor]:
    """(indptr int64[n_src + 1], edge int64[E], destination int64[E]): the block's CSR over
    sources (edges of a source in ascending edge order; ``edge``: the position of each in
    ``block.indices``), built with torch ops on the block's device on first use and cached on
    the block object (rebuilt when ``indptr`` / ``indices`` were replaced or modified in
    place)."""
    key = (
        id(block.indptr),
        block.indptr._version,
        id(block.indices),
        block.indices._version,
        block.n_src,
    )
    cached = getattr(block, _TRANSPOSE_ATTR, None)
    if cached is not None and cached[0] == key:
        return cached[1], cached[2], cached[3]
    t_indptr, order = transposed_indptr(block.indices, block.n_src)
    t_dst = block.dst_of_edges()[order]
    setattr(block, _TRANSPOSE_ATTR, (key, t_indptr, order, t_dst))
    return t_indptr, order, t_dst


def _scale(block: Block, kind: str) -> Tensor | None:
    """float32[n_dst]: the destinations' factor (None for ``sum``)."""
    if kind == "sum":
        return None
    deg = block.indptr[1:] - block.indptr[:-1]
    denom = deg.clamp(min=1) if kind == "mean" else deg + 1
    return 1.0 / denom.to(torch.float32)


class _TritonAggregate(torch.autograd.Function):
    """``aggregate(block, x, kind)`` for x [n_src, F]; gradient w.r.t. x only."""

    @staticmethod
    def forward(ctx: FunctionCtx, block: Block, x: Tensor, kind: str) -> Tensor:  # type: ignore[override]
        scale = _scale(block, kind)
        ctx.block, ctx.kind, ctx.dtype = block, kind, x.dtype  # type: ignore[attr-defined]
        ctx.save_for_backward(scale if scale is not None else torch.empty(0))
        return csr_gather(
            block.indptr,
            block.indices,
            x,
            row_scale=scale,
            n_self=block.n_dst if kind == "gcn" else 0,
        )

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[None, Tensor | None, None]:  # type: ignore[override]
        if not ctx.needs_input_grad[1]:  # type: ignore[attr-defined]
            return None, None, None
        block, kind = ctx.block, ctx.kind  # type: ignore[attr-defined]
        (scale,) = ctx.saved_tensors  # type: ignore[attr-defined]
        t_indptr, t_dst = transposed_csr(block)
        grad_x = csr_gather(
            t_indptr,
            t_dst,
            grad_out,
            col_scale=None if kind == "sum" else scale,
            n_self=block.n_dst if kind == "gcn" else 0,
        )
        return None, grad_x.to(ctx.dtype), None  # type: ignore[attr-defined]


def aggregate(block: Block, x_src: Tensor, kind: str) -> Tensor:
    """:func:`distmb.nn.aggregate.aggregate` (arguments checked there) with the Triton
    kernel: x_src [n_src, *F] -> [n_dst, *F], in ``x_src``'s dtype."""
    feat_shape = x_src.shape[1:]
    out = _TritonAggregate.apply(block, x_src.reshape(block.n_src, -1), kind)
    return out.reshape(block.n_dst, *feat_shape)
