"""The dtype a rank stores its input-feature table in (``--feature-dtype``).

A partition's features are float32. A rank may hold them in two bytes a value instead:
``float16`` or ``bfloat16`` halve the table's memory (the CPU path's table in RAM, the GPU
path's pinned host rows and device cache) and the bytes every gathered row moves. Rows reach
the model as float32, each value rounded once (to nearest even) when the table is stored.

- ``bfloat16`` keeps float32's range (8 exponent bits) with an 8-bit significand: about 2-3
  significant decimal digits.
- ``float16`` has an 11-bit significand but tops out at 65,504: a table with a larger value is
  refused (:class:`StorageRangeError`) rather than stored as infinity.

:func:`copy_rows` converts a table into a preallocated buffer, :func:`stored_table` into a new
one (:func:`stacked_table`: several tables into one); each a chunk of
:data:`CONVERT_CHUNK_ROWS` rows at a time, so a memory-mapped float32 table is never copied
whole, and each may normalise a chunk in float32 before it is rounded
(``--normalize-features``: the rounding then applies to the normalised values, as the model
reads them).
"""

from __future__ import annotations

import mmap
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

#: The dtypes a table may be stored in, by name (``--feature-dtype``).
STORAGE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
#: Dtypes a host feature table may hold (the GPU path's zero-copy rows too:
#: ``__cuda_array_interface__`` describes all but bfloat16, which numpy lacks, so
#: ``zero_copy.cuda_alias`` describes its rows as int16 and views them back).
HOST_DTYPES: tuple[torch.dtype, ...] = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)

#: Rows converted at a time when a table is stored in another dtype (bounds the temporary
#: float copies of a memory-mapped table to a few MiB).
CONVERT_CHUNK_ROWS = 1 << 16

#: ``transform(rows) -> rows``: applied to each float32 chunk (a copy it may change in place)
#: before it is stored, e.g. ``FeatureNormalization.apply_``
#: (:mod:`distmb.pipeline.features.normalize`).
RowTransform = Callable[[torch.Tensor], torch.Tensor]


class StorageRangeError(ValueError):
    """A table holds a value beyond the largest of the dtype it is to be stored in."""


def storage_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``--feature-dtype name`` (a key of :data:`STORAGE_DTYPES`)."""
    try:
        return STORAGE_DTYPES[name]
    except KeyError:
        raise ValueError(
            f"feature dtype must be one of {', '.join(STORAGE_DTYPES)}, got {name!r}"
        ) from None


def as_host_tensor(table: np.ndarray | torch.Tensor) -> torch.Tensor:
    """The table as a 2-D CPU tensor of one of :data:`HOST_DTYPES` (numpy arrays are wrapped,
    not copied, when they can be; memory maps are read). bfloat16 comes as a tensor only
    (numpy has no such dtype)."""
    if isinstance(table, np.ndarray):
        if table.ndim != 2 or table.dtype not in (np.float16, np.float32, np.float64):
            raise ValueError(
                f"host feature table must be a 2-D float16/32/64 array, got "
                f"{table.dtype}{list(table.shape)}"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "non-writable array": read only
            tensor = torch.from_numpy(np.ascontiguousarray(table))
    else:
        tensor = table
    if tensor.ndim != 2 or tensor.dtype not in HOST_DTYPES or tensor.device.type != "cpu":
        raise ValueError(
            f"host feature table must be a 2-D float16/bfloat16/float32/float64 CPU tensor, got "
            f"{tensor.dtype}{list(tensor.shape)} on {tensor.device}"
        )
    return tensor


def file_backed(table: np.ndarray) -> bool:
    """Whether ``table``'s memory is a mapped file (an ``np.memmap``, or a view of one: its
    pages are the OS page cache's, not this process's)."""
    base: Any = table
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return True
        base = getattr(base, "base", None)
    return False


def in_memory(table: np.ndarray) -> np.ndarray:
    """``table`` in this process's memory, C-contiguous: a copy of a memory-mapped table
    (``np.ascontiguousarray`` alone would return a contiguous map as it is), else the array
    itself where it already is contiguous."""
    if file_backed(table):
        return np.array(table, order="C", copy=True)
    return np.ascontiguousarray(table)


def copy_rows(
    dest: torch.Tensor,
    source: torch.Tensor,
    transform: RowTransform | None = None,
    first_row: int = 0,
) -> None:
    """``dest[:] = transform(source)`` (2-D CPU tensors of one shape), cast to ``dest``'s
    dtype :data:`CONVERT_CHUNK_ROWS` rows at a time when the dtypes differ or a
    ``transform`` is given (``transform`` gets a float32 copy of each chunk).

    Args:
        first_row: the id the error message gives ``source``'s first row.

    Raises:
        StorageRangeError: the cast makes a finite value infinite (beyond float16's largest
            value, 65504); the message names its row (``first_row`` + its index), column
            and value. Values that are not finite in the table stay as they are.
    """
    if source.dtype == dest.dtype and transform is None:
        dest.copy_(source)
        return
    for start in range(0, int(source.shape[0]), CONVERT_CHUNK_ROWS):
        rows = source[start : start + CONVERT_CHUNK_ROWS]
        if transform is not None:
            rows = transform(rows.to(torch.float32, copy=True))
        out = dest[start : start + CONVERT_CHUNK_ROWS]
        out.copy_(rows)
        if dest.dtype == rows.dtype:
            continue
        overflow = torch.isinf(out) & torch.isfinite(rows)
        if bool(overflow.any()):
            row, col = (int(i) for i in torch.nonzero(overflow)[0])
            limit = torch.finfo(dest.dtype).max
            dtype = str(dest.dtype).removeprefix("torch.")
            raise StorageRangeError(
                f"feature table row {first_row + start + row} holds {float(rows[row, col]):.6g} "
                f"(column {col}), beyond {dtype}'s largest value {limit:.6g}: store the "
                "table as bfloat16 or float32, or normalise its features"
            )


def stored_table(
    table: np.ndarray | torch.Tensor,
    dtype: torch.dtype,
    transform: RowTransform | None = None,
    first_row: int = 0,
) -> torch.Tensor:
    """A new contiguous CPU tensor ``dtype[n, F]`` holding ``table``'s rows (float[n, F],
    numpy or CPU tensor, memory-mapped or not), each chunk passed through ``transform`` in
    float32 first when given (:func:`copy_rows`, ``first_row`` as there; raises its
    :class:`StorageRangeError`)."""
    return stacked_table([table], dtype, transform, first_row)


def stacked_table(
    tables: Sequence[np.ndarray | torch.Tensor],
    dtype: torch.dtype,
    transform: RowTransform | None = None,
    first_row: int = 0,
) -> torch.Tensor:
    """:func:`stored_table` of the tables' rows one after the other (float[n_i, F] each):
    one new ``dtype[sum n_i, F]`` tensor that each table is converted into, with no
    concatenated float32 copy first. Row ``j`` of the i-th table is named ``first_row`` +
    ``sum_{h < i} n_h + j`` in errors.

    Raises:
        ValueError: no tables, or tables of different widths.
    """
    sources = [as_host_tensor(t) for t in tables]
    if not sources or any(s.dim() != 2 or s.shape[1] != sources[0].shape[1] for s in sources):
        widths = [tuple(s.shape) for s in sources]
        raise ValueError(f"stacked_table takes 2-D tables of one width, got shapes {widths}")
    out = torch.empty(sum(int(s.shape[0]) for s in sources), sources[0].shape[1], dtype=dtype)
    start = 0
    for source in sources:
        rows = int(source.shape[0])
        copy_rows(out[start : start + rows], source, transform, first_row + start)
        start += rows
    return out
