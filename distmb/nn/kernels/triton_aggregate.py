"""FastGL's Memory-Aware aggregation as a Triton CSR kernel (``--kernels triton``).

:func:`distmb.nn.aggregate.aggregate` (``"mean"``, ``"sum"``, ``"gcn"``) as one Triton program
per tile of :data:`ROWS` destination rows x :data:`BLOCK_F` features: the tile's partial sums
stay in registers (fp32, whatever the input dtype) while the program walks the rows' edges,
reading every source row once per edge and writing every output element once. FastGL keeps
them in shared memory for the same reason (section 4.2): the naive scatter (gather +
``index_add``) re-reads and re-writes the partial sum from global memory for every edge.

Kernel contract (:func:`csr_gather`), for rows ``r < n_rows`` and features ``f < feat``::

    out[r, f] = rs(r) * ( sum_{e in indptr[r]:indptr[r+1]} cs(cols[e]) * x[cols[e], f]
                          + (r < n_self) * w * cs(r) * x[r, f] )
                + (r < n_add) * addend[r, f]

with the row factor ``rs(r)`` computed in the kernel from the row's own degree
``indptr[r+1] - indptr[r]`` and the column factor ``cs(c)`` from the degree
``col_indptr[c+1] - col_indptr[c]`` of another CSR, each by a kind of :data:`SCALES`:
``"sum"`` 1, ``"mean"`` ``1 / max(d, 1)``, ``"gcn"`` ``1 / (d + 1)``, ``"symmetric"``
``1 / sqrt(max(d + [i < n_self], 1))`` (float32, the square root and the division rounded to
nearest: the values ``1.0 / d`` and ``d.pow(-0.5)`` of PyTorch's CPU ops). The forward of
``mean`` is ``rs = "mean"``; ``gcn``'s is ``rs = "gcn"`` with the own row (``n_self = n_dst``);
GCNConv's is ``rs = cs = "symmetric"`` with the sources' out-degrees from the transposed CSR's
row pointers as ``col_indptr`` (and, with self loops, the own row). No factor is ever a
tensor: the kernel reads the degrees it needs from the row pointers it is given. The own
row's weight ``w`` is 1, or ``1 + self_eps[0]`` (GIN's ``(1 + eps) x_v``, read from a
one-element tensor in the kernel: a learnable ``eps`` is never read back to the host).
``addend`` (any row stride, 0 for a broadcast row) is added after the row factor, in float32
(on a GPU the compiler may fuse the factor's product and this addition into one multiply-add,
one rounding fewer): the SAGE layer's self term and bias, or in the backward the self term's
input gradient (:mod:`distmb.nn.sage`), without a separate addition.

**Backward.** ``grad_x = A^T @ grad_out`` is the same kernel over the transposed CSR (rows:
sources, columns: destinations) with the two factors swapped: the destinations' factor as
``cs`` (its degrees read from the forward's ``indptr``, passed as ``col_indptr``), the
sources' (GCNConv's) as ``rs``, and the own-row term (``gcn``, GCNConv's self loops, GIN's
``(1 + eps)``) again. The transposed CSR is built once per block and cached on the block
object, like the C++ kernels' (:func:`distmb.nn.kernels.cpu_aggregate.block_transpose`): a
stable sort of ``indices`` (one PyTorch op, on the device), then one Triton kernel
(:func:`transposed_csr_edges`) that finds every source's first position in the sorted
indices and every sorted edge's destination by binary searches, where PyTorch ops took seven
(``arange``, ``searchsorted``, and the CSR's expansion to destinations per edge and its
permutation). The alternative, scattering ``grad_out[v] * w`` into ``grad_x`` with atomic adds
from the forward's row tiles, was not taken: the float sums would depend on thread scheduling
(runs not reproducible bit for bit, unlike every other kernel of the project), atomic adds on
bf16/fp16 gradients are slow or unsupported on older GPUs, and the read-modify-write of every
partial sum in global memory is exactly the traffic Memory-Aware removes. The sort costs a
few passes over the block's edges (a radix sort on a GPU), once per block.

Runs on CUDA tensors; on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``),
which is how CI tests it. Inputs float32, bfloat16 or float16; accumulation in float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from distmb.nn.kernels.dispatch import get_kernels
from distmb.pipeline.sample import Block
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
#: Entries per program of the transposed CSR's kernel (:func:`transposed_csr_edges`).
TRANSPOSE_BLOCK = 1024
#: Largest source count whose positions the transposed CSR sorts as int32 keys.
_INT32_MAX = 2**31 - 1
#: Dtypes the kernel reads and writes (it accumulates in float32).
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Attribute of a :class:`Block` instance caching its transposed CSR for the backward.
_TRANSPOSE_ATTR = "_triton_transpose"

#: Factor kinds of a row or column ``i`` of degree ``d``: ``"sum"`` 1, ``"mean"``
#: ``1 / max(d, 1)``, ``"gcn"`` ``1 / (d + 1)``, ``"symmetric"`` ``1 / sqrt(max(d', 1))``
#: with ``d' = d + [i < n_self]`` (GCNConv's ``d^-1/2``: a self loop, there for
#: ``i < n_self``, counts at both its ends); the values are the kernel's compile-time codes.
SCALES = {"sum": 0, "mean": 1, "gcn": 2, "symmetric": 3}

#: :func:`aggregate_forward`'s kinds: ``(forward row scale, forward column scale, own row)``.
#: The backward runs over the transposed CSR with the two scales swapped. ``"symmetric"`` /
#: ``"symmetric_self"`` are GCNConv's ``D_in^-1/2 A D_out^-1/2`` without / with self loops
#: (``A + I``); the sources' out-degrees are the transposed CSR's row degrees.
KINDS = {
    "mean": ("mean", "sum", False),
    "sum": ("sum", "sum", False),
    "gcn": ("gcn", "sum", True),
    "symmetric": ("symmetric", "symmetric", False),
    "symmetric_self": ("symmetric", "symmetric", True),
}

if triton is not None:
    #: :data:`SCALES`' codes inside the kernels (Triton reads only constexpr globals).
    _SCALE_MEAN = tl.constexpr(SCALES["mean"])
    _SCALE_GCN = tl.constexpr(SCALES["gcn"])
    _SCALE_SYMMETRIC = tl.constexpr(SCALES["symmetric"])


def supports(*tensors: Tensor) -> bool:
    """Whether the kernel can take these tensors: a supported dtype, on a device Triton runs
    on (CUDA; CPU under the interpreter)."""
    return all(t.dtype in DTYPES and usable(t.device)[0] for t in tensors)


def takes_layer(x: Tensor, params: Sequence[Tensor]) -> bool:
    """Whether a layer takes its Triton-path shortcuts (SAGEConv's one node for the
    aggregation and linear part, GATConv's ``addmm``) on input ``x``: ``--kernels triton``,
    tensors the kernels take, ``x`` in the parameters' dtype, and no autocast on ``x``'s
    device (whose casts and output dtypes PyTorch's ops give: under ``--precision bf16`` /
    ``fp16`` the layers keep those ops around the same Triton aggregation)."""
    return (
        get_kernels() == "triton"
        and supports(x, *params)
        and all(p.dtype == x.dtype for p in params)
        and not torch.is_autocast_enabled(x.device.type)
    )


def block_f(feat: int) -> int:
    """Feature tile for ``feat`` features: the next power of two, in
    [:data:`MIN_BLOCK_F`, :data:`MAX_BLOCK_F`]."""
    return min(MAX_BLOCK_F, max(MIN_BLOCK_F, 1 << max(0, (feat - 1).bit_length())))


def require_triton() -> None:
    if triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")


def device_context(device: torch.device) -> contextlib.AbstractContextManager:
    """Launch on ``device`` (a CUDA device's context; nothing for the interpreter)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


if triton is not None:

    @triton.jit
    def _degree_factor(deg, KIND: tl.constexpr):
        """float32 factor of degrees ``deg`` (int64) for a kind of :data:`SCALES` other than
        ``"sum"``: ``1 / max(deg, 1)``, ``1 / (deg + 1)`` or ``1 / sqrt(max(deg, 1))`` (the
        caller has added the self loop to ``deg``), the square root and the division rounded
        to nearest (PyTorch's ``1.0 / d``; Triton's ``/`` may be approximate on a GPU)."""
        if KIND == _SCALE_MEAN:
            denom = tl.maximum(deg, 1).to(tl.float32)
        elif KIND == _SCALE_SYMMETRIC:
            denom = tl.sqrt_rn(tl.maximum(deg, 1).to(tl.float32))
        else:
            denom = (deg + 1).to(tl.float32)
        return tl.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom)

    @triton.jit(do_not_specialize=["n_rows", "n_self", "n_add", "feat"])
    def _csr_gather_kernel(
        indptr_ptr,
        cols_ptr,
        x_ptr,
        out_ptr,
        col_indptr_ptr,
        addend_ptr,
        self_eps_ptr,
        n_rows,
        n_self,
        n_add,
        feat,
        stride_x,
        stride_out,
        stride_add,
        ROWS: tl.constexpr,
        BLOCK_F: tl.constexpr,
        ROW_SCALE: tl.constexpr,
        COL_SCALE: tl.constexpr,
        SELF_LOOP: tl.constexpr,
        HAS_ADDEND: tl.constexpr,
        SELF_EPS: tl.constexpr,
    ):
        """One [ROWS, BLOCK_F] tile of ``out`` (contract in the module docstring; the scales
        are codes of :data:`SCALES`, 0 for none; ``SELF_EPS``: the own row's weight is
        ``1 + self_eps[0]``, else 1)."""
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
            if COL_SCALE != 0:
                col_deg = tl.load(col_indptr_ptr + col + 1, mask=emask, other=0) - tl.load(
                    col_indptr_ptr + col, mask=emask, other=0
                )
                if COL_SCALE == _SCALE_SYMMETRIC:  # the column's own self loop
                    col_deg += (col < n_self).to(tl.int64)
                v = v * _degree_factor(col_deg, COL_SCALE)[:, None]
            acc += v
        if SELF_LOOP:
            smask = rmask & (rows < n_self)
            v = tl.load(
                x_ptr + rows[:, None] * stride_x + f[None, :],
                mask=smask[:, None] & fmask[None, :],
                other=0.0,
            ).to(tl.float32)
            if COL_SCALE != 0:
                own_deg = tl.load(col_indptr_ptr + rows + 1, mask=smask, other=0) - tl.load(
                    col_indptr_ptr + rows, mask=smask, other=0
                )
                if COL_SCALE == _SCALE_SYMMETRIC:  # r < n_self: its self loop
                    own_deg += 1
                v = v * _degree_factor(own_deg, COL_SCALE)[:, None]
            if SELF_EPS:
                v = v * (1.0 + tl.load(self_eps_ptr).to(tl.float32))
            acc += v
        if ROW_SCALE != 0:
            row_deg = deg
            if ROW_SCALE == _SCALE_SYMMETRIC:  # the row's own self loop
                row_deg += (rows < n_self).to(tl.int64)
            acc = acc * _degree_factor(row_deg, ROW_SCALE)[:, None]
        if HAS_ADDEND:
            amask = rmask & (rows < n_add)
            acc += tl.load(
                addend_ptr + rows[:, None] * stride_add + f[None, :],
                mask=amask[:, None] & fmask[None, :],
                other=0.0,
            ).to(tl.float32)
        tl.store(
            out_ptr + rows[:, None] * stride_out + f[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=rmask[:, None] & fmask[None, :],
        )

    @triton.jit(do_not_specialize=["n_edges", "n_src", "n_dst", "edge_steps", "row_steps"])
    def _transpose_kernel(
        sorted_cols_ptr,
        order_ptr,
        indptr_ptr,
        t_indptr_ptr,
        t_dst_ptr,
        n_edges,
        n_src,
        n_dst,
        edge_steps,
        row_steps,
        BLOCK: tl.constexpr,
    ):
        """BLOCK entries of the transposed CSR, by binary searches (no atomics, no order
        between programs): ``t_indptr[p]`` (``p <= n_src``) is the number of sorted column
        indices below ``p``, ``t_dst[p]`` (``p < n_edges``) the forward row of edge
        ``order[p]``: the number of ``indptr`` entries ``<= order[p]``, less one.
        ``edge_steps`` / ``row_steps`` are the halvings that empty ranges of ``n_edges`` /
        ``n_dst + 1`` entries."""
        p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        pmask = p <= n_src
        lo = tl.zeros((BLOCK,), dtype=tl.int64)
        hi = tl.zeros((BLOCK,), dtype=tl.int64) + n_edges
        for _ in range(0, edge_steps):
            active = pmask & (lo < hi)
            mid = (lo + hi) // 2
            below = tl.load(sorted_cols_ptr + mid, mask=active, other=0) < p
            lo = tl.where(active & below, mid + 1, lo)
            hi = tl.where(active & ~below, mid, hi)
        tl.store(t_indptr_ptr + p, lo, mask=pmask)
        emask = p < n_edges
        edge = tl.load(order_ptr + p, mask=emask, other=0)
        lo = tl.zeros((BLOCK,), dtype=tl.int64)
        hi = tl.zeros((BLOCK,), dtype=tl.int64) + n_dst + 1
        for _ in range(0, row_steps):
            active = emask & (lo < hi)
            mid = (lo + hi) // 2
            below = tl.load(indptr_ptr + mid, mask=active, other=0) <= edge
            lo = tl.where(active & below, mid + 1, lo)
            hi = tl.where(active & ~below, mid, hi)
        tl.store(t_dst_ptr + p, lo - 1, mask=emask)


def csr_gather(
    indptr: Tensor,
    cols: Tensor,
    x: Tensor,
    *,
    row_scale: str = "sum",
    col_scale: str = "sum",
    col_indptr: Tensor | None = None,
    n_self: int = 0,
    addend: Tensor | None = None,
    self_eps: Tensor | None = None,
) -> Tensor:
    """The kernel of the module docstring: ``out`` [n_rows, F] in ``x``'s dtype.

    Args:
        indptr: int64[n_rows + 1] CSR row pointers.
        cols: int64[E] column of every edge, in ``[0, x.shape[0])``.
        x: float32/bfloat16/float16 [n_cols, F] (made contiguous).
        row_scale: a kind of :data:`SCALES`, of every row's own degree.
        col_scale: a kind of :data:`SCALES`, of every column's degree in ``col_indptr``.
        col_indptr: int64[n_cols + 1] (at least ``max(n_cols, n_self) + 1`` entries), the
            CSR whose row degrees ``col_scale`` takes; needed unless ``col_scale`` is
            ``"sum"``.
        n_self: rows ``r < n_self`` also add their own row ``x[r]`` (0: none).
        addend: float32/bfloat16/float16 [n_add, F] (any row stride: ``expand`` a [F] row
            for a broadcast one), added to rows ``r < n_add`` (``n_add <= n_rows``); None:
            nothing.
        self_eps: float32/bfloat16/float16 [1]: the own row (``n_self``) is weighted
            ``1 + self_eps[0]`` (GIN's ``eps``); None: weight 1.

    Raises:
        RuntimeError: Triton is not installed.
        ValueError: an unknown kind, ``col_scale`` without ``col_indptr``, or ``self_eps``
            not one element.
    """
    require_triton()
    if row_scale not in SCALES or col_scale not in SCALES:
        raise ValueError(f"unknown scale {row_scale!r} / {col_scale!r}; expected {list(SCALES)}")
    if col_scale != "sum" and col_indptr is None:
        raise ValueError(f"col_scale={col_scale!r} needs col_indptr")
    if self_eps is not None and self_eps.numel() != 1:
        raise ValueError(f"self_eps must have one element, got shape {tuple(self_eps.shape)}")
    x = x.contiguous()
    n_rows, feat = indptr.numel() - 1, int(x.shape[1])
    out = torch.empty((n_rows, feat), dtype=x.dtype, device=x.device)
    if n_rows == 0 or feat == 0:
        return out
    if addend is not None and addend.stride(1) != 1:
        addend = addend.contiguous()
    tile_f = block_f(feat)
    grid = (triton.cdiv(n_rows, ROWS), triton.cdiv(feat, tile_f))
    # Never read where the flags (compile-time constants) leave them out.
    dummy = out
    with device_context(x.device):
        _csr_gather_kernel[grid](
            indptr,
            cols,
            x,
            out,
            dummy if col_indptr is None else col_indptr,
            dummy if addend is None else addend,
            dummy if self_eps is None else self_eps,
            n_rows,
            n_self,
            0 if addend is None else int(addend.shape[0]),
            feat,
            x.stride(0),
            out.stride(0),
            0 if addend is None else addend.stride(0),
            ROWS=ROWS,
            BLOCK_F=tile_f,
            ROW_SCALE=SCALES[row_scale],
            COL_SCALE=SCALES[col_scale],
            SELF_LOOP=n_self > 0,
            HAS_ADDEND=addend is not None,
            SELF_EPS=self_eps is not None and n_self > 0,
            num_warps=NUM_WARPS,
        )
    return out


def transposed_csr(block: Block) -> tuple[Tensor, Tensor]:
    """(indptr int64[n_src + 1], destination int64[E]) of :func:`transposed_csr_edges` (or
    of :func:`set_transposed_csr`)."""
    cached = _cached_transpose(block)
    t_indptr, _, t_dst = cached if cached is not None else transposed_csr_edges(block)
    return t_indptr, t_dst


def set_transposed_csr(block: Block, t_indptr: Tensor, t_dst: Tensor) -> None:
    """Cache on ``block`` its transposed CSR built elsewhere (``--compile``'s operators take it
    as tensors, :mod:`distmb.nn.kernels.ops`): :func:`transposed_csr`'s ``t_indptr``
    int64[n_src + 1] and ``t_dst`` int64[E], returned by it until ``indptr`` / ``indices``
    change; :func:`transposed_csr_edges` (which also returns the edge order) builds its own."""
    setattr(block, _TRANSPOSE_ATTR, (block.structure_key(), t_indptr, None, t_dst))


def _cached_transpose(block: Block) -> tuple[Tensor, Tensor | None, Tensor] | None:
    """The block's cached ``(t_indptr, order or None, t_dst)`` if still valid, else None."""
    cached = getattr(block, _TRANSPOSE_ATTR, None)
    if cached is None or cached[0] != block.structure_key():
        return None
    return cached[1], cached[2], cached[3]


def transposed_csr_edges(block: Block) -> tuple[Tensor, Tensor, Tensor]:
    """(indptr int64[n_src + 1], edge int64[E], destination int64[E]): the block's CSR over
    sources (edges of a source in ascending edge order; ``edge``: the position of each in
    ``block.indices``), built on the block's device on first use (a stable ``torch.sort``,
    of int32 keys where ``n_src`` allows, and :func:`_transpose_kernel`) and cached on the
    block object (rebuilt when ``indptr`` / ``indices`` were replaced or modified in place).

    Raises:
        RuntimeError: Triton is not installed.
    """
    cached = _cached_transpose(block)
    if cached is not None and cached[1] is not None:
        return cached[0], cached[1], cached[2]
    require_triton()
    n_edges, device = block.num_edges, block.indices.device
    # int32 keys where the positions fit: the radix sort makes half the passes of int64's,
    # and the same stable order.
    keys = block.indices.to(torch.int32) if block.n_src <= _INT32_MAX else block.indices
    sorted_cols, order = torch.sort(keys, stable=True)
    t_indptr = torch.empty(block.n_src + 1, dtype=torch.int64, device=device)
    t_dst = torch.empty(n_edges, dtype=torch.int64, device=device)
    grid = (triton.cdiv(max(n_edges, block.n_src + 1), TRANSPOSE_BLOCK),)
    with device_context(device):
        _transpose_kernel[grid](
            sorted_cols, order, block.indptr, t_indptr, t_dst,
            n_edges, block.n_src, block.n_dst, n_edges.bit_length(),
            (block.n_dst + 1).bit_length(), BLOCK=TRANSPOSE_BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
    setattr(block, _TRANSPOSE_ATTR, (block.structure_key(), t_indptr, order, t_dst))
    return t_indptr, order, t_dst


def _kind(kind: str, self_eps: Tensor | None) -> tuple[str, str, bool]:
    """:data:`KINDS`' entry of ``kind``; with ``self_eps`` (only for ``"sum"``) the own row
    is on."""
    if kind not in KINDS:
        raise ValueError(f"unknown aggregation {kind!r}; expected one of {list(KINDS)}")
    row_scale, col_scale, own_row = KINDS[kind]
    if self_eps is not None:
        if kind != "sum":
            raise ValueError(f"self_eps is for the 'sum' aggregation (GIN's), not {kind!r}")
        own_row = True
    return row_scale, col_scale, own_row


def aggregate_forward(
    block: Block,
    x_src: Tensor,
    kind: str,
    addend: Tensor | None = None,
    self_eps: Tensor | None = None,
) -> Tensor:
    """``aggregate(block, x_src, kind) + addend`` without autograd: x_src [n_src, F] ->
    [n_dst, F] in its dtype.

    Args:
        block: the layer's block.
        x_src: [n_src, F].
        kind: a key of :data:`KINDS` (``aggregate``'s aggregators, GCNConv's
            ``"symmetric"`` / ``"symmetric_self"``: whose sources' out-degrees come from the
            block's transposed CSR, built and cached here when missing).
        addend: [n_dst, F] (any row stride) or None.
        self_eps: [1] or None: with ``kind="sum"``, GIN's ``(1 + eps) x_src[:n_dst]`` is
            added to the neighbour sum.
    """
    row_scale, col_scale, own_row = _kind(kind, self_eps)
    return csr_gather(
        block.indptr,
        block.indices,
        x_src,
        row_scale=row_scale,
        col_scale=col_scale,
        col_indptr=None if col_scale == "sum" else transposed_csr(block)[0],
        n_self=block.n_dst if own_row else 0,
        addend=addend,
        self_eps=self_eps,
    )


def aggregate_backward(
    block: Block,
    kind: str,
    grad_out: Tensor,
    addend: Tensor | None = None,
    self_eps: Tensor | None = None,
) -> Tensor:
    """The input gradient of :func:`aggregate_forward`'s aggregation (the same ``kind`` and
    ``self_eps``), plus ``addend`` [n_add <= n_src, F] on its first rows (a second use of
    those inputs, e.g. a self term), without autograd: grad_out [n_dst, F] -> [n_src, F] in
    ``grad_out``'s dtype."""
    row_scale, col_scale, own_row = _kind(kind, self_eps)
    t_indptr, t_dst = transposed_csr(block)
    return csr_gather(
        t_indptr,
        t_dst,
        grad_out,
        row_scale=col_scale,
        col_scale=row_scale,
        col_indptr=None if row_scale == "sum" else block.indptr,
        n_self=block.n_dst if own_row else 0,
        addend=addend,
        self_eps=self_eps,
    )


class _TritonAggregate(torch.autograd.Function):
    """``aggregate(block, x, kind)`` for x [n_src, F]; gradient w.r.t. x only."""

    @staticmethod
    def forward(ctx: FunctionCtx, block: Block, x: Tensor, kind: str) -> Tensor:  # type: ignore[override]
        ctx.block, ctx.kind, ctx.dtype = block, kind, x.dtype  # type: ignore[attr-defined]
        return aggregate_forward(block, x, kind)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[None, Tensor | None, None]:  # type: ignore[override]
        if not ctx.needs_input_grad[1]:  # type: ignore[attr-defined]
            return None, None, None
        grad_x = aggregate_backward(ctx.block, ctx.kind, grad_out)  # type: ignore[attr-defined]
        return None, grad_x.to(ctx.dtype), None  # type: ignore[attr-defined]


def aggregate(block: Block, x_src: Tensor, kind: str) -> Tensor:
    """:func:`distmb.nn.aggregate.aggregate` (arguments checked there) with the Triton
    kernel: x_src [n_src, *F] -> [n_dst, *F], in ``x_src``'s dtype."""
    feat_shape = x_src.shape[1:]
    out = _TritonAggregate.apply(block, x_src.reshape(block.n_src, -1), kind)
    return out.reshape(block.n_dst, *feat_shape)
