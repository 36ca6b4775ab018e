"""Fused-Map's hash-table pass as a Triton kernel (FastGL, Algorithm 2, made deterministic).

One program inserts ``BLOCK`` keys into an open-addressing table (``table_keys:
int64[capacity]``, empty slots hold :data:`EMPTY`): each lane hashes its key, then walks the
table by linear probing; ``atomic_cas(slot, EMPTY, key)`` either claims an empty slot or
returns the key already there. A lane reads the slot before it: a slot changes once, from
:data:`EMPTY` to its key, so a key read there is final, and the many copies of one key (a
hub's, the one-read sampler's unused rows') find their slot without an atomic on that
address, which would serialise them. Once a lane has found its key's slot it records the
slot (``slot_of[i]``) and atomically lowers ``table_pos[slot]`` to its input position ``i``
(where the position there is higher: positions only fall), so
after the single pass ``table_pos`` holds every key's first appearance and
``table_pos[slot_of[i]] == i`` says whether ``i`` is one. FastGL numbers the keys with an
atomic counter inside the same kernel, which gives a different numbering on every run; the
first-appearance record lets :meth:`distmb.pipeline.sample.idmap.PendingMap.finish` number
them in input order instead, exactly as the C++ sampler does.

:func:`triton_groups` is the grouping of :func:`distmb.pipeline.sample.idmap.start_map`;
:func:`insert_keys`, the launch alone into a table the caller allocated, is also the first of
the one-read sampler's four Fused-Map launches (:mod:`distmb.pipeline.sample.relabel_triton`,
which numbers the keys in Triton kernels too, from ``table_pos``).

Runs on CUDA tensors, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``
set before Triton is imported), which is how CI tests it.
"""

from __future__ import annotations

import contextlib
import os

import torch

try:  # optional dependency: pip install 'distmb[triton]'
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is not installed
    triton = None
    tl = None

#: Key of an empty slot (keys are non-negative ids).
EMPTY = -1
#: Position stored in a slot no key has reached (above every input position).
NO_POSITION = torch.iinfo(torch.int64).max
#: Keys per Triton program.
BLOCK = 256
#: Default table size in keys: capacity is the smallest power of two >= LOAD_INVERSE * m,
#: i.e. the table is at most half full and a probe sequence is short.
LOAD_INVERSE = 2
#: Fibonacci hashing multiplier (2^64 / golden ratio), as used by splitmix64.
HASH_MULTIPLIER = 0x9E3779B97F4A7C15


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def usable(device: torch.device) -> tuple[bool, str]:
    """Whether the Triton back end can run on ``device``, and if not, why."""
    if triton is None:
        return False, "Triton is not installed (pip install 'distmb[triton]')"
    if device.type == "cuda":
        return True, ""
    if device.type == "cpu" and interpreting():
        return True, ""
    return False, (
        f"Triton kernels run on CUDA tensors, or on CPU tensors only under its interpreter "
        f"(TRITON_INTERPRET=1 set before Triton is imported); got a {device.type} tensor"
    )


def table_capacity(m: int, capacity: int | None = None) -> int:
    """Slots of the hash table for ``m`` keys: ``capacity`` checked, or the default.

    Raises:
        ValueError: ``capacity`` not a power of two, or below ``m`` (probing could then
            find no free slot).
    """
    if capacity is None:
        return 1 << max(1, (LOAD_INVERSE * m - 1).bit_length())
    if capacity < max(m, 1) or capacity & (capacity - 1):
        raise ValueError(f"hash table capacity {capacity}: expected a power of two >= the {m} keys")
    return capacity


if triton is not None:
    # Globals a compiled kernel reads must be constexpr.
    _EMPTY = tl.constexpr(EMPTY)
    _HASH_MULTIPLIER = tl.constexpr(HASH_MULTIPLIER)

    # m and mask are never compile-time constants: Triton would otherwise specialise a
    # value of 1 (one key, a 2-slot table) into a constexpr.
    @triton.jit(do_not_specialize=["m", "mask"])
    def _insert_kernel(
        keys_ptr, m, table_keys_ptr, table_pos_ptr, slot_of_ptr, mask, BLOCK: tl.constexpr
    ):
        """Insert keys[pid*BLOCK ...] (contract in the module docstring). ``mask`` is
        capacity - 1; a lane probes at most capacity slots."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        valid = offs < m
        key = tl.load(keys_ptr + offs, mask=valid, other=_EMPTY)
        h = key.to(tl.uint64, bitcast=True) * _HASH_MULTIPLIER
        h = h ^ (h >> 32)
        slot = (h & mask.to(tl.uint64)).to(tl.int64)
        active = valid
        probes = 0
        spread = offs & mask.to(tl.int64)  # a slot of its own per lane of the launch
        while (tl.max(active.to(tl.int32), axis=0) > 0) & (probes <= mask):
            # Read first: a slot changes once, from _EMPTY to its key, so a key read there
            # is final. Repeated keys (a hub's, the unused rows' dst[0]) then find their slot
            # without an atomic on it; only lanes that read _EMPTY claim it.
            held = tl.load(table_keys_ptr + slot, mask=active, other=_EMPTY)
            claim = active & (held == _EMPTY)
            # Every lane runs the CAS (it takes no mask); the others swap _EMPTY for _EMPTY
            # (no effect whatever the slot holds) on their own slot, not on a shared one.
            prev = tl.atomic_cas(
                table_keys_ptr + tl.where(claim, slot, spread),
                tl.full((BLOCK,), _EMPTY, tl.int64),
                tl.where(claim, key, _EMPTY),
            )
            found = (active & (held == key)) | (claim & ((prev == _EMPTY) | (prev == key)))
            # Lower the first position only where this one is lower than what is there
            # (positions only fall, so a stale read costs an atomic, never a wrong value).
            first = tl.load(table_pos_ptr + slot, mask=found, other=-1)
            tl.atomic_min(table_pos_ptr + slot, offs, mask=found & (offs < first))
            tl.store(slot_of_ptr + offs, slot, mask=found)
            active = active & ~found
            slot = tl.where(active, (slot + 1) & mask, slot)
            probes += 1


def triton_groups(
    keys: torch.Tensor, capacity: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Group ``keys`` (int64[m] >= 0, on CUDA or under the interpreter) in one hash-table
    pass: (slot int64[m] in ``[0, capacity)``, first bool[m], capacity).

    Raises:
        ValueError: a bad ``capacity`` (see :func:`table_capacity`).
        RuntimeError: Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")
    m = int(keys.shape[0])
    cap = table_capacity(m, capacity)
    device = keys.device
    table_keys = torch.full((cap,), EMPTY, dtype=torch.int64, device=device)
    table_pos = torch.full((cap,), NO_POSITION, dtype=torch.int64, device=device)
    slot_of = torch.zeros(m, dtype=torch.int64, device=device)
    insert_keys(keys, table_keys, table_pos, slot_of)
    first = table_pos[slot_of] == torch.arange(m, dtype=torch.int64, device=device)
    return slot_of, first, cap


def insert_keys(
    keys: torch.Tensor,
    table_keys: torch.Tensor,
    table_pos: torch.Tensor,
    slot_of: torch.Tensor | None = None,
) -> torch.Tensor:
    """Insert ``keys`` (int64[m], on CUDA or under the interpreter) into the table
    ``table_keys``, ``table_pos`` (int64[capacity] each, a power of two ``>= m``, filled
    with :data:`EMPTY` and :data:`NO_POSITION`, or holding earlier inserts) in one launch
    (module docstring); returns ``slot_of``: int64[m], every key's slot (written into
    ``slot_of`` when given, else into a new tensor). The capacity is not checked here
    (:func:`table_capacity`)."""
    m, device = int(keys.shape[0]), keys.device
    if slot_of is None:
        slot_of = torch.empty(m, dtype=torch.int64, device=device)
    if m:
        grid = (triton.cdiv(m, BLOCK),)
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            _insert_kernel[grid](
                keys.contiguous(), m, table_keys, table_pos, slot_of,
                int(table_keys.shape[0]) - 1, BLOCK=BLOCK,
            )  # fmt: skip
    return slot_of
