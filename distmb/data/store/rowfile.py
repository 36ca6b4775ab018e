"""Out-of-core feature tables: one raw *row file* per table, read by id with ``O_DIRECT``.

A feature table float32[n, F] lives on disk in one file whose rows start at offsets aligned
for direct I/O; :class:`RowFile` reads a batch of rows with many concurrent positioned reads
that bypass the OS page cache (the C++ ``distmb._C.RowFileReader``).

Layout (cited by the partition format, docs/partition-format.md):

- ``align`` = :data:`DIRECT_IO_ALIGN` = 4096 bytes unless recorded otherwise; a power of two.
- ``row_bytes = F * 4`` (float32, little-endian as numpy writes it on the hosts we run on).
- ``row_stride`` = :func:`row_stride` ``(row_bytes, align)``: if ``row_bytes <= align``, the
  smallest power of two ``>= row_bytes`` (so a row never straddles an ``align`` boundary and
  one aligned block read holds it); else ``row_bytes`` rounded up to a multiple of ``align``
  (every row starts on an aligned offset).
- Row ``i`` occupies bytes ``[i * row_stride, i * row_stride + row_bytes)``; the bytes between
  rows are zero, and the file size is ``num_rows * row_stride`` rounded up to a multiple of
  ``align`` (zero padded).
- No header: dtype (``"float32"``), shape ``[n, F]``, ``row_stride``, ``align`` and the file's
  SHA-256 are recorded by the caller (in ``partition.json``), as :func:`write_row_file`
  returns them.

Reading ``ids`` (int64[m], any order, duplicates allowed): the distinct rows are sorted, each
becomes the byte range aligned to :attr:`RowFile.read_align` that holds it (the file's
``O_DIRECT`` alignment, e.g. the device's 512-byte sector, when it divides ``align``),
ranges that overlap, touch or lie within :func:`coalesce_gap` bytes are coalesced into
requests of at most ``max_request`` bytes (``distmb._C.ROWFILE_MAX_REQUEST`` = 1 MiB, more
only for a single larger row), and the requests are read with ``pread`` by
``max(io_depth(), OpenMP threads)`` threads (:func:`set_io_depth`). Where the filesystem
refuses ``O_DIRECT`` (the open or a first aligned read fails with ``EINVAL``, e.g. some
tmpfs or network filesystems) the reader uses buffered reads through the page cache and says
so (:attr:`RowFile.direct`, :attr:`RowFile.fallback_reason`, one warning per reason per
process).
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from distmb import _C
from distmb.core.atomic import write_atomic
from distmb.core.errors import PartitionError
from distmb.core.units import FLOAT32_BYTES

#: Alignment of row offsets and read requests, in bytes (the page size and the largest
#: logical block size of common devices).
DIRECT_IO_ALIGN: int = int(_C.DIRECT_IO_ALIGN)
#: Largest coalesced read request, in bytes (a single row larger than this is one request).
MAX_READ_REQUEST: int = int(_C.ROWFILE_MAX_REQUEST)
#: Default unrequested bytes a read request takes in to join the next row instead of issuing
#: a request of its own (a request costs a device round trip; a few KiB more cost little).
COALESCE_GAP: int = int(_C.READ_COALESCE_GAP)
#: Default reads in flight per call (:func:`set_io_depth`).
DEFAULT_IO_DEPTH: int = int(_C.DEFAULT_IO_DEPTH)


def set_io_depth(depth: int) -> None:
    """Reads in flight per out-of-core read call (row files and neighbour files), at least
    the caller's OpenMP thread count: SSDs reach their throughput only with several requests
    outstanding, and a thread blocked in ``pread`` uses no CPU. Default
    :data:`DEFAULT_IO_DEPTH`."""
    _C.set_io_depth(int(depth))


def set_coalesce_gap(nbytes: int) -> None:
    """Unrequested bytes a read request reads through to take in the next row (default
    :data:`COALESCE_GAP`): raise it on storage whose small reads are slow next to its large
    ones (network or virtual disks), lower it (0) to read only the aligned blocks of the
    requested rows."""
    _C.set_coalesce_gap(int(nbytes))


def coalesce_gap() -> int:
    """Bytes a read request reads through (:func:`set_coalesce_gap`)."""
    return int(_C.get_coalesce_gap())


def io_depth() -> int:
    """Reads in flight per out-of-core read call (:func:`set_io_depth`)."""
    return int(_C.get_io_depth())


#: The one dtype string of a row file's table.
ROW_FILE_DTYPE = "float32"
#: Bytes of padded rows :func:`write_row_file` writes at a time by default.
WRITE_CHUNK_BYTES = 64 << 20

#: Fallback reasons already warned about in this process (one warning each).
_warned_fallbacks: set[tuple[str, str]] = set()


def _is_power_of_two(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def row_stride(row_bytes: int, align: int = DIRECT_IO_ALIGN) -> int:
    """Bytes from one row's start to the next: the smallest power of two ``>= row_bytes`` when
    ``row_bytes <= align``, else ``row_bytes`` rounded up to a multiple of ``align``.

    Args:
        row_bytes: bytes of one row (``F * 4`` for float32), ``>= 1``.
        align: a power of two, in bytes.
    """
    if row_bytes < 1:
        raise ValueError(f"row_stride: row_bytes must be >= 1, got {row_bytes}")
    if not _is_power_of_two(align):
        raise ValueError(f"row_stride: align must be a power of two, got {align}")
    if row_bytes <= align:
        return 1 << (row_bytes - 1).bit_length()
    return _round_up(row_bytes, align)


def row_file_size(num_rows: int, stride: int, align: int = DIRECT_IO_ALIGN) -> int:
    """Size in bytes of a row file of ``num_rows`` rows: ``num_rows * stride`` rounded up to
    a multiple of ``align``."""
    return _round_up(num_rows * stride, align)


class RowTake:
    """The rows ``table[ids]`` of a float32[n, F] table, gathered lazily.

    Slicing returns ``table[ids[slice]]`` (a new float32 array), so :func:`write_row_file`
    and the partition writer stream a part's rows out of a large, possibly memory-mapped
    table one chunk at a time instead of gathering them whole.

    Attributes:
        table: float32[n, F] (any array indexable by an int64 id array).
        ids: int64[m] row ids into ``table``.
    """

    ndim = 2

    def __init__(self, table: Any, ids: np.ndarray) -> None:
        self.table = table
        self.ids = ids

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.table.dtype)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.ids.shape[0]), int(self.table.shape[1]))

    def __getitem__(self, rows: slice) -> np.ndarray:
        return np.asarray(self.table[self.ids[rows]])


def write_row_file(
    path: str | Path,
    rows: Any,
    *,
    align: int = DIRECT_IO_ALIGN,
    chunk_rows: int | None = None,
    atomic: bool = True,
) -> dict[str, Any]:
    """Write a float32 table as a row file (layout in the module docstring) and fsync it.

    The table is streamed in chunks of ``chunk_rows`` padded rows (default: about
    :data:`WRITE_CHUNK_BYTES` bytes), so a huge ``np.memmap`` is never copied whole.

    Args:
        path: the file to write.
        rows: float32[n, F] (any strides; read-only and memory-mapped arrays and CPU tensors
            are fine; or a :class:`RowTake`, gathered chunk by chunk), or a sequence of such
            tables of one width, written one after the other as one table (a part's solid
            rows, then its halo rows).
        align: a power of two, in bytes.
        chunk_rows: rows per write (>= 1).
        atomic: write a temporary file beside ``path`` and rename it into place
            (:func:`distmb.core.atomic.write_atomic`), so a crash never leaves a half-written file
            under ``path``; with False, ``path`` is written directly.

    Returns:
        ``{"dtype": "float32", "shape": [n, F], "row_stride": stride, "align": align,
        "sha256": hex digest of the file as written}`` (JSON-ready, for ``partition.json``).
    """
    tables = [_as_numpy(t) for t in rows] if isinstance(rows, list | tuple) else [_as_numpy(rows)]
    for table in tables:
        if not isinstance(table, np.ndarray | RowTake):
            raise ValueError(
                f"write_row_file({path}): rows must be a numpy array, got {type(table)}"
            )
        if table.dtype != np.float32 or table.ndim != 2:
            raise ValueError(
                f"write_row_file({path}): rows must be a 2-D float32 (native byte order) "
                f"array, got {table.dtype}{list(table.shape)}"
            )
    if not tables or len({int(t.shape[1]) for t in tables}) != 1:
        raise ValueError(f"write_row_file({path}): tables must share one row width")
    n, dim = sum(int(t.shape[0]) for t in tables), int(tables[0].shape[1])
    if dim < 1:
        raise ValueError(f"write_row_file({path}): rows must have at least one column")
    row_bytes = dim * FLOAT32_BYTES
    stride = row_stride(row_bytes, align)
    if chunk_rows is None:
        chunk_rows = max(1, WRITE_CHUNK_BYTES // stride)
    if chunk_rows < 1:
        raise ValueError(f"write_row_file({path}): chunk_rows must be >= 1, got {chunk_rows}")
    size = row_file_size(n, stride, align)
    digest = hashlib.sha256()

    def write(f: BinaryIO) -> None:
        chunk = np.zeros((min(chunk_rows, max(n, 1)), stride), dtype=np.uint8)
        for table in tables:
            for start in range(0, table.shape[0], chunk_rows):
                stop = min(table.shape[0], start + chunk_rows)
                part = chunk[: stop - start]
                # Padding columns stay zero: only the row bytes are overwritten.
                part[:, :row_bytes] = np.ascontiguousarray(table[start:stop]).view(np.uint8)
                data = memoryview(part).cast("B")
                f.write(data)
                digest.update(data)
        tail = size - n * stride
        if tail:
            pad = bytes(tail)
            f.write(pad)
            digest.update(pad)

    if atomic:
        write_atomic(path, write, "feature rows")
    else:
        with open(path, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    return {
        "dtype": ROW_FILE_DTYPE,
        "shape": [n, dim],
        "row_stride": stride,
        "align": align,
        "sha256": digest.hexdigest(),
    }


def _as_numpy(x: Any) -> Any:
    """A CPU tensor as the numpy array sharing its memory (duck-typed: this module does not
    import torch); anything else unchanged. A tensor on another device is refused."""
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        device = getattr(x, "device", None)
        if device is not None and device.type != "cpu":
            raise ValueError(f"expected a CPU tensor, got one on {device}")
        return x.detach().numpy()
    return x


def evict_page_cache(path: str | Path) -> None:
    """Drop the file's pages from the OS page cache (``posix_fadvise(DONTNEED)``), so the next
    reads, ``mmap`` ones included, come from the device: benchmarks call it before timing a
    memory-mapped baseline."""
    try:
        _C.drop_page_cache(os.fspath(path))
    except RuntimeError as exc:
        raise OSError(str(exc)) from None


class RowFile:
    """Rows of one row file (layout in the module docstring), read by id.

    Args:
        path: the row file.
        num_rows: rows of the table (``n``).
        dim: row width ``F`` (float32 values).
        row_stride: bytes from one row's start to the next, as recorded by the writer.
        align: alignment in bytes the file was written with (a power of two).
        direct: read with ``O_DIRECT`` (bypassing the page cache) when the filesystem allows
            it; False: buffered reads.

    Raises:
        PartitionError: the file is missing or shorter than the layout says, or the stride
            and alignment are inconsistent with each other or with ``dim``.

    Attributes:
        direct: reads bypass the page cache.
        fallback_reason: why ``O_DIRECT`` was refused ("" when it was not asked for or not
            refused).
        bytes_read: bytes read from the file since the last :meth:`reset_counters` (the sum of
            the coalesced requests, >= rows read x row bytes).
        read_requests: ``pread`` requests issued since then.
        rows_read: rows returned since then (duplicates counted per position).
        read_seconds: wall time spent in :meth:`read_into` since then, in seconds.
    """

    def __init__(
        self,
        path: str | Path,
        num_rows: int,
        dim: int,
        row_stride: int,
        *,
        align: int = DIRECT_IO_ALIGN,
        direct: bool = True,
    ) -> None:
        self.path = Path(path)
        self.num_rows = int(num_rows)
        self.dim = int(dim)
        self.row_stride = int(row_stride)
        self.align = int(align)
        self.row_bytes = self.dim * FLOAT32_BYTES
        self._check_layout()
        self._reader = self._open(direct)
        self.direct: bool = bool(self._reader.direct)
        self.fallback_reason: str = str(self._reader.fallback_reason)
        if direct and not self.direct:
            warn_fallback("row file", self.path, self.fallback_reason)
        self.read_seconds = 0.0

    def _check_layout(self) -> None:
        where = f"row file {self.path}"
        if self.num_rows < 0 or self.dim < 1:
            raise PartitionError(
                f"{where}: expected num_rows >= 0 and dim >= 1, got {self.num_rows} and {self.dim}"
            )
        if not _is_power_of_two(self.align):
            raise PartitionError(f"{where}: align must be a power of two, got {self.align}")
        stride, align = self.row_stride, self.align
        if stride < self.row_bytes or not (
            (stride <= align and _is_power_of_two(stride)) or stride % align == 0
        ):
            raise PartitionError(
                f"{where}: row_stride {stride} is inconsistent with dim {self.dim} "
                f"({self.row_bytes} bytes per row) and align {align}: expected a stride >= "
                f"{self.row_bytes} that is a power of two <= {align} or a multiple of {align} "
                f"(the writer uses {row_stride(self.row_bytes, align)})"
            )
        if not self.path.exists():
            raise PartitionError(f"{where} is missing")
        if not self.path.is_file():
            raise PartitionError(f"{where} is not a regular file")
        size = self.path.stat().st_size
        expected = row_file_size(self.num_rows, stride, align)
        if size < expected:
            raise PartitionError(
                f"{where} is truncated: {size} bytes, expected at least {expected} "
                f"({self.num_rows} rows x stride {stride}, rounded up to {align})"
            )

    def _open(self, direct: bool) -> Any:
        try:
            return _C.RowFileReader(
                os.fspath(self.path),
                self.num_rows,
                self.row_bytes,
                self.row_stride,
                self.align,
                bool(direct),
            )
        except (RuntimeError, ValueError) as exc:
            raise PartitionError(str(exc)) from None

    # -- reads ------------------------------------------------------------------------------
    def read_into(self, ids: Any, out: Any, positions: np.ndarray | None = None) -> None:
        """Write the rows of ``ids`` into ``out``.

        Args:
            ids: int64[n] (any integer dtype; any order, duplicates allowed), in
                ``[0, num_rows)``.
            out: float32[n, dim], C-contiguous and writeable (a CPU tensor or numpy array);
                with ``positions``, float32[m, dim] for any m.
            positions: optional int64[n]: row ``ids[k]`` goes to ``out[positions[k]]``
                (scattered straight into place, no staging copy).

        Raises:
            ValueError: ``ids``, ``positions`` or ``out`` has the wrong shape or dtype, or the
                file is closed.
            IndexError: an id is outside ``[0, num_rows)``, a position outside ``out``.
            PartitionError: a read stopped short (the file was truncated after opening) or
                failed.
        """
        ids_np = self._check_ids(ids)
        if positions is None:
            out_np = self._check_out(out, ids_np.size)
        else:
            rows = int(out.shape[0]) if getattr(out, "ndim", 0) == 2 else -1
            out_np = self._check_out(out, rows)
            positions = np.ascontiguousarray(positions, dtype=np.int64)
        reader = self._require_open()
        start = time.perf_counter()
        try:
            reader.read_rows(ids_np, out_np, positions)
        except RuntimeError as exc:
            raise PartitionError(str(exc)) from None
        finally:
            self.read_seconds += time.perf_counter() - start

    def read(self, ids: Any) -> np.ndarray:
        """float32[n, dim]: the rows of ``ids`` (int64[n]) in that order, in a new array."""
        ids_np = self._check_ids(ids)
        out = np.empty((ids_np.size, self.dim), dtype=np.float32)
        self.read_into(ids_np, out)
        return out

    def _check_ids(self, ids: Any) -> np.ndarray:
        arr = np.asarray(_as_numpy(ids))
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(
                f"RowFile({self.path}): ids must be a 1-D integer array, got "
                f"{arr.dtype}{list(arr.shape)}"
            )
        # The range [0, num_rows) is checked by the reader (IndexError naming the first bad
        # id and the range) in the same pass that starts the read.
        return np.ascontiguousarray(arr, dtype=np.int64)

    def _check_out(self, out: Any, n: int) -> np.ndarray:
        if hasattr(out, "detach"):  # a tensor: its numpy view (a CPU tensor's own memory)
            try:
                out = _as_numpy(out)
            except (ValueError, TypeError, RuntimeError) as exc:
                raise ValueError(
                    f"RowFile({self.path}).read_into: out must be a contiguous CPU float32"
                    f"[{n}, {self.dim}] tensor ({exc})"
                ) from None
        if not isinstance(out, np.ndarray):
            raise ValueError(
                f"RowFile({self.path}).read_into: out must be a numpy array or a tensor, got "
                f"{type(out).__name__}"
            )
        if (
            out.dtype != np.float32
            or out.shape != (n, self.dim)
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise ValueError(
                f"RowFile({self.path}).read_into: out must be a writeable C-contiguous "
                f"float32[{n}, {self.dim}] array, got {out.dtype}{list(out.shape)}"
            )
        return out

    def _require_open(self) -> Any:
        if self._reader.closed:
            raise ValueError(f"RowFile({self.path}) is closed")
        return self._reader

    # -- other views ------------------------------------------------------------------------
    def as_array(self) -> np.ndarray:
        """A read-only ``np.memmap`` view float32[num_rows, dim] of the file (strided: the
        padding columns are sliced off), read through the page cache: the ``mmap`` and
        ``memory`` feature modes on this layout."""
        if self.num_rows == 0:
            empty = np.empty((0, self.dim), dtype=np.float32)
            empty.flags.writeable = False
            return empty
        full = np.memmap(
            self.path,
            dtype=np.float32,
            mode="r",
            shape=(self.num_rows, self.row_stride // FLOAT32_BYTES),
        )
        return full[:, : self.dim]

    def evict_page_cache(self) -> None:
        """Drop the file's pages from the OS page cache (``posix_fadvise(DONTNEED)``)."""
        try:
            self._require_open().evict_page_cache()
        except RuntimeError as exc:
            raise OSError(str(exc)) from None

    # -- counters ---------------------------------------------------------------------------
    @property
    def read_align(self) -> int:
        """Alignment of the reads in bytes: the file's ``O_DIRECT`` alignment as the kernel
        reports it (often the device's 512-byte logical block) when it divides ``align``, else
        ``align``. A row of ``row_stride <= read_align`` costs one read unit."""
        return int(self._reader.read_align)

    @property
    def max_request(self) -> int:
        """Largest coalesced read request, in bytes."""
        return int(self._reader.max_request)

    @property
    def bytes_read(self) -> int:
        return int(self._reader.counters()["bytes_read"])

    @property
    def read_requests(self) -> int:
        return int(self._reader.counters()["requests"])

    @property
    def rows_read(self) -> int:
        return int(self._reader.counters()["rows_read"])

    def counters(self) -> dict[str, float]:
        """``bytes_read``, ``read_requests``, ``rows_read``, ``read_seconds`` since the last
        :meth:`reset_counters`."""
        c = self._reader.counters()
        return {
            "bytes_read": int(c["bytes_read"]),
            "read_requests": int(c["requests"]),
            "rows_read": int(c["rows_read"]),
            "read_seconds": self.read_seconds,
        }

    def reset_counters(self) -> None:
        self._reader.reset_counters()
        self.read_seconds = 0.0

    # -- lifetime ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return bool(self._reader.closed)

    def close(self) -> None:
        """Close the file descriptor (idempotent); :meth:`as_array` views stay valid."""
        self._reader.close()

    def __enter__(self) -> RowFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "direct" if self.direct else "buffered"
        return (
            f"RowFile({str(self.path)!r}, num_rows={self.num_rows}, dim={self.dim}, "
            f"row_stride={self.row_stride}, align={self.align}, {mode})"
        )


def warn_fallback(kind: str, path: Path, reason: str) -> None:
    """One warning per (kind of file, fallback reason) per process: O_DIRECT was refused and
    buffered reads through the page cache are used (the row files and the neighbour files)."""
    if (kind, reason) in _warned_fallbacks:
        return
    _warned_fallbacks.add((kind, reason))
    warnings.warn(
        f"O_DIRECT was refused for {kind} {path} ({reason}); reading it with buffered I/O "
        "through the OS page cache (reads may be served from memory, and timings are not "
        f"out-of-core); further {kind}s refused for the same reason are not reported",
        RuntimeWarning,
        stacklevel=3,
    )
