"""The device feature cache's one-pass gather as a Triton kernel: cached rows and host rows
together, in sorted id order, with no host synchronisation.

Input: ``sorted_ids: int64[n]`` (ascending, repeats kept: ``torch.sort`` of the requested
ids) and ``perm: int64[n]``, the position in the request of each sorted id (the sort's
indices). Each program handles ``BLOCK_ROWS`` sorted ids and ``BLOCK_COLS`` columns of
their rows: it looks every id up in the cache directory (``slot_of: int32[num_rows]``, the
slot or -1), loads the columns from the cache row where the slot is ``>= 0`` and from the
host row otherwise (two masked loads: a lane reads one of the two, never both), casts them
to float32 and writes them to ``out[perm[i]]``, i.e. back in the requested order. The host
rows are read through :attr:`~distmb.pipeline.features.zero_copy.HostRows.view` (on CUDA a
CUDA tensor aliasing pinned host memory, so the loads cross PCIe: PyTorch-Direct's
zero-copy; the ids are sorted so that neighbouring lanes read neighbouring rows), whose row
stride may be padded to 128 bytes (:func:`~distmb.pipeline.features.zero_copy.aligned_width`):
every host row then starts on a 128-byte boundary, and a program's first column block with
it.

The grid has one program per ``BLOCK_ROWS`` ids unless ``max_programs`` caps it: then each
program loops over row blocks ``pid, pid + programs, ...`` (a grid-stride loop), so that a
gather whose loads wait on PCIe holds only that many programs' worth of the GPU's
multiprocessors, and kernels of other streams (the training step, while the BatchLoader
gathers the next batch) find room beside it. The output is the same whatever the cap.

The programs of the first column block also count, into ``stats: int64[STATS_SIZE]``
(atomic adds, one per program and counter): the hits, the distinct misses (a missed id that
differs from its predecessor in sorted order: the rows read from host memory), the ids
outside ``[0, num_rows)`` and the smallest and largest id seen. The counters therefore stay
on the device until their owner reads them (one read for many gathers).

An id outside ``[0, num_rows)`` reads nothing (both loads are masked off and its address
is clamped to row 0): its output row is NaN and it is counted in ``stats``, for the owner
to raise a clear error when it reads them
(:meth:`distmb.pipeline.features.device.DeviceFeatures.check`).

Runs on CUDA tensors, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``
set before Triton is imported), which is how CI tests it.
"""

from __future__ import annotations

import contextlib

import torch

from distmb.pipeline.sample.idmap_triton import triton

if triton is not None:  # optional dependency: pip install 'distmb[triton]'
    import triton.language as tl

#: Positions in the ``stats`` tensor (int64[:data:`STATS_SIZE`]) the kernel accumulates into.
STAT_HITS = 0
STAT_DISTINCT_MISSES = 1
STAT_OUT_OF_RANGE = 2
STAT_LOW = 3
STAT_HIGH = 4
STATS_SIZE = 5
#: Directory value of a row that is not cached (as in :mod:`distmb.pipeline.features.device`).
NOT_CACHED = -1
#: Values (rows x columns) one program moves.
VALUES_PER_PROGRAM = 4096
#: Widest column block: a wider row is split over several programs.
MAX_BLOCK_COLS = 256

_INT64 = torch.iinfo(torch.int64)


def new_stats(device: torch.device) -> torch.Tensor:
    """int64[STATS_SIZE] on ``device``: counters at zero, the smallest id seen at the int64
    maximum and the largest at the int64 minimum (nothing seen yet)."""
    stats = torch.zeros(STATS_SIZE, dtype=torch.int64, device=device)
    stats[STAT_LOW] = _INT64.max
    stats[STAT_HIGH] = _INT64.min
    return stats


def block_shape(dim: int) -> tuple[int, int]:
    """``(BLOCK_ROWS, BLOCK_COLS)`` for rows of ``dim`` values: the columns rounded up to a
    power of two (at most :data:`MAX_BLOCK_COLS`), and rows to fill
    :data:`VALUES_PER_PROGRAM`."""
    cols = min(triton.next_power_of_2(max(dim, 1)), MAX_BLOCK_COLS)
    return max(1, VALUES_PER_PROGRAM // cols), cols


if triton is not None:
    _NOT_CACHED = tl.constexpr(NOT_CACHED)
    _STAT_HITS = tl.constexpr(STAT_HITS)
    _STAT_DISTINCT_MISSES = tl.constexpr(STAT_DISTINCT_MISSES)
    _STAT_OUT_OF_RANGE = tl.constexpr(STAT_OUT_OF_RANGE)
    _STAT_LOW = tl.constexpr(STAT_LOW)
    _STAT_HIGH = tl.constexpr(STAT_HIGH)

    # n and num_rows are never compile-time constants (n changes with every gather).
    @triton.jit(do_not_specialize=["n", "num_rows"])
    def _gather_kernel(
        sorted_ids_ptr,
        perm_ptr,
        n,
        slot_of_ptr,
        cache_ptr,
        host_ptr,
        host_stride,
        out_ptr,
        dim,
        num_rows,
        stats_ptr,
        HAS_CACHE: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
    ):
        """out[perm[i], cols] = float32(cache[slot] if slot >= 0 else host[id]) for the
        program's sorted positions i (one row block) and columns (contract in the module
        docstring)."""
        _gather_block(
            tl.program_id(0).to(tl.int64) * BLOCK_ROWS, sorted_ids_ptr, perm_ptr, n,
            slot_of_ptr, cache_ptr, host_ptr, host_stride, out_ptr, dim, num_rows, stats_ptr,
            HAS_CACHE, BLOCK_ROWS, BLOCK_COLS,
        )  # fmt: skip

    @triton.jit(do_not_specialize=["n", "num_rows", "row_blocks"])
    def _gather_kernel_looped(
        sorted_ids_ptr,
        perm_ptr,
        n,
        slot_of_ptr,
        cache_ptr,
        host_ptr,
        host_stride,
        out_ptr,
        dim,
        num_rows,
        stats_ptr,
        row_blocks,
        HAS_CACHE: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
    ):
        """:func:`_gather_kernel` for the program's row blocks ``pid`` and every
        ``num_programs(0)``-th after it, below ``row_blocks`` (a capped grid)."""
        # int64 block numbers: row0 may pass 2**31 for a long request.
        first, step = tl.program_id(0).to(tl.int64), tl.num_programs(0).to(tl.int64)
        for block in range(first, row_blocks, step):
            _gather_block(
                block * BLOCK_ROWS, sorted_ids_ptr, perm_ptr, n, slot_of_ptr,
                cache_ptr, host_ptr, host_stride, out_ptr, dim, num_rows, stats_ptr,
                HAS_CACHE, BLOCK_ROWS, BLOCK_COLS,
            )  # fmt: skip

    @triton.jit
    def _gather_block(
        row0,
        sorted_ids_ptr,
        perm_ptr,
        n,
        slot_of_ptr,
        cache_ptr,
        host_ptr,
        host_stride,
        out_ptr,
        dim,
        num_rows,
        stats_ptr,
        HAS_CACHE: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
    ):
        """One row block of the gather: sorted positions ``row0 + [0, BLOCK_ROWS)``, the
        program's column block; counted by the first column block."""
        rows = row0 + tl.arange(0, BLOCK_ROWS)
        live = rows < n
        ids = tl.load(sorted_ids_ptr + rows, mask=live, other=0)
        in_range = live & (ids >= 0) & (ids < num_rows)
        safe_ids = tl.where(in_range, ids, 0)  # an address in the table whatever the id
        if HAS_CACHE:
            slot = tl.load(slot_of_ptr + safe_ids, mask=in_range, other=_NOT_CACHED)
            slot = slot.to(tl.int64)
        else:
            slot = tl.full((BLOCK_ROWS,), _NOT_CACHED, tl.int64)
        hit = in_range & (slot != _NOT_CACHED)
        miss = in_range & (slot == _NOT_CACHED)
        # A slot in the cache whatever the id (NOT_CACHED < 0 clamps to row 0). Not a
        # tl.where on `hit`: Triton 3.6 fails to lay that select out for sm_90 when the host
        # row stride is a multiple of 16 (MLIR: 'arith.select' condition shape).
        safe_slot = tl.maximum(slot, 0)

        cols = tl.program_id(1).to(tl.int64) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        col_ok = cols < dim
        from_cache = tl.load(
            cache_ptr + safe_slot[:, None] * dim + cols[None, :],
            mask=hit[:, None] & col_ok[None, :],
            other=0.0,
        )
        from_host = tl.load(
            host_ptr + safe_ids[:, None] * host_stride + cols[None, :],
            mask=miss[:, None] & col_ok[None, :],
            other=0.0,
        )
        value = tl.where(hit[:, None], from_cache.to(tl.float32), from_host.to(tl.float32))
        value = tl.where(in_range[:, None], value, float("nan"))
        dest = tl.load(perm_ptr + rows, mask=live, other=0)
        tl.store(
            out_ptr + dest[:, None] * dim + cols[None, :],
            value,
            mask=live[:, None] & col_ok[None, :],
        )

        if tl.program_id(1) == 0:
            previous = tl.load(sorted_ids_ptr + rows - 1, mask=live & (rows > 0), other=0)
            distinct = (rows == 0) | (ids != previous)
            first_id = tl.load(sorted_ids_ptr + row0)  # the program's smallest id (live)
            seen = tl.where(live, ids, first_id)
            tl.atomic_add(stats_ptr + _STAT_HITS, tl.sum(hit.to(tl.int64), axis=0))
            tl.atomic_add(
                stats_ptr + _STAT_DISTINCT_MISSES,
                tl.sum((miss & distinct).to(tl.int64), axis=0),
            )
            tl.atomic_add(
                stats_ptr + _STAT_OUT_OF_RANGE,
                tl.sum((live & ~in_range).to(tl.int64), axis=0),
            )
            tl.atomic_min(stats_ptr + _STAT_LOW, tl.min(seen, axis=0))
            tl.atomic_max(stats_ptr + _STAT_HIGH, tl.max(seen, axis=0))


def launch(
    sorted_ids: torch.Tensor,
    perm: torch.Tensor,
    slot_of: torch.Tensor | None,
    cache: torch.Tensor,
    host: torch.Tensor,
    out: torch.Tensor,
    num_rows: int,
    stats: torch.Tensor,
    max_programs: int | None = None,
) -> None:
    """Launch the kernel over ``n = sorted_ids.numel() > 0`` ids (see :func:`gather_rows`
    for the arguments). The one place the kernel is launched: tests that count a gather's
    ops count a launch here as one op (the interpreter copies tensors while it runs)."""
    n, dim = int(sorted_ids.shape[0]), int(out.shape[1])
    block_rows, block_cols = block_shape(dim)
    row_blocks = triton.cdiv(n, block_rows)
    looped = max_programs is not None and max_programs < row_blocks
    # At least one column block: its programs count the ids even when rows have no values.
    grid = (max_programs if looped else row_blocks, max(1, triton.cdiv(dim, block_cols)))
    kernel = _gather_kernel_looped if looped else _gather_kernel
    device = out.device
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        kernel[grid](
            sorted_ids,
            perm,
            n,
            slot_of if slot_of is not None else sorted_ids,  # unread without a cache
            cache if slot_of is not None else host,  # unread without a cache
            host,
            host.stride(0),
            out,
            dim,
            num_rows,
            stats,
            *((row_blocks,) if looped else ()),
            HAS_CACHE=slot_of is not None,
            BLOCK_ROWS=block_rows,
            BLOCK_COLS=block_cols,
        )


def gather_rows(
    sorted_ids: torch.Tensor,
    perm: torch.Tensor,
    slot_of: torch.Tensor | None,
    cache: torch.Tensor,
    host: torch.Tensor,
    num_rows: int,
    stats: torch.Tensor,
    max_programs: int | None = None,
) -> torch.Tensor:
    """float32[n, dim] on ``host``'s device: ``out[perm[i]]`` is the row of
    ``sorted_ids[i]``, from ``cache`` where ``slot_of`` has a slot, else from ``host``
    (NaN for an id outside ``[0, num_rows)``, counted in ``stats``).

    Args:
        sorted_ids: int64[n], ascending (repeats allowed), contiguous.
        perm: int64[n], a permutation of ``range(n)``: where each sorted id goes.
        slot_of: int32[num_rows], the cache slot of each row or -1; None: no cache.
        cache: [capacity, dim] contiguous, the cached rows (the host table's dtype).
        host: [num_rows, dim], unit column stride, any row stride (the padded host rows).
        num_rows: the table's rows.
        stats: int64[STATS_SIZE] (:func:`new_stats`), accumulated into.
        max_programs: at most this many programs per column block, each looping over row
            blocks (module docstring); None: one program per row block.

    Raises:
        RuntimeError: Triton is not installed.
        ValueError: ``max_programs`` below 1.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")
    if max_programs is not None and max_programs < 1:
        raise ValueError(f"gather_rows: max_programs must be >= 1, got {max_programs}")
    n, dim = int(sorted_ids.shape[0]), int(host.shape[1])
    out = torch.empty((n, dim), dtype=torch.float32, device=host.device)
    if n:
        if host.stride(1) != 1 or (slot_of is not None and not cache.is_contiguous()):
            raise ValueError("gather_rows: host rows need unit column stride, cache contiguous")
        launch(sorted_ids, perm, slot_of, cache, host, out, num_rows, stats, max_programs)
    return out
