"""One bounded sampler layer in one Triton launch: spans, Floyd, sort and gather fused.

For destination rows ``rows`` of a CSR (``indptr``, ``indices``) and a fan-out ``k``, one
program handles :func:`rows_per_program` rows as a ``[rows, SLOTS]`` register tile
(``SLOTS``: ``k`` padded to a power of two, a ``tl.constexpr``). Per row it reads
``start = indptr[row]`` and ``deg = indptr[row + 1] - start`` and writes ``k`` slots of the
bound layout (:meth:`distmb.pipeline.sample.device.DeviceNeighborSampler._layer_bounded`):
the first ``min(deg, k)`` hold the chosen neighbours ``indices[start + position]``,
positions ascending (CSR order), the others ``dst[0]``. A row with ``deg <= k`` takes its
whole row; a row above the fan-out draws a uniform ``k``-subset of ``[0, deg)`` by Floyd's
algorithm (for ``j = deg-k .. deg-1``: ``t`` uniform in ``[0, j]``, take ``t``, or ``j``
when ``t`` was taken), then sorts its picks in registers (a pick's slot is its rank, the
number of smaller picks: they are distinct). Cost: ``O(k^2)`` per row whatever the
degree, so hubs cost no more than other rows.

The same launch also writes the Fused-Map keys' destination prefix (``dst``), the row sizes
``min(deg, k)`` and, optionally, the valid-slot mask, so a layer needs no other op to lay
out its slots (:mod:`distmb.pipeline.sample.device`).

**Rows past a valid count.** Given ``n_valid`` (an int64 device scalar, never read on the
host), only the rows ``i < n_valid`` are sampled; the others, up to the layer's bound
``n_dst``, behave as rows of degree 0 whose key is ``dst[0]``: row size 0, every slot
``dst[0]``, none valid, their own ``dst`` entry never read. Fused-Map has seen ``dst[0]``
at position 0, so they add no source (:mod:`distmb.pipeline.sample.device_batch` samples a
whole mini-batch this way, sized by bounds). Row ids are clamped into ``[0, n_rows)`` before
they index ``indptr``, so that a bad seed (reported by the caller's check) or an unused
entry never becomes an out-of-bounds read.

**Random words** are counter based, a pure function of the key ``(batch seed, layer, row
index within the layer, step)``, so they depend on no launch order, grid or device:

- ``layer_key = hash_chain(batch_seed, layer)`` (:func:`layer_key`, Python ints,
  :mod:`distmb.core.rng`);
- ``state_0 = finalize64(layer_key ^ finalize64(i + GOLDEN))`` for row ``i`` of the layer;
- step ``q`` (``0 <= q < k``) takes ``word_q = finalize64(state_0 + (q + 1) * GOLDEN)``: the
  row's splitmix64 stream seeded with ``state_0``;
- ``t = word_q mod (j + 1)``, all in ``uint64``.

A 64-bit word reduced modulo ``j + 1`` over-weights some residues by at most one count in
``2^64 / (j + 1)``: the bias of any value is below ``(j + 1) / 2^64``, under ``2^-33`` for
any degree below ``2^31`` (the torch path's 62-bit words,
:data:`distmb.pipeline.sample.choose.RANDOM_BOUND`, stay below ``2^-31``).

Runs on CUDA tensors, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``
set before Triton is imported), which is how CI tests it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from distmb.core.rng import GOLDEN, MIX1, MIX2, SHIFT1, SHIFT2, SHIFT3, hash_chain, to_signed
from distmb.pipeline.sample.idmap import resolve_backend
from distmb.pipeline.sample.idmap_triton import triton

if triton is not None:
    import triton.language as tl

#: Bits of a random word (``uint64``, also the layer key's range): reduced modulo ``j + 1``,
#: the bias of any value is below ``(j + 1) / 2^64``, under ``2^-33`` for degrees below
#: ``2^31``.
WORD_BITS = 64
#: Slots of one program's register tile (rows per program = this // SLOTS, at least 1).
TILE_SLOTS = 1024


def resolve_choose(backend: str, device: torch.device) -> str:
    """``"triton"`` or ``"torch"``: the layer kernel for ``backend`` (``"auto"``,
    ``"triton"`` or ``"torch"``) on ``device``, resolved as Fused-Map's back end is.

    Raises:
        ValueError: an unknown back end, or ``"triton"`` where it cannot run.
    """
    return resolve_backend(backend, device, "layer back end")


def layer_key(batch_seed: int, layer: int) -> int:
    """The uint64 key of one layer's random words: ``hash_chain(batch_seed, layer)``."""
    return hash_chain(batch_seed, layer)


def padded_slots(fanout: int) -> int:
    """``fanout`` rounded up to a power of two (the kernel's ``SLOTS``)."""
    return 1 << max(fanout - 1, 0).bit_length()


def rows_per_program(fanout: int) -> int:
    """Rows one program handles: :data:`TILE_SLOTS` slots of register tile."""
    return max(1, TILE_SLOTS // padded_slots(fanout))


@dataclass
class ChosenLayer:
    """One layer's slots, as :func:`choose_layer` writes them.

    Attributes:
        keys: int64[n_dst + n_dst * fanout], the Fused-Map keys: ``dst``, then row ``i``'s
            ``fanout`` slots at ``n_dst + i * fanout``: the first ``count[i]`` its chosen
            neighbours in CSR order, the others ``dst[0]``.
        count: int64[n_dst], ``min(deg, fanout)`` per row.
        valid: bool[n_dst * fanout], slot ``s`` of row ``i`` is valid (``s < count[i]``);
            ``None`` when not asked for.
    """

    keys: torch.Tensor
    count: torch.Tensor
    valid: torch.Tensor | None


if triton is not None:
    # Globals a compiled kernel reads must be constexpr.
    _GOLDEN = tl.constexpr(GOLDEN)
    _MIX1, _MIX2 = tl.constexpr(MIX1), tl.constexpr(MIX2)
    _SHIFT1, _SHIFT2, _SHIFT3 = tl.constexpr(SHIFT1), tl.constexpr(SHIFT2), tl.constexpr(SHIFT3)

    @triton.jit
    def _finalize64(x):
        """splitmix64's finaliser of uint64 ``x`` (wrapping products, logical shifts)."""
        x = (x ^ (x >> _SHIFT1)) * _MIX1
        x = (x ^ (x >> _SHIFT2)) * _MIX2
        return x ^ (x >> _SHIFT3)

    # Sizes and the key are never compile-time constants: Triton would otherwise specialise
    # a value of 1 into a constexpr (and recompile).
    @triton.jit(do_not_specialize=["n_dst", "n_rows", "fanout", "key"])
    def _choose_kernel(
        indptr_ptr,
        indices_ptr,
        rows_ptr,
        dst_ptr,
        keys_ptr,
        count_ptr,
        valid_ptr,
        n_valid_ptr,
        key_ptr,
        n_dst,
        n_rows,
        fanout,
        key,
        ROWS: tl.constexpr,
        SLOTS: tl.constexpr,
        WRITE_VALID: tl.constexpr,
        VALID_COUNT: tl.constexpr,
        KEY_ON_DEVICE: tl.constexpr,
    ):
        """Rows ``[pid*ROWS, pid*ROWS + ROWS)`` of the layer (contract in the module doc);
        with ``VALID_COUNT``, rows at or past ``*n_valid_ptr`` are unused rows; with
        ``KEY_ON_DEVICE`` the key is ``*key_ptr``, not ``key``."""
        i = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # row in the layer
        live = i < n_dst
        if VALID_COUNT:
            used = live & (i < tl.load(n_valid_ptr))
        else:
            used = live
        row = tl.load(rows_ptr + i, mask=used, other=0)
        row = tl.minimum(tl.maximum(row, 0), n_rows - 1)
        start = tl.load(indptr_ptr + row, mask=used, other=0)
        deg = tl.load(indptr_ptr + row + 1, mask=used, other=0) - start
        count = tl.minimum(deg, fanout)
        tl.store(count_ptr + i, count, mask=live)
        first_dst = tl.load(dst_ptr)
        own_dst = tl.load(dst_ptr + i, mask=used, other=0)
        tl.store(keys_ptr + i, tl.where(used, own_dst, first_dst), mask=live)

        col = tl.arange(0, SLOTS).to(tl.int64)[None, :]  # [1, SLOTS]
        # Floyd over [0, deg) for every row (rows with deg <= fanout run it on [0, fanout)
        # and ignore it): step q draws t in [0, j], j = max(deg - fanout, 0) + q.
        if KEY_ON_DEVICE:
            key = tl.load(key_ptr)
        state = _finalize64(
            key.to(tl.int64).to(tl.uint64, bitcast=True)
            ^ _finalize64(i.to(tl.uint64, bitcast=True) + _GOLDEN)
        )
        j = tl.maximum(deg - fanout, 0)
        picks = tl.zeros([ROWS, SLOTS], dtype=tl.int64)
        for q in range(fanout):
            state += _GOLDEN
            t = (_finalize64(state) % (j + 1).to(tl.uint64)).to(tl.int64)
            taken = tl.max(((picks == t[:, None]) & (col < q)).to(tl.int32), axis=1) > 0
            picks = tl.where(col == q, tl.where(taken, j, t)[:, None], picks)
            j += 1
        position = tl.where((deg > fanout)[:, None], picks, col)
        # A pick's slot is its rank among the row's picks (distinct): CSR order.
        rank = tl.zeros([ROWS, SLOTS], dtype=tl.int64)
        for k in range(fanout):
            at_k = tl.sum(tl.where(col == k, position, 0), axis=1)
            rank += (at_k[:, None] < position).to(tl.int64)

        in_tile = live[:, None] & (col < fanout)
        valid = in_tile & (rank < count[:, None])
        neighbour = tl.load(indices_ptr + start[:, None] + position, mask=valid, other=0)
        slot = i[:, None] * fanout + rank
        tl.store(keys_ptr + n_dst + slot, tl.where(valid, neighbour.to(tl.int64), first_dst),
                 mask=in_tile)  # fmt: skip
        if WRITE_VALID:
            tl.store(valid_ptr + slot, valid, mask=in_tile)


def choose_layer(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rows: torch.Tensor,
    dst: torch.Tensor,
    fanout: int,
    key: int | torch.Tensor,
    with_valid: bool = True,
    n_valid: torch.Tensor | None = None,
) -> ChosenLayer:
    """The slots of one bounded layer in one launch (see the module docstring).

    Args:
        indptr: int64[n_rows + 1], CSR row pointers, ``n_rows >= 1``.
        indices: int32 or int64[indptr[-1]], the rows' neighbours.
        rows: int64[n_dst], the rows to sample; ids outside ``[0, n_rows)`` are clamped
            into it (the caller reports bad seeds).
        dst: int64[n_dst], the destinations' ids: the keys' prefix, ``dst[0]`` the padding.
        fanout: slots per row, ``>= 1``.
        key: the layer's uint64 key (:func:`layer_key`), ``[0, 2^64)``; or an int64 tensor
            of one element on the device holding it as a signed word
            (:func:`~distmb.core.rng.to_signed`), read by the kernel, so that a captured
            CUDA graph draws the words of whatever key is written there before a replay
            (:mod:`distmb.pipeline.sample.graphed`). The same key gives the same words
            either way.
        with_valid: also write :attr:`ChosenLayer.valid`.
        n_valid: int64 tensor of one element on the device: only rows ``i < n_valid`` are
            sampled, the others are unused rows (module docstring); ``n_valid >= 1`` when
            ``n_dst >= 1``. ``None``: every row.

    Returns:
        :class:`ChosenLayer` on the device of the inputs (all on one device: CUDA, or CPU
        under the interpreter).

    Raises:
        ValueError: bad dtypes, shapes, devices, ``fanout`` or ``key``.
        RuntimeError: Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("Triton is not installed (pip install 'distmb[triton]')")
    _check_args(indptr, indices, rows, dst, fanout, key, n_valid)
    n_dst, device = int(dst.shape[0]), dst.device
    on_device = isinstance(key, torch.Tensor)
    keys = torch.empty(n_dst * (fanout + 1), dtype=torch.int64, device=device)
    count = torch.empty(n_dst, dtype=torch.int64, device=device)
    valid = torch.empty(n_dst * fanout, dtype=torch.bool, device=device) if with_valid else None
    if n_dst:
        rows_each = rows_per_program(fanout)
        grid = (triton.cdiv(n_dst, rows_each),)
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            _choose_kernel[grid](
                indptr, indices, rows.contiguous(), dst.contiguous(), keys, count,
                count if valid is None else valid,  # never written without WRITE_VALID
                count if n_valid is None else n_valid,  # never read without VALID_COUNT
                key if on_device else count,  # never read without KEY_ON_DEVICE
                n_dst, int(indptr.shape[0]) - 1, fanout, 0 if on_device else to_signed(key),
                ROWS=rows_each, SLOTS=padded_slots(fanout), WRITE_VALID=with_valid,
                VALID_COUNT=n_valid is not None, KEY_ON_DEVICE=on_device,
            )  # fmt: skip
    return ChosenLayer(keys, count, valid)


def _check_args(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rows: torch.Tensor,
    dst: torch.Tensor,
    fanout: int,
    key: int | torch.Tensor,
    n_valid: torch.Tensor | None = None,
) -> None:
    """The argument checks of :func:`choose_layer` (metadata only: no device read)."""
    if fanout < 1:
        raise ValueError(f"fanout must be >= 1 (got {fanout})")
    if not isinstance(key, torch.Tensor) and not 0 <= key < 1 << WORD_BITS:
        raise ValueError(f"key must be in [0, 2^64) (got {key})")
    for name, t in (("indptr", indptr), ("rows", rows), ("dst", dst)):
        if t.dim() != 1 or t.dtype != torch.int64:
            raise ValueError(f"{name} must be a 1-D int64 tensor (got {t.dtype}, {t.dim()}-D)")
    if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be a 1-D int32 or int64 tensor (got {indices.dtype})")
    if rows.shape != dst.shape:
        raise ValueError(f"rows and dst must have one shape (got {rows.shape} and {dst.shape})")
    if indptr.shape[0] < 2 and dst.shape[0]:
        raise ValueError("indptr must have at least one row (got an empty CSR)")
    if not indptr.is_contiguous() or not indices.is_contiguous():
        raise ValueError("indptr and indices must be contiguous")
    tensors = [indptr, indices, rows, dst]
    if isinstance(key, torch.Tensor):
        if key.dtype != torch.int64 or key.numel() != 1:
            raise ValueError(
                f"a key tensor must be int64 of one element (got {key.dtype}, "
                f"{key.numel()} elements)"
            )
        tensors.append(key)
    if n_valid is not None:
        if n_valid.dtype != torch.int64 or n_valid.numel() != 1:
            raise ValueError(
                f"n_valid must be an int64 tensor of one element (got {n_valid.dtype}, "
                f"{n_valid.numel()} elements)"
            )
        tensors.append(n_valid)
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(
            f"indptr, indices, rows, dst, n_valid and key must be on one device (got {devices})"
        )
