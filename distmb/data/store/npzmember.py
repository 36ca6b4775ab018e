"""Arrays inside an ``.npz`` (zip) archive, read without loading the archive whole.

``np.load`` reads an ``.npz`` member into memory in one piece and ignores ``mmap_mode``. For
archives of tens of GB (ogbn-papers100M's ``raw/data.npz``) this module instead:

- reads each member's ``.npy`` header (shape, dtype, order) from the zip directory and the
  first bytes of the member (:func:`read_members`), refusing object arrays (they need pickle);
- memory-maps a member stored **uncompressed** (``np.savez``, zip method STORED): its data
  offset in the archive is the local zip header's offset + 30 + name and extra-field lengths +
  the ``.npy`` header length (:func:`memmap`). The zip CRC of a mapped member is not checked
  (that would read it whole);
- yields the elements of any member in C order, a block at a time (:func:`iter_c_order`). A
  member stored **compressed** (``np.savez_compressed``, DEFLATE, as OGB ships its files)
  cannot be memory-mapped: it is decompressed as a stream, :data:`BLOCK_BYTES` at a time, and
  its CRC is checked at the end. A compressed member in Fortran order is first decompressed to
  a spill file (or into memory) and read back in C order.

Errors are :class:`InputError` naming the archive and the member.
"""

from __future__ import annotations

import dataclasses
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

import numpy as np

from distmb.core.errors import InputError
from distmb.data.datasets.loader_utils import one_line
from distmb.data.store.format import NPY_READ_ERRORS

#: Bytes of array data handled per block when streaming or converting a member.
BLOCK_BYTES = 32 << 20

#: Fixed part of a zip local file header (signature .. extra-field length), in bytes.
_LOCAL_HEADER_BYTES = 30
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIGNATURE = 0x04034B50
#: General-purpose flag bit 0 of a zip entry: the entry is encrypted.
_ENCRYPTED_FLAG = 0x1
#: Member suffix ``np.savez`` gives every array.
_NPY_SUFFIX = ".npy"
#: Largest member :func:`read_whole` reads into memory, in bytes (for small arrays only).
SMALL_ARRAY_BYTES = 1 << 20

#: What reading a damaged or forged zip raises (zlib.error: corrupt DEFLATE data).
_ZIP_ERRORS = (
    *NPY_READ_ERRORS,
    zipfile.LargeZipFile,
    struct.error,
    zlib.error,
    NotImplementedError,
)


@dataclass(frozen=True)
class NpzMember:
    """One ``KEY.npy`` member of an ``.npz`` archive.

    Attributes:
        archive: the ``.npz`` file.
        key: the array's name (member name without ``.npy``).
        shape, dtype, fortran_order: from the member's ``.npy`` header.
        compressed: True unless the member is stored uncompressed (only those can be mapped).
        data_offset: byte offset of the array data in ``archive`` (stored members), else None.
    """

    archive: Path
    key: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    compressed: bool
    data_offset: int | None

    @property
    def what(self) -> str:
        """``ARCHIVE: array 'KEY'`` for messages."""
        return f"{self.archive}: array {self.key!r}"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def c_layout(self) -> bool:
        """True when the bytes are in C order (also for a Fortran-order array with at most
        one axis longer than 1, whose two orders coincide)."""
        return not self.fortran_order or sum(n > 1 for n in self.shape) <= 1

    def unmappable(self, dtype: np.dtype) -> str | None:
        """Why this member cannot be memory-mapped as a C-order, naturally aligned array of
        ``dtype`` (the form the C++ kernels take without a copy); None when it can."""
        if self.compressed:
            return "stored compressed"
        if not self.c_layout:
            return "stored in Fortran order"
        if self.dtype != dtype:
            return f"dtype {self.dtype.str}, not {np.dtype(dtype).str}"
        assert self.data_offset is not None
        if self.data_offset % self.dtype.alignment:
            return (
                f"its data starts at byte {self.data_offset}, not a multiple of "
                f"{self.dtype.alignment} (unaligned)"
            )
        return None


def read_members(path: Path) -> dict[str, NpzMember]:
    """The members of the ``.npz`` file ``path`` by key; :class:`InputError` for a file that
    is not a readable zip of ``.npy`` arrays, or holds an object array."""
    try:
        with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
            file_bytes = raw.seek(0, 2)
            members = {}
            for info in archive.infolist():
                if not info.filename.endswith(_NPY_SUFFIX) or info.is_dir():
                    continue
                member = _read_member(path, archive, raw, info)
                if member.data_offset is not None and member.data_offset + member.nbytes > (
                    file_bytes
                ):
                    raise InputError(f"{member.what}: truncated (the file ends inside its data)")
                members[member.key] = member
            return members
    except InputError:
        raise
    except _ZIP_ERRORS as exc:
        raise InputError(f"{path}: not a readable .npz archive ({one_line(exc)})") from None


def _read_member(
    path: Path, archive: zipfile.ZipFile, raw: BinaryIO, info: zipfile.ZipInfo
) -> NpzMember:
    key = info.filename[: -len(_NPY_SUFFIX)]
    what = f"{path}: array {key!r}"
    if info.flag_bits & _ENCRYPTED_FLAG:
        raise InputError(f"{what}: encrypted zip members are not read")
    with archive.open(info) as f:
        shape, fortran_order, dtype = _read_npy_header(f, what)
        header_bytes = f.tell()
    member = NpzMember(
        archive=path,
        key=key,
        shape=shape,
        dtype=dtype,
        fortran_order=fortran_order,
        compressed=info.compress_type != zipfile.ZIP_STORED,
        data_offset=None,
    )
    if info.file_size != header_bytes + member.nbytes:
        raise InputError(
            f"{what}: {info.file_size - header_bytes} bytes of data, but its header declares "
            f"{dtype.str}{list(shape)} = {member.nbytes} bytes (truncated or corrupt)"
        )
    if member.compressed:
        return member
    raw.seek(info.header_offset)
    fields = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER_BYTES))
    if fields[0] != _LOCAL_SIGNATURE:
        raise InputError(f"{what}: corrupt zip local header at byte {info.header_offset}")
    name_len, extra_len = fields[9], fields[10]
    start = info.header_offset + _LOCAL_HEADER_BYTES + name_len + extra_len
    return dataclasses.replace(member, data_offset=start + header_bytes)


def _read_npy_header(f: IO[bytes], what: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the ``.npy`` stream ``f``, positioned after it."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran_order, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran_order, dtype = fmt.read_array_header_2_0(f)
        else:
            raise InputError(f"{what}: .npy format version {version} is not read (1.0, 2.0)")
    except InputError:
        raise
    except _ZIP_ERRORS as exc:
        raise InputError(f"{what}: not a readable .npy array ({one_line(exc)})") from None
    if dtype.hasobject:
        raise InputError(f"{what}: holds Python objects, which need pickle; not read")
    return tuple(int(n) for n in shape), bool(fortran_order), dtype


def memmap(member: NpzMember) -> np.ndarray:
    """A read-only memory map of a member stored uncompressed (in its own order)."""
    if member.data_offset is None:
        raise ValueError(f"{member.what} is compressed and cannot be memory-mapped")
    if member.size == 0:
        return np.zeros(member.shape, dtype=member.dtype)
    order = "F" if member.fortran_order else "C"
    try:
        return np.memmap(
            member.archive,
            dtype=member.dtype,
            mode="r",
            offset=member.data_offset,
            shape=member.shape,
            order=order,
        )
    except (OSError, ValueError) as exc:
        raise InputError(f"{member.what}: cannot be memory-mapped ({one_line(exc)})") from None


def iter_c_order(
    member: NpzMember, block_bytes: int | None = None, spill_dir: Path | None = None
) -> Iterator[np.ndarray]:
    """The member's elements in C order, as 1-D blocks of about ``block_bytes`` (default
    :data:`BLOCK_BYTES`).

    Stored members are read through :func:`memmap`; compressed ones are decompressed as a
    stream. A compressed member in Fortran order is decompressed first into ``spill_dir`` (a
    temporary ``.npy``, deleted afterwards) or, without one, into memory.
    """
    block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
    block = max(1, block_bytes // max(1, member.dtype.itemsize))
    if not member.compressed:
        yield from _iter_array(memmap(member), block)
    elif member.c_layout:
        yield from _iter_stream(member, block)
    else:
        yield from _iter_spilled(member, block, spill_dir)


def read_whole(member: NpzMember) -> np.ndarray:
    """A small member (at most :data:`SMALL_ARRAY_BYTES`) as an in-memory array."""
    if member.nbytes > SMALL_ARRAY_BYTES:
        raise InputError(
            f"{member.what}: {member.nbytes} bytes, expected a small array "
            f"(at most {SMALL_ARRAY_BYTES})"
        )
    flat = [b.copy() for b in iter_c_order(member)]
    out = np.concatenate(flat) if flat else np.zeros(0, member.dtype)
    return out.reshape(member.shape)


def _iter_array(a: np.ndarray, block: int) -> Iterator[np.ndarray]:
    """C-order blocks of a (possibly Fortran-order) array of any number of dimensions."""
    if a.ndim <= 1 or a.flags.c_contiguous:
        flat = a.reshape(-1)
        for lo in range(0, flat.size, block):
            yield np.asarray(flat[lo : lo + block])
        return
    rows = a.reshape(a.shape[0], -1) if a.ndim == 2 else None
    if rows is None:  # Fortran order with > 2 dimensions: not a layout OGB writes
        raise InputError("Fortran-order arrays of more than 2 dimensions are not read")
    width = rows.shape[1]
    if width <= block:
        step = block // width
        for lo in range(0, rows.shape[0], step):
            yield np.ascontiguousarray(rows[lo : lo + step]).reshape(-1)
        return
    for r in range(rows.shape[0]):
        for lo in range(0, width, block):
            yield np.ascontiguousarray(rows[r, lo : lo + block])


def _open_data(member: NpzMember) -> tuple[zipfile.ZipFile, IO[bytes]]:
    """(zip, member stream) positioned at the array data; the caller closes both."""
    archive = zipfile.ZipFile(member.archive)
    try:
        f = archive.open(member.key + _NPY_SUFFIX)
        _read_npy_header(f, member.what)
    except BaseException:
        archive.close()
        raise
    return archive, f


def _iter_stream(member: NpzMember, block: int) -> Iterator[np.ndarray]:
    """Decompress a C-order member block by block; the zip CRC is checked at the end."""
    itemsize = member.dtype.itemsize
    left = member.size
    try:
        archive, f = _open_data(member)
        with archive, f:
            while left:
                want = min(block, left) * itemsize
                buf = f.read(want)
                if len(buf) != want:
                    raise InputError(f"{member.what}: truncated (ends {left} elements early)")
                left -= want // itemsize
                yield np.frombuffer(buf, dtype=member.dtype)
            if f.read(1):
                raise InputError(f"{member.what}: more bytes than its header declares")
    except InputError:
        raise
    except _ZIP_ERRORS as exc:  # BadZipFile("Bad CRC-32 ..."), zlib.error, EOFError
        raise InputError(f"{member.what}: corrupt ({one_line(exc)})") from None


def _iter_spilled(member: NpzMember, block: int, spill_dir: Path | None) -> Iterator[np.ndarray]:
    """A compressed Fortran-order member: decompress, then read back in C order."""
    if spill_dir is None:
        flat = np.empty(member.size, dtype=member.dtype)
        pos = 0
        for part in _iter_stream(member, block):
            flat[pos : pos + part.size] = part
            pos += part.size
        yield from _iter_array(flat.reshape(member.shape, order="F"), block)
        return
    spill = spill_dir / f".spill-{member.key}.raw"
    try:
        with open(spill, "wb") as out:
            for part in _iter_stream(member, block):
                out.write(part.tobytes())
        mapped = np.memmap(spill, dtype=member.dtype, mode="r", shape=member.shape, order="F")
        yield from _iter_array(mapped, block)
        del mapped
    finally:
        spill.unlink(missing_ok=True)
