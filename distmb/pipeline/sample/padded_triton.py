"""The refill of :class:`~distmb.pipeline.sample.padded.PaddedBatch` in ``L + 1`` Triton
launches, no host read.

The layout and what each buffer holds are :mod:`~distmb.pipeline.sample.padded`'s; its torch
ops fill the same buffers with the same values in ``6 L + 1`` launches (one per op). Here:

1. per layer, top first, :func:`fill_layer` (``_layer_kernel``), a grid of programs over
   ``BLOCK`` consecutive entries of the layer's widest buffer (``max(E_l, P_l)``): the
   positions of the layer's new sources (``positions[n_dst + i] = P_l + i``), its edges'
   sources (a real edge's source mapped through the positions, a padding edge's its sink's
   row) and its row pointers (a real or padded row's by a binary search of the real rows'
   positions, a sink's ``max(nnz, j c_l)``);
2. :func:`fill_rows` (``_rows_kernel``): the input rows scattered to their positions and the
   labels copied.

**Order.** Layer ``l``'s kernel reads ``positions[:n_dst_l]``: the seeds' (never written) and
the new sources of the layers above, written by the launches before it; it writes
``positions[n_dst_l : n_src_l]``, which no program of its own launch reads (a new source's
position is computed where an edge reads it). The rows' kernel reads the positions of every
input row, all written by then. So every read is of a value an earlier launch wrote (stream
order on a GPU) or of a static one, and each output element is written by one lane: no
atomics, no dependence on the order of programs. Under the interpreter the programs of a
launch run one after another; on a GPU they run at once, which
``tests/test_padded_triton.py`` checks with ``pytest -m cuda``.

Every size is a kernel scalar from the blocks' host ints (``n_dst``, ``n_src``,
``num_edges``) and the layout's. Runs on CUDA tensors, and on CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1`` set before Triton is imported), which is how CI tests it.
"""

from __future__ import annotations

import contextlib

import torch

from distmb.pipeline.sample.idmap_triton import triton

if triton is not None:
    import triton.language as tl

__all__ = ["BLOCK", "MAX_BLOCK_F", "TILE", "fill_layer", "fill_rows", "launches"]

#: Entries per program of a layer's kernel.
BLOCK = 1024
#: Elements per program of the rows' kernel: ``TILE / BLOCK_F`` rows of ``BLOCK_F`` columns.
TILE = 4096
#: Largest feature tile of the rows' kernel (a power of two, at most :data:`TILE`; narrower
#: rows take the next power of two of their width).
MAX_BLOCK_F = 128

if triton is not None:
    # Layer ``l``'s edges, row pointers and new sources' positions (module docstring, 1).
    # Reads positions[:n_dst] (written before this launch, or the seeds' static ones), writes
    # positions[n_dst : n_dst + n_new], indices[:edges] and indptr[:dst_rows] (indptr[dst_rows]
    # = edges is static), each element from one lane. Sizes vary per batch: never specialised.
    @triton.jit(
        do_not_specialize=[
            "n_dst", "n_new", "nnz", "search_steps", "dst_rows", "first_sink", "edges",
            "sink_edges",
        ]
    )  # fmt: skip
    def _layer_kernel(
        positions_ptr, block_indptr_ptr, block_indices_ptr, indptr_ptr, indices_ptr,
        n_dst, n_new, nnz, search_steps, dst_rows, first_sink, edges, sink_edges,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        n_dst = n_dst.to(tl.int64)
        nnz = nnz.to(tl.int64)
        dst_rows = dst_rows.to(tl.int64)
        first_sink = first_sink.to(tl.int64)
        sink_edges = sink_edges.to(tl.int64)
        # The new sources, real positions [n_dst, n_dst + n_new), go to [P_l, P_l + n_new).
        tl.store(positions_ptr + n_dst + at, dst_rows + at, mask=at < n_new)
        # Edge slots: a real edge's source through the positions (a new source's computed,
        # not read: this launch writes it), a padding edge's its sink's row.
        real = at < nnz
        src = tl.load(block_indices_ptr + at, mask=real, other=0).to(tl.int64)
        below = real & (src < n_dst)
        mapped = tl.where(
            below, tl.load(positions_ptr + src, mask=below, other=0), dst_rows + src - n_dst
        )
        sink_source = first_sink + at // sink_edges
        tl.store(indices_ptr + at, tl.where(real, mapped, sink_source), mask=at < edges)
        # Rows [0, first_sink]: the first real row at or after q (a binary search of the real
        # rows' increasing positions, searchsorted's left side), then its start; sinks
        # (first_sink, dst_rows): sink j = q - first_sink starts at max(nnz, j c_l).
        row = at < dst_rows
        searched = row & (at <= first_sink)
        lo = tl.zeros((BLOCK,), tl.int64)
        hi = tl.where(searched, n_dst, lo)
        for _ in range(search_steps):
            active = lo < hi
            mid = (lo + hi) // 2
            before = active & (tl.load(positions_ptr + mid, mask=active, other=0) < at)
            lo = tl.where(before, mid + 1, lo)
            hi = tl.where(active & ~before, mid, hi)
        start = tl.load(block_indptr_ptr + lo, mask=searched, other=0).to(tl.int64)
        sink_start = tl.maximum((at - first_sink) * sink_edges, nnz)
        tl.store(indptr_ptr + at, tl.where(searched, start, sink_start), mask=row)

    # The input rows to their positions and the labels (module docstring, 2): rows
    # [pid ROWS, (pid + 1) ROWS) of x_in to rows positions[i] of x, whole rows in BLOCK_F
    # column tiles; labels[i] = labels_in[i] for i < n_labels. Reads positions[:n_rows], all
    # written before this launch; each output element from one lane.
    @triton.jit(do_not_specialize=["n_rows", "n_labels"])
    def _rows_kernel(
        x_ptr, x_in_ptr, positions_ptr, labels_ptr, labels_in_ptr,
        n_rows, n_labels, feat, x_row_stride, in_row_stride, in_col_stride, labels_in_stride,
        ROWS: tl.constexpr, BLOCK_F: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        live = rows < n_rows
        to = tl.load(positions_ptr + rows, mask=live, other=0)
        for f0 in range(0, feat, BLOCK_F):
            cols = f0 + tl.arange(0, BLOCK_F).to(tl.int64)
            inside = live[:, None] & (cols < feat)[None, :]
            read = x_in_ptr + rows[:, None] * in_row_stride + cols[None, :] * in_col_stride
            values = tl.load(read, mask=inside, other=0)
            tl.store(x_ptr + to[:, None] * x_row_stride + cols[None, :], values, mask=inside)
        seed = rows < n_labels
        label = tl.load(labels_in_ptr + rows * labels_in_stride, mask=seed, other=0)
        tl.store(labels_ptr + rows, label, mask=seed)


def launches(num_layers: int) -> int:
    """The launches of one refill of ``num_layers`` layers: :func:`fill_layer` per layer,
    then :func:`fill_rows`."""
    return num_layers + 1


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """Launch on ``device``'s GPU (a no-op on the CPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def fill_layer(
    positions: torch.Tensor,
    block_indptr: torch.Tensor,
    block_indices: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    *,
    n_dst: int,
    n_src: int,
    dst_rows: int,
    first_sink: int,
    sink_edges: int,
) -> None:
    """One layer of the refill in one launch (module docstring, 1), after every layer above
    it.

    Args:
        positions: int64[input_rows], contiguous: read at ``[:n_dst]`` (the layers above
            written), written at ``[n_dst, n_src)``.
        block_indptr: int64[n_dst + 1], the real block's row pointers (stride 1).
        block_indices: int64[nnz], the real block's sources in ``[0, n_src)`` (stride 1).
        indptr: int64[dst_rows + 1], contiguous, written at ``[:dst_rows]``.
        indices: int64[E_l], contiguous, written whole.
        n_dst, n_src: the real block's sizes (host ints).
        dst_rows, first_sink, sink_edges: the layout's ``P_l``, ``P_l - R_l`` and ``c_l``.

    Raises:
        ValueError: the block's index tensors are not of stride 1.
        RuntimeError: Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")
    for name, t in (("indptr", block_indptr), ("indices", block_indices)):
        if t.dim() != 1 or (t.shape[0] > 1 and t.stride(0) != 1):
            raise ValueError(f"the block's {name} must be a 1-d tensor of stride 1")
    nnz, edges = int(block_indices.shape[0]), int(indices.shape[0])
    grid = (triton.cdiv(max(edges, dst_rows), BLOCK),)
    with _on(positions.device):
        _layer_kernel[grid](
            positions, block_indptr, block_indices, indptr, indices,
            n_dst, n_src - n_dst, nnz, n_dst.bit_length(), dst_rows, first_sink, edges,
            sink_edges, BLOCK=BLOCK,
        )  # fmt: skip


def fill_rows(
    x: torch.Tensor,
    x_in: torch.Tensor,
    positions: torch.Tensor,
    labels: torch.Tensor,
    labels_in: torch.Tensor,
) -> None:
    """The input rows and the labels in one launch (module docstring, 2), after every layer.

    Args:
        x: [input_rows, F], row-major (stride 1 along F): ``x[positions[i]] = x_in[i]``.
        x_in: [n_src_0, F] (any strides), ``x``'s dtype.
        positions: int64[input_rows], contiguous, its first ``n_src_0`` written.
        labels: int64[n_seeds], contiguous: ``labels[:] = labels_in``.
        labels_in: [n_seeds] (any stride).

    Raises:
        RuntimeError: Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")
    n_rows, feat = int(x_in.shape[0]), int(x_in.shape[1])
    block_f = min(MAX_BLOCK_F, triton.next_power_of_2(max(feat, 1)))
    rows = TILE // block_f
    grid = (triton.cdiv(max(n_rows, int(labels.shape[0]), 1), rows),)
    with _on(x.device):
        _rows_kernel[grid](
            x, x_in, positions, labels, labels_in,
            n_rows, int(labels.shape[0]), feat, x.stride(0), x_in.stride(0), x_in.stride(1),
            labels_in.stride(0), ROWS=rows, BLOCK_F=block_f,
        )  # fmt: skip
