"""Fused-Map and the CSR of one bounded sampler layer in four Triton launches, no host read.

Input: a layer's keys as :func:`~distmb.pipeline.sample.choose_triton.choose_layer` lays them
out, ``keys: int64[m]`` with ``m = d x (1 + fanout)``: the ``d`` rows' keys (the first
``n_dst`` of them the destinations, ``n_dst`` a host int or an int64 device scalar), then
``fanout`` slots a row, of which row ``r``'s first ``count[r]`` are its sampled neighbours;
and an empty hash table (``table_keys`` filled with
:data:`~distmb.pipeline.sample.idmap_triton.EMPTY`, ``table_pos`` with
:data:`~distmb.pipeline.sample.idmap_triton.NO_POSITION`). Output, all on the device: the
block's ``src_ids`` (destinations, then the new solid sources in order of first appearance,
then the new halo sources, ``key >= n_solid``: Fused-Map's numbering,
:mod:`distmb.pipeline.sample.idmap`), its ``indptr`` and ``indices`` (the valid slots' source
positions in CSR order), the first-occurrence flags, and a row of counts (:data:`STATS`).
With ``fanout = 0`` (``m = d``) it is a plain Fused-Map: every key is a row, rows of no slot.

The launches, each a grid of programs over ``block`` consecutive keys (:data:`BLOCK`) unless
said otherwise:

1. the hash-table insert (:func:`~distmb.pipeline.sample.idmap_triton.insert_keys`): every
   key's slot, and per slot the smallest position that holds its key;
2. ``_count_kernel``: per key, ``first = table_pos[slot] == position``; a first occurrence
   past the destinations is a new solid or new halo source, numbered within its program by
   an in-program prefix sum (its rank); per program the counts of new solid and new halo
   sources, repeated destinations, negative keys, destinations outside ``[0, n_solid)`` and
   the edges of the rows at its positions (rows are the first ``d`` positions), and per row
   its edge count's in-program prefix sum. A first occurrence writes its group's **code**
   into the table's key column, which the insert no longer needs: its class (destination,
   new solid, new halo) and where it is numbered (its position, or its program and rank);
3. ``_scan_kernel``, one program: exclusive prefix sums of the per-program new-solid,
   new-halo and edge counts (written over them, in passes of :data:`SCAN_CHUNK`), and the
   layer's counts;
4. ``_relabel_kernel``: every key's source position, decoded from its group's code and the
   offsets of the program that numbered it (so no key waits for another key's result, and
   there is no fifth launch); first occurrences write ``src_ids``, rows their ``indptr``
   entry, valid slots their ``indices`` entry at ``indptr[row] + slot``.

The tables start empty: :func:`empty_tables` fills every layer's table of a batch in one
launch (``_fill_tables_kernel``), where two ``torch.full`` a layer would take six launches
for three layers.

**Determinism, and what only a GPU shows.** Every count is an integer sum of per-program
partial sums, added in program order by one program: no atomic counter. The only atomics are
the insert's (compare-and-swap and min on its table), whose outcome (slots aside) does not
depend on their order; every other kernel reads only what an earlier launch wrote (stream
order) and writes each output element from one lane. Under the interpreter the programs of a
launch run one after another; on a GPU they run at once, which
``tests/test_relabel_triton.py`` checks with ``pytest -m cuda`` (a million keys, thousands of
programs, against the reference and run twice). The numbering and the blocks are the
per-layer path's (``tests/test_relabel_triton.py`` against a numpy reference,
``tests/test_sampler_one_read.py`` against the per-layer path).

Runs on CUDA tensors, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``
set before Triton is imported), which is how CI tests it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from distmb.pipeline.sample.idmap import DestinationCount
from distmb.pipeline.sample.idmap_triton import EMPTY, NO_POSITION, insert_keys, table_capacity
from distmb.pipeline.sample.idmap_triton import triton as _triton

if _triton is not None:
    import triton
    import triton.language as tl

#: Keys per program of the count and relabel kernels (the in-program prefix sums' length).
BLOCK = 1024
#: Per-program partial sums the scan reads per pass of its one program.
SCAN_CHUNK = 1024

#: The layer's counts (``stats: int64[STATS_WIDTH]``), by index: new solid sources, new halo
#: sources, repeated destinations, negative keys (the four of
#: :attr:`~distmb.pipeline.sample.idmap.PendingMap.counts`, in its order), then
#: ``n_dst + new solid`` (the next layer's destination count), the block's edges, the
#: destinations outside ``[0, n_solid)`` (a bad seed, in the top layer), and ``n_next``:
#: ``min(n_computed, next_bound)``, the rows the layer below samples when it has room for
#: ``next_bound`` (:func:`relabel_layer`; ``n_computed`` where nothing caps it).
STATS = (
    "new_solid", "new_halo", "repeated", "negative", "n_computed", "edges", "bad_dst", "n_next"
)  # fmt: skip
STATS_WIDTH = len(STATS)
NEW_SOLID, NEW_HALO, REPEATED, NEGATIVE, N_COMPUTED, EDGES, BAD_DST, N_NEXT = range(STATS_WIDTH)
#: Per-program partial sums of the count kernel (columns): the exclusive prefix sums of the
#: first three replace them after the scan.
PARTIALS = ("new_solid", "new_halo", "edges", "repeated", "negative", "bad_dst")
PARTIALS_WIDTH = len(PARTIALS)
P_NEW_SOLID, P_NEW_HALO, P_EDGES, P_REPEATED, P_NEGATIVE, P_BAD_DST = range(PARTIALS_WIDTH)

#: A group code's class (its low :data:`CODE_CLASS_BITS` bits): the group's first occurrence
#: is a destination (the code's high bits: its position), a new solid or a new halo source
#: (high bits: ``program x block + rank``, its rank among its program's new sources of its
#: class, from 0).
CODE_DST, CODE_SOLID, CODE_HALO = 0, 1, 2
CODE_CLASS_BITS = 2


@dataclass
class RelabeledLayer:
    """One layer mapped by :func:`relabel_layer` (``m`` keys, ``d`` rows of ``fanout``
    slots), nothing read on the host.

    Attributes:
        src_ids: int64[m + 1], the block's sources in their first ``n_src`` entries
            (``n_dst + new solid + new halo``), the rest unspecified.
        indptr: int64[d + 1], the block's CSR row pointers: ``0``, then the prefix sums
            of ``count``.
        indices: int64[d x fanout + 1], the valid slots' source positions in their first
            ``edges`` entries, the rest unspecified.
        first: bool[m], each key's first occurrence.
        stats: int64[STATS_WIDTH], the layer's counts (:data:`STATS`).
    """

    src_ids: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    first: torch.Tensor
    stats: torch.Tensor


if _triton is not None:
    # Globals a compiled kernel reads must be constexpr.
    _W = tl.constexpr(PARTIALS_WIDTH)
    _P_SOLID, _P_HALO, _P_EDGES = (
        tl.constexpr(P_NEW_SOLID),
        tl.constexpr(P_NEW_HALO),
        tl.constexpr(P_EDGES),
    )
    _P_REPEATED, _P_NEGATIVE = tl.constexpr(P_REPEATED), tl.constexpr(P_NEGATIVE)
    _P_BAD = tl.constexpr(P_BAD_DST)
    _S_SOLID, _S_HALO = tl.constexpr(NEW_SOLID), tl.constexpr(NEW_HALO)
    _S_REPEATED, _S_NEGATIVE = tl.constexpr(REPEATED), tl.constexpr(NEGATIVE)
    _S_COMPUTED, _S_EDGES = tl.constexpr(N_COMPUTED), tl.constexpr(EDGES)
    _S_BAD, _S_NEXT = tl.constexpr(BAD_DST), tl.constexpr(N_NEXT)
    _EMPTY, _NO_POSITION = tl.constexpr(EMPTY), tl.constexpr(NO_POSITION)
    _DST, _SOLID, _HALO = tl.constexpr(CODE_DST), tl.constexpr(CODE_SOLID), tl.constexpr(CODE_HALO)
    _CLASS_BITS = tl.constexpr(CODE_CLASS_BITS)
    _CLASS_MASK = tl.constexpr((1 << CODE_CLASS_BITS) - 1)

    @triton.jit(do_not_specialize=["capacity"])
    def _fill_tables_kernel(tables_ptr, capacity, BLOCK: tl.constexpr):
        """``tables``: int64[2 x capacity], the keys' slots (filled with EMPTY), then the
        first positions' (filled with NO_POSITION); BLOCK slots of each per program."""
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = at < capacity
        tl.store(tables_ptr + at, tl.full((BLOCK,), _EMPTY, tl.int64), mask=inside)
        tl.store(tables_ptr + capacity + at, tl.full((BLOCK,), _NO_POSITION, tl.int64), mask=inside)

    @triton.jit
    def _destinations(n_dst_ptr, n_dst, ON_DEVICE: tl.constexpr):
        """The destination count: ``*n_dst_ptr`` (a device scalar) or ``n_dst``."""
        if ON_DEVICE:
            return tl.load(n_dst_ptr).to(tl.int64)
        else:
            return n_dst.to(tl.int64)

    # Sizes are never compile-time constants: Triton would otherwise specialise a value of 1
    # into a constexpr (and recompile).
    @triton.jit(do_not_specialize=["n_dst", "m", "d", "n_solid"])
    def _count_kernel(
        keys_ptr, slot_of_ptr, table_pos_ptr, code_ptr, count_ptr, first_ptr, row_end_ptr,
        partials_ptr, n_dst_ptr, n_dst, m, d, n_solid,
        BLOCK: tl.constexpr, DST_ON_DEVICE: tl.constexpr,
    ):  # fmt: skip
        """Positions [pid*BLOCK, pid*BLOCK + BLOCK): writes ``first``, the codes of the
        first occurrences (``code[slot]``), ``row_end[r]`` (row ``r``'s count summed over
        the program's rows up to ``r``, inclusive) and the program's row of ``partials``
        (module docstring, step 2)."""
        pid = tl.program_id(0).to(tl.int64)
        i = pid * BLOCK + tl.arange(0, BLOCK)
        live = i < m
        key = tl.load(keys_ptr + i, mask=live, other=0)
        slot = tl.load(slot_of_ptr + i, mask=live, other=0)
        first = live & (tl.load(table_pos_ptr + slot, mask=live, other=-1) == i)
        tl.store(first_ptr + i, first, mask=live)
        is_dst = live & (i < _destinations(n_dst_ptr, n_dst, DST_ON_DEVICE))
        new = first & ~is_dst
        solid = key < n_solid
        new_solid, new_halo = new & solid, new & ~solid
        rank_solid = tl.cumsum(new_solid.to(tl.int64), axis=0) - 1
        rank_halo = tl.cumsum(new_halo.to(tl.int64), axis=0) - 1
        at = tl.where(
            new_solid, pid * BLOCK + rank_solid, tl.where(new_halo, pid * BLOCK + rank_halo, i)
        )
        kind = tl.where(new_solid, _SOLID, tl.where(new_halo, _HALO, _DST)).to(tl.int64)
        tl.store(code_ptr + slot, (at << _CLASS_BITS) | kind, mask=first)
        is_row = live & (i < d)
        count = tl.load(count_ptr + i, mask=is_row, other=0)
        tl.store(row_end_ptr + i, tl.cumsum(count, axis=0), mask=is_row)
        bad = is_dst & ((key < 0) | (key >= n_solid))
        row = partials_ptr + pid * _W
        tl.store(row + _P_SOLID, tl.sum(new_solid.to(tl.int64), axis=0))
        tl.store(row + _P_HALO, tl.sum(new_halo.to(tl.int64), axis=0))
        tl.store(row + _P_EDGES, tl.sum(count, axis=0))
        tl.store(row + _P_REPEATED, tl.sum((is_dst & ~first).to(tl.int64), axis=0))
        tl.store(row + _P_NEGATIVE, tl.sum((live & (key < 0)).to(tl.int64), axis=0))
        tl.store(row + _P_BAD, tl.sum(bad.to(tl.int64), axis=0))

    @triton.jit(do_not_specialize=["n_dst", "n_programs", "next_bound"])
    def _scan_kernel(
        partials_ptr, stats_ptr, indptr_ptr, n_dst_ptr, n_dst, n_programs, next_bound,
        CHUNK: tl.constexpr, DST_ON_DEVICE: tl.constexpr,
    ):  # fmt: skip
        """One program: the new-solid, new-halo and edge columns of ``partials``
        (int64[n_programs, PARTIALS_WIDTH]) replaced by their exclusive prefix sums in
        program order; the totals into ``stats``, ``n_next`` capped at ``next_bound``;
        ``indptr[0] = 0``."""
        solid = tl.zeros((), tl.int64)
        halo = tl.zeros((), tl.int64)
        edges = tl.zeros((), tl.int64)
        repeated = tl.zeros((), tl.int64)
        negative = tl.zeros((), tl.int64)
        bad = tl.zeros((), tl.int64)
        for start in range(0, n_programs, CHUNK):
            p = start + tl.arange(0, CHUNK).to(tl.int64)
            ok = p < n_programs
            row = partials_ptr + p * _W
            part = tl.load(row + _P_SOLID, mask=ok, other=0)
            tl.store(row + _P_SOLID, solid + tl.cumsum(part, axis=0) - part, mask=ok)
            solid += tl.sum(part, axis=0)
            part = tl.load(row + _P_HALO, mask=ok, other=0)
            tl.store(row + _P_HALO, halo + tl.cumsum(part, axis=0) - part, mask=ok)
            halo += tl.sum(part, axis=0)
            part = tl.load(row + _P_EDGES, mask=ok, other=0)
            tl.store(row + _P_EDGES, edges + tl.cumsum(part, axis=0) - part, mask=ok)
            edges += tl.sum(part, axis=0)
            repeated += tl.sum(tl.load(row + _P_REPEATED, mask=ok, other=0), axis=0)
            negative += tl.sum(tl.load(row + _P_NEGATIVE, mask=ok, other=0), axis=0)
            bad += tl.sum(tl.load(row + _P_BAD, mask=ok, other=0), axis=0)
        tl.store(stats_ptr + _S_SOLID, solid)
        tl.store(stats_ptr + _S_HALO, halo)
        tl.store(stats_ptr + _S_REPEATED, repeated)
        tl.store(stats_ptr + _S_NEGATIVE, negative)
        computed = _destinations(n_dst_ptr, n_dst, DST_ON_DEVICE) + solid
        tl.store(stats_ptr + _S_COMPUTED, computed)
        tl.store(stats_ptr + _S_NEXT, tl.minimum(computed, next_bound))
        tl.store(stats_ptr + _S_EDGES, edges)
        tl.store(stats_ptr + _S_BAD, bad)
        tl.store(indptr_ptr, tl.zeros((), tl.int64))

    @triton.jit(do_not_specialize=["n_dst", "m", "d", "fanout"])
    def _relabel_kernel(
        keys_ptr, slot_of_ptr, code_ptr, first_ptr, count_ptr, row_end_ptr, offsets_ptr,
        stats_ptr, src_ids_ptr, indptr_ptr, indices_ptr, n_dst_ptr, n_dst, m, d, fanout,
        BLOCK: tl.constexpr, DST_ON_DEVICE: tl.constexpr,
    ):  # fmt: skip
        """Positions [pid*BLOCK, pid*BLOCK + BLOCK), with ``offsets`` the scanned
        ``partials``: every key's source position from its group's code; writes
        ``src_ids[local] = key`` for first occurrences, ``indptr[r + 1]`` for rows, and
        ``indices[indptr[row] + s] = local`` for the valid slots (module docstring,
        step 4)."""
        pid = tl.program_id(0).to(tl.int64)
        i = pid * BLOCK + tl.arange(0, BLOCK)
        live = i < m
        slot = tl.load(slot_of_ptr + i, mask=live, other=0)
        code = tl.load(code_ptr + slot, mask=live, other=0)
        kind = code & _CLASS_MASK
        at = code >> _CLASS_BITS
        program, rank = at // BLOCK, at % BLOCK
        solid_from = tl.load(
            offsets_ptr + program * _W + _P_SOLID, mask=live & (kind == _SOLID), other=0
        )
        halo_from = tl.load(
            offsets_ptr + program * _W + _P_HALO, mask=live & (kind == _HALO), other=0
        )
        n_dst_here = _destinations(n_dst_ptr, n_dst, DST_ON_DEVICE)
        n_computed = tl.load(stats_ptr + _S_COMPUTED)
        local = tl.where(
            kind == _DST,
            at,
            tl.where(kind == _SOLID, n_dst_here + solid_from, n_computed + halo_from) + rank,
        )
        first = tl.load(first_ptr + i, mask=live, other=0) != 0
        key = tl.load(keys_ptr + i, mask=first, other=0)
        tl.store(src_ids_ptr + local, key, mask=first)
        # Rows: the first d positions, this program's rows.
        is_row = live & (i < d)
        row_from = tl.load(offsets_ptr + pid * _W + _P_EDGES)
        row_end = tl.load(row_end_ptr + i, mask=is_row, other=0)
        tl.store(indptr_ptr + i + 1, row_from + row_end, mask=is_row)
        # Slots: row r's slot s at position d + r * fanout + s, valid when s < count[r].
        is_slot = live & (i >= d)
        at_slot = tl.where(is_slot, i - d, 0)
        r = at_slot // tl.maximum(fanout, 1)
        s = at_slot - r * fanout
        count = tl.load(count_ptr + r, mask=is_slot, other=0)
        valid = is_slot & (s < count)
        start = (
            tl.load(offsets_ptr + (r // BLOCK) * _W + _P_EDGES, mask=valid, other=0)
            + tl.load(row_end_ptr + r, mask=valid, other=0)
            - count
        )
        tl.store(indices_ptr + start + s, local, mask=valid)


#: A layer's hash table, ``(table_keys, table_pos)``: int64[capacity] each, filled with
#: :data:`~distmb.pipeline.sample.idmap_triton.EMPTY` and
#: :data:`~distmb.pipeline.sample.idmap_triton.NO_POSITION`.
Table = tuple[torch.Tensor, torch.Tensor]


def empty_tables(key_counts: Sequence[int], device: torch.device) -> list[Table]:
    """One empty hash table per entry of ``key_counts`` (keys of a layer; each table of
    :func:`~distmb.pipeline.sample.idmap_triton.table_capacity` slots), all cut from one
    buffer filled in one launch (where a table each would take two ``torch.full``).

    Raises:
        RuntimeError: Triton is not installed.
    """
    if _triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")
    capacities = [table_capacity(m) for m in key_counts]
    total = sum(capacities)
    tables = torch.empty(2 * total, dtype=torch.int64, device=device)  # keys, then positions
    if total:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            _fill_tables_kernel[(triton.cdiv(total, BLOCK),)](tables, total, BLOCK=BLOCK)
    out, at = [], 0
    for capacity in capacities:
        pos = total + at
        out.append((tables[at : at + capacity], tables[pos : pos + capacity]))
        at += capacity
    return out


def relabel_layer(
    keys: torch.Tensor,
    count: torch.Tensor,
    fanout: int,
    n_dst: DestinationCount,
    n_solid: int,
    table: Table | None = None,
    stats: torch.Tensor | None = None,
    block: int | None = None,
    scan_chunk: int | None = None,
    next_bound: int | None = None,
) -> RelabeledLayer:
    """Fused-Map and the CSR of one layer in four launches (module docstring; a fifth
    fills the table when none is given).

    Args:
        keys: int64[m], ``m = d x (1 + fanout)``: ``d`` row keys, then ``fanout`` slots a
            row (row ``r``'s at ``d + r x fanout``).
        count: int64[d], row ``r``'s valid slots (its first ``count[r]``, ``<= fanout``).
        fanout: slots a row, ``>= 0`` (0: a plain Fused-Map of ``d`` keys).
        n_dst: the destinations at the front of ``keys``: a host int or an int64 device
            scalar in ``[0, d]`` (not checked, not read).
        n_solid: keys ``>= n_solid`` are halo sources, numbered after the solid ones.
        table: an empty hash table (:data:`Table`, of a capacity that is a power of two
            ``>= m``), contiguous; consumed (its key column holds the group codes
            afterwards). ``None``: one of :func:`~distmb.pipeline.sample.idmap_triton.
            table_capacity` slots allocated here (:func:`empty_tables`).
        stats: int64[STATS_WIDTH] to write the counts to; ``None``: allocated here.
        block, scan_chunk: keys per program, and partial sums per pass of the scan (powers
            of two); ``None``: :data:`BLOCK` and :data:`SCAN_CHUNK`, read at call time (tests
            lower them to run several programs and passes on few keys).
        next_bound: the rows the layer below has room for: ``stats``' ``n_next`` is
            ``min(n_computed, next_bound)`` (``None``: ``m``, which ``n_computed`` never
            exceeds), so that a layer below sized by a bound too small for this batch samples
            a prefix of its rows and never reads past them; the read tells (``n_computed``).

    Returns:
        :class:`RelabeledLayer` on the device of ``keys`` (CUDA, or CPU under the
        interpreter).

    Raises:
        ValueError: bad shapes, dtypes or devices, or a table of the wrong size.
        RuntimeError: Triton is not installed.
    """
    if _triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")
    d, m, device = int(count.shape[0]), int(keys.shape[0]), keys.device
    _check_args(keys, count, fanout, n_dst, d, m)
    block = BLOCK if block is None else block
    scan_chunk = SCAN_CHUNK if scan_chunk is None else scan_chunk
    if table is None:
        (table,) = empty_tables([m], device)
    table_keys, table_pos = table
    _check_table(table_keys, table_pos, m)
    if stats is None:
        stats = torch.empty(STATS_WIDTH, dtype=torch.int64, device=device)
    on_device = isinstance(n_dst, torch.Tensor)
    n_dst_ptr = n_dst if isinstance(n_dst, torch.Tensor) else stats  # never read if a host int
    n_dst_host = 0 if isinstance(n_dst, torch.Tensor) else n_dst
    n_programs = triton.cdiv(m, block)
    first = torch.empty(m, dtype=torch.bool, device=device)
    row_end = torch.empty(d, dtype=torch.int64, device=device)
    partials = torch.empty((n_programs, PARTIALS_WIDTH), dtype=torch.int64, device=device)
    src_ids = torch.empty(m + 1, dtype=torch.int64, device=device)
    indptr = torch.empty(d + 1, dtype=torch.int64, device=device)
    indices = torch.empty(d * fanout + 1, dtype=torch.int64, device=device)
    keys, count = keys.contiguous(), count.contiguous()
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        slot_of = insert_keys(keys, table_keys, table_pos)
        if n_programs:
            _count_kernel[(n_programs,)](
                keys, slot_of, table_pos, table_keys, count, first, row_end, partials,
                n_dst_ptr, n_dst_host, m, d, n_solid, BLOCK=block, DST_ON_DEVICE=on_device,
            )  # fmt: skip
        _scan_kernel[(1,)](
            partials, stats, indptr, n_dst_ptr, n_dst_host, n_programs,
            m if next_bound is None else next_bound, CHUNK=scan_chunk, DST_ON_DEVICE=on_device,
        )  # fmt: skip
        if n_programs:
            _relabel_kernel[(n_programs,)](
                keys, slot_of, table_keys, first, count, row_end, partials, stats, src_ids,
                indptr, indices, n_dst_ptr, n_dst_host, m, d, fanout,
                BLOCK=block, DST_ON_DEVICE=on_device,
            )  # fmt: skip
    return RelabeledLayer(src_ids, indptr, indices, first, stats)


def _check_table(table_keys: torch.Tensor, table_pos: torch.Tensor, m: int) -> None:
    """The hash table's checks (metadata only)."""
    table_capacity(m, int(table_keys.shape[0]))  # a power of two >= m
    for name, t in (("table_keys", table_keys), ("table_pos", table_pos)):
        if t.shape != table_keys.shape or t.dtype != torch.int64 or not t.is_contiguous():
            raise ValueError(
                f"{name} must be a contiguous int64 tensor of {table_keys.shape[0]} slots "
                f"(got {t.dtype}, shape {list(t.shape)})"
            )


def _check_args(
    keys: torch.Tensor, count: torch.Tensor, fanout: int, n_dst: DestinationCount, d: int, m: int
) -> None:
    """The argument checks of :func:`relabel_layer` (metadata only: no device read)."""
    for name, t in (("keys", keys), ("count", count)):
        if t.dim() != 1 or t.dtype != torch.int64:
            raise ValueError(f"{name} must be a 1-D int64 tensor (got {t.dtype}, {t.dim()}-D)")
    if fanout < 0 or m != d * (1 + fanout):
        raise ValueError(f"{m} keys are not {d} rows of 1 + fanout={fanout} keys")
    if count.device != keys.device:
        raise ValueError(f"keys and count must be on one device ({keys.device}, {count.device})")
    if isinstance(n_dst, torch.Tensor):
        if n_dst.dtype != torch.int64 or n_dst.numel() != 1 or n_dst.device != keys.device:
            raise ValueError(
                f"n_dst as a tensor must be one int64 value on the keys' device (got "
                f"{n_dst.dtype}, {n_dst.numel()} elements, on {n_dst.device})"
            )
    elif not 0 <= n_dst <= d:
        raise ValueError(f"n_dst={n_dst} is outside [0, d={d}]")
