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

**Self loops** (``self_loops``, GATConv's default in the models): every destination ``v``
also attends to itself, the edge ``(v, v)`` last in its row, as over the block
:func:`distmb.nn.aggregate.add_self_loops` builds, but without building it (fifteen PyTorch
ops per layer): the forward and destination kernels add the own edge after a row's edges
(``dpre`` of the own edges in a float32[n_dst, H] buffer of their own), and the source
kernel over the block's own transposed CSR adds it where that block's transposed row has
it (after the edges into destinations ``<= u``), so the float sums run in the same order:
the same values as the looped block's.

Attention dropout has no place between the softmax and the sum here: GATConv takes this path
only when it is inactive (``attn_dropout`` 0 or eval mode).

Runs on CUDA tensors; on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``).
Inputs float32, bfloat16 or float16 (each of ``el``, ``er``, ``z`` in its own); accumulation
in float32; every gradient in its input's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from distmb.nn.kernels.triton_aggregate import (
    NUM_WARPS,
    ROWS,
    block_f,
    device_context,
    require_triton,
    transposed_csr_edges,
)
from distmb.pipeline.sample import Block
from distmb.pipeline.sample.idmap_triton import triton

if triton is not None:
    import triton.language as tl

#: Softmax statistics are kept in float32 (``m``, ``s`` and ``dpre``), and so are the scores
#: of :func:`~distmb.nn.kernels.triton_gat_layer.gat_scores`.
STATS_DTYPE = torch.float32


if triton is not None:

    @triton.jit
    def _edge_logit(el_ptr, col, h, heads, er_row, emask, negative_slope):
        """(pre, logit) float32[ROWS] of the rows' current edges (0 where ``emask`` is off)."""
        pre = tl.load(el_ptr + col * heads + h, mask=emask, other=0.0).to(tl.float32) + er_row
        return pre, tl.where(pre > 0, pre, pre * negative_slope)

    @triton.jit
    def _weighted_row(z_ptr, col, h, heads, dim, f, emask, fmask, logit, row_max):
        """(p float32[ROWS], p * z[col, h, f] float32[ROWS, BLOCK_F]) of the rows' current
        edges, ``p = exp(logit - row_max)`` (0 where ``emask`` is off)."""
        p = tl.exp(tl.where(emask, logit - row_max, float("-inf")))
        v = tl.load(
            z_ptr + (col * heads + h)[:, None] * dim + f[None, :],
            mask=emask[:, None] & fmask[None, :],
            other=0.0,
        ).to(tl.float32)
        return p, p[:, None] * v

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
        SELF_LOOP: tl.constexpr,
    ):
        """``out`` [ROWS rows, head, BLOCK_F features]; the first feature block also writes
        the rows' ``m`` and ``s`` (module docstring). With ``SELF_LOOP`` every row also has
        the edge ``(v, v)``, after its own edges."""
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
        if SELF_LOOP:
            _, self_logit = _edge_logit(el_ptr, rows, h, heads, er_row, rmask, negative_slope)
            row_max = tl.maximum(row_max, tl.where(rmask, self_logit, float("-inf")))
        row_sum = tl.zeros((ROWS,), dtype=tl.float32)
        acc = tl.zeros((ROWS, BLOCK_F), dtype=tl.float32)
        for k in range(0, max_deg):
            emask = rmask & (k < deg)
            col = tl.load(cols_ptr + start + k, mask=emask, other=0)
            _, logit = _edge_logit(el_ptr, col, h, heads, er_row, emask, negative_slope)
            p, weighted = _weighted_row(z_ptr, col, h, heads, dim, f, emask, fmask, logit, row_max)
            row_sum += p
            acc += weighted
        if SELF_LOOP:
            p, weighted = _weighted_row(
                z_ptr, rows, h, heads, dim, f, rmask, fmask, self_logit, row_max
            )
            row_sum += p
            acc += weighted
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
        dpre_self_ptr,
        grad_er_ptr,
        edge_g_ptr,
        n_dst,
        heads,
        dim,
        negative_slope,
        ROWS: tl.constexpr,
        BLOCK_F: tl.constexpr,
        SELF_LOOP: tl.constexpr,
    ):
        """``dpre`` of the edges of ROWS rows and one head, and those rows' ``grad_er``; with
        ``SELF_LOOP`` also of every row's edge ``(v, v)`` (last), into ``dpre_self``
        float32[n_dst, H]. ``edge_g`` float32[nnz, H]: scratch, each edge's ``<dout, z>``
        from the first pass over the rows' edges, read by the second."""
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
            g = _edge_dot(grad_out_ptr, z_ptr, rows, col, h, heads, dim, emask, ROWS, BLOCK_F)
            # Kept for the second pass, instead of reading the two feature rows again. In a
            # buffer of its own: the second pass's stores to dpre, by whichever thread
            # stores a lane, could otherwise land before another thread holding the same
            # lane has loaded it.
            tl.store(edge_g_ptr + (start + k) * heads + h, g, mask=emask)
            weighted_g += a * g
        if SELF_LOOP:
            self_pre, self_logit = _edge_logit(
                el_ptr, rows, h, heads, er_row, rmask, negative_slope
            )
            self_a = tl.exp(tl.where(rmask, self_logit - row_max, float("-inf"))) / row_sum
            self_g = _edge_dot(grad_out_ptr, z_ptr, rows, rows, h, heads, dim, rmask, ROWS, BLOCK_F)
            weighted_g += self_a * self_g
        grad_er = tl.zeros((ROWS,), dtype=tl.float32)
        # The first pass's stores are seen by every thread of the program (a lane's value
        # may be held by another thread than the one that stored it).
        tl.debug_barrier()
        for k in range(0, max_deg):
            emask = rmask & (k < deg)
            col = tl.load(cols_ptr + start + k, mask=emask, other=0)
            pre, logit = _edge_logit(el_ptr, col, h, heads, er_row, emask, negative_slope)
            a = tl.exp(tl.where(emask, logit - row_max, float("-inf"))) / row_sum
            g = tl.load(edge_g_ptr + (start + k) * heads + h, mask=emask, other=0.0)
            dpre = a * (g - weighted_g) * tl.where(pre > 0, 1.0, negative_slope)
            tl.store(dpre_ptr + (start + k) * heads + h, dpre, mask=emask)
            grad_er += dpre
        if SELF_LOOP:
            dpre = self_a * (self_g - weighted_g) * tl.where(self_pre > 0, 1.0, negative_slope)
            tl.store(dpre_self_ptr + rows * heads + h, dpre, mask=rmask)
            grad_er += dpre
        tl.store(grad_er_ptr + rows * heads + h, grad_er.to(grad_er_ptr.dtype.element_ty),
                 mask=rmask)  # fmt: skip

    @triton.jit
    def _attention_into(
        el_row, er_ptr, max_ptr, sum_ptr, grad_out_ptr, dst, h, heads, dim, f, fmask, mask,
        negative_slope,
    ):  # fmt: skip
        """For edges from sources of ``el_row`` (float32[ROWS]) into destinations ``dst``
        (int[ROWS], lanes ``mask``), head ``h``: the attention coefficient alpha (float32[ROWS],
        from the forward's row maximum and sum) and the destinations' output gradient rows
        (float32[ROWS, BLOCK_F] over features ``f``, ``fmask``)."""
        pre = el_row + tl.load(er_ptr + dst * heads + h, mask=mask, other=0.0).to(tl.float32)
        logit = tl.where(pre > 0, pre, pre * negative_slope)
        row_max = tl.load(max_ptr + dst * heads + h, mask=mask, other=0.0)
        row_sum = tl.load(sum_ptr + dst * heads + h, mask=mask, other=1.0)
        a = tl.exp(tl.where(mask, logit - row_max, float("-inf"))) / row_sum
        d_out = tl.load(
            grad_out_ptr + (dst * heads + h)[:, None] * dim + f[None, :],
            mask=mask[:, None] & fmask[None, :],
            other=0.0,
        ).to(tl.float32)
        return a, d_out

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
        dpre_self_ptr,
        grad_z_ptr,
        grad_el_ptr,
        grad_er_ptr,
        attn_l_ptr,
        attn_r_ptr,
        n_src,
        n_dst,
        heads,
        dim,
        negative_slope,
        ROWS: tl.constexpr,
        BLOCK_F: tl.constexpr,
        GRAD_EL: tl.constexpr,
        SELF_LOOP: tl.constexpr,
        FOLD_SCORES: tl.constexpr,
    ):
        """``grad_z`` [ROWS sources, head, BLOCK_F features] over the transposed CSR; the
        first feature block also writes the sources' ``grad_el`` (with ``GRAD_EL``). With
        ``SELF_LOOP`` a source ``u < n_dst`` also has the edge ``(u, u)``, summed where the
        block with the loops appended would have it in ``u``'s transposed row: after the
        edges into destinations ``<= u``, before those into later ones (the same order of
        float additions as over that block's transposed CSR). With ``FOLD_SCORES`` (and
        ``GRAD_EL``) ``grad_z`` also takes the scores' terms, ``grad_el[u, h] * a_l[h]`` and
        for ``u < n_dst`` ``grad_er[u, h] * a_r[h]`` (``grad_er`` float32, the destination
        kernel's), as the gradient of
        :func:`~distmb.nn.kernels.triton_gat_layer.attention_layer`'s ``z``."""
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
        if SELF_LOOP:
            pending = rmask & (rows < n_dst)
            self_a, self_dout = _attention_into(
                el_row, er_ptr, max_ptr, sum_ptr, grad_out_ptr, rows, h, heads, dim, f, fmask,
                pending, negative_slope,
            )  # fmt: skip
            self_dpre = tl.zeros((ROWS,), dtype=tl.float32)
            if GRAD_EL:
                self_dpre = tl.load(dpre_self_ptr + rows * heads + h, mask=pending, other=0.0)
        for k in range(0, max_deg):
            emask = rmask & (k < deg)
            dst = tl.load(t_dst_ptr + start + k, mask=emask, other=0)
            if SELF_LOOP:
                take = pending & emask & (dst > rows)
                acc = tl.where(take[:, None], acc + self_a[:, None] * self_dout, acc)
                grad_el = tl.where(take, grad_el + self_dpre, grad_el)
                pending = pending & ~take
            a, d_out = _attention_into(
                el_row, er_ptr, max_ptr, sum_ptr, grad_out_ptr, dst, h, heads, dim, f, fmask,
                emask, negative_slope,
            )  # fmt: skip
            acc += a[:, None] * d_out
            if GRAD_EL:
                edge = tl.load(t_edges_ptr + start + k, mask=emask, other=0)
                grad_el += tl.load(dpre_ptr + edge * heads + h, mask=emask, other=0.0)
        if SELF_LOOP:
            acc = tl.where(pending[:, None], acc + self_a[:, None] * self_dout, acc)
            grad_el = tl.where(pending, grad_el + self_dpre, grad_el)
        if FOLD_SCORES:
            a_l = tl.load(attn_l_ptr + h * dim + f, mask=fmask, other=0.0).to(tl.float32)
            a_r = tl.load(attn_r_ptr + h * dim + f, mask=fmask, other=0.0).to(tl.float32)
            dmask = rmask & (rows < n_dst)
            g_er = tl.load(grad_er_ptr + rows * heads + h, mask=dmask, other=0.0)
            acc += grad_el[:, None] * a_l[None, :] + g_er[:, None] * a_r[None, :]
        tl.store(
            grad_z_ptr + (rows * heads + h)[:, None] * dim + f[None, :],
            acc.to(grad_z_ptr.dtype.element_ty),
            mask=rmask[:, None] & fmask[None, :],
        )
        if GRAD_EL:
            if f_block == 0:
                tl.store(grad_el_ptr + rows * heads + h,
                         grad_el.to(grad_el_ptr.dtype.element_ty), mask=rmask)  # fmt: skip


def gat_forward(
    block: Block,
    el: Tensor,
    er: Tensor,
    z: Tensor,
    negative_slope: float,
    self_loops: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward kernel, no autograd.

    Args:
        block: the message-flow graph (its CSR on ``z``'s device).
        el: float[n_src, H] contiguous, the source terms.
        er: float[n_dst, H] contiguous, the destination terms.
        z: float[n_src, H, D] contiguous, the source rows per head.
        negative_slope: the LeakyReLU's slope on the logits.
        self_loops: every destination ``v`` also has the edge ``(v, v)``, after its own
            (the values of :func:`distmb.nn.aggregate.add_self_loops`' block, without
            building it).

    Returns:
        ``out`` [n_dst, H, D] in ``z``'s dtype, and the softmax's ``m`` and ``s``, float32
        [n_dst, H] (``-inf`` and 0 for a destination without edges). The kernel writes every
        entry of the three: they are allocated without a fill.
    """
    require_triton()
    n_dst, heads, dim = block.n_dst, int(z.shape[1]), int(z.shape[2])
    out = torch.empty((n_dst, heads, dim), dtype=z.dtype, device=z.device)
    row_max = torch.empty((n_dst, heads), dtype=STATS_DTYPE, device=z.device)
    row_sum = torch.empty((n_dst, heads), dtype=STATS_DTYPE, device=z.device)
    if out.numel() == 0:
        return out, row_max.fill_(float("-inf")), row_sum.zero_()
    tile_f = block_f(dim)
    grid = (triton.cdiv(n_dst, ROWS), heads, triton.cdiv(dim, tile_f))
    with device_context(z.device):
        _gat_forward_kernel[grid](
            block.indptr, block.indices, el, er, z, out, row_max, row_sum,
            n_dst, heads, dim, float(negative_slope),
            ROWS=ROWS, BLOCK_F=tile_f, SELF_LOOP=self_loops, num_warps=NUM_WARPS,
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
    self_loops: bool = False,
    fold: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """The backward kernels, no autograd: ``(grad_el, grad_er, grad_z)`` in the dtypes of
    ``el``, ``er``, ``z`` (the first two None without ``need_scores``); the kernels write
    every entry (allocated without a fill).

    Args (besides :func:`gat_forward`'s): ``row_max``, ``row_sum``: its ``m`` and ``s``;
    ``grad_out``: float[n_dst, H, D] contiguous; ``fold``: ``(a_l, a_r)`` float[H, D]
    contiguous when ``el`` and ``er`` (float32) are
    :func:`~distmb.nn.kernels.triton_gat_layer.gat_scores` of ``z``: ``grad_z``
    then includes their terms (needs ``need_scores``).
    """
    require_triton()
    if fold is not None and not (need_scores and er.dtype == STATS_DTYPE):
        raise ValueError("fold needs need_scores and float32 scores (gat_scores')")
    n_dst, n_src = block.n_dst, block.n_src
    heads, dim = int(z.shape[1]), int(z.shape[2])
    device = z.device
    grad_z = torch.empty_like(z)
    grad_el = torch.empty_like(el) if need_scores else None
    grad_er = torch.empty_like(er) if need_scores else None
    if heads == 0 or dim == 0:
        return grad_el, grad_er, grad_z.zero_()
    tile_f = block_f(dim)
    # Never read where the flags (compile-time constants) leave them out.
    dpre = dpre_self = grad_z
    with device_context(device):
        if need_scores:
            dpre = torch.empty((block.num_edges, heads), dtype=STATS_DTYPE, device=device)
            edge_g = torch.empty_like(dpre)
            if self_loops:
                dpre_self = torch.empty((n_dst, heads), dtype=STATS_DTYPE, device=device)
            if n_dst > 0:
                _gat_backward_dst_kernel[(triton.cdiv(n_dst, ROWS), heads)](
                    block.indptr, block.indices, el, er, z, grad_out, row_max, row_sum, dpre,
                    dpre_self, grad_er, edge_g, n_dst, heads, dim, float(negative_slope),
                    ROWS=ROWS, BLOCK_F=tile_f, SELF_LOOP=self_loops, num_warps=NUM_WARPS,
                )  # fmt: skip
        if n_src > 0:
            t_indptr, t_edges, t_dst = transposed_csr_edges(block)
            grid = (triton.cdiv(n_src, ROWS), heads, triton.cdiv(dim, tile_f))
            attn_l, attn_r = (grad_z, grad_z) if fold is None else fold
            _gat_backward_src_kernel[grid](
                t_indptr, t_edges, t_dst, el, er, grad_out, row_max, row_sum, dpre, dpre_self,
                grad_z, grad_el if need_scores else grad_z, grad_er if need_scores else grad_z,
                attn_l, attn_r, n_src, n_dst, heads, dim, float(negative_slope),
                ROWS=ROWS, BLOCK_F=tile_f, GRAD_EL=need_scores, SELF_LOOP=self_loops,
                FOLD_SCORES=fold is not None, num_warps=NUM_WARPS,
            )  # fmt: skip
    return grad_el, grad_er, grad_z


class _TritonAttentionAggregate(torch.autograd.Function):
    """``attention_aggregate(block, el, er, z, negative_slope, self_loops)``; gradients
    w.r.t. el, er, z."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx,
        block: Block,
        el: Tensor,
        er: Tensor,
        z: Tensor,
        negative_slope: float,
        self_loops: bool,
    ) -> Tensor:
        el, er, z = el.contiguous(), er.contiguous(), z.contiguous()
        out, row_max, row_sum = gat_forward(block, el, er, z, negative_slope, self_loops)
        ctx.block, ctx.negative_slope = block, negative_slope  # type: ignore[attr-defined]
        ctx.self_loops = self_loops  # type: ignore[attr-defined]
        ctx.save_for_backward(el, er, z, row_max, row_sum)
        return out

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx: FunctionCtx, grad_out: Tensor
    ) -> tuple[None, Tensor | None, Tensor | None, Tensor | None, None, None]:
        _, need_el, need_er, need_z, _, _ = ctx.needs_input_grad  # type: ignore[attr-defined]
        if not (need_el or need_er or need_z):
            return None, None, None, None, None, None
        el, er, z, row_max, row_sum = ctx.saved_tensors  # type: ignore[attr-defined]
        grad_el, grad_er, grad_z = gat_backward(
            ctx.block, el, er, z, ctx.negative_slope,  # type: ignore[attr-defined]
            row_max, row_sum, grad_out.contiguous(), need_scores=need_el or need_er,
            self_loops=ctx.self_loops,  # type: ignore[attr-defined]
        )  # fmt: skip
        return (
            None,
            grad_el if need_el else None,
            grad_er if need_er else None,
            grad_z if need_z else None,
            None,
            None,
        )


def attention_aggregate(
    block: Block,
    el: Tensor,
    er: Tensor,
    z: Tensor,
    negative_slope: float,
    self_loops: bool = False,
) -> Tensor:
    """:func:`distmb.nn.aggregate.attention_aggregate` (arguments checked there) with the
    Triton kernels: float[n_dst, H, D] in ``z``'s dtype. ``self_loops``: every destination
    also attends to itself, as over :func:`distmb.nn.aggregate.add_self_loops`' block (the
    same values, without building that block)."""
    return _TritonAttentionAggregate.apply(block, el, er, z, negative_slope, self_loops)
