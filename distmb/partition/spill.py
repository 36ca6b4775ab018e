"""Keeps the graph's two big arrays out of memory while a partitioning engine runs.

An engine (METIS, KaMinPar) works on its own copy of the adjacency; the graph's ``indices``
and its feature table are not read again until the rebalancing and the writer. So before
the engine phase :func:`spilled` moves them into read-only memory maps of temporary files
(a feature table that is a memory map already stays one), and an engine calls
:func:`release_pages` once it has built its input: the maps are opened afresh, so the pages
it read through them stop counting in this process' memory. The writer reads them back
through the maps (page cache), when the engine's memory is gone. Values never change; the
temporary files are unlinked at once (Linux reopens them through ``/proc/self/fd``), so
nothing is left behind, whatever happens. The allocator's free heap pages are returned to the
OS as the engine phase starts (:func:`trim_heap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from distmb.core.errors import output_error
from distmb.core.progress import Progress
from distmb.data.graph import Graph

#: The arrays moved out of memory (the big ones; the rest is per vertex).
SPILLED_ARRAYS = ("indices", "features")

#: Arrays smaller than this stay in memory (the files would cost more than they save).
SPILL_MIN_BYTES = 64 << 20

#: Bytes written per step when spilling.
_WRITE_CHUNK_BYTES = 64 << 20

#: Where Linux exposes this process' open files (an unlinked file is reopened through it).
_FD_DIR = Path("/proc/self/fd")

#: Attribute of a spilled array's map: the path it is reopened through.
_SOURCE_ATTR = "spill_source"


def is_file_backed(array: np.ndarray) -> bool:
    """Whether ``array`` is a whole memory map of a file that :func:`remap` can reopen."""
    return (
        isinstance(array, np.memmap) and isinstance(array.base, mmap.mmap) and bool(array.filename)
    )


def resident_nbytes(graph: Graph) -> int:
    """Bytes of the graph's arrays that live in memory rather than in mapped files (after
    :func:`release_pages`, a mapped array holds no resident page)."""
    arrays = (
        graph.indptr,
        graph.indices,
        graph.features,
        graph.labels,
        graph.train_idx,
        graph.val_idx,
        graph.test_idx,
    )
    return int(sum(a.nbytes for a in arrays if not is_file_backed(a)))


def remap(array: np.memmap) -> np.memmap:
    """A fresh read-only map of the same file range (no page of it resident yet)."""
    order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
    # A spilled file is unlinked: numpy records its dead name, so it is reopened through
    # the descriptor :func:`spilled` holds (``spill_source``).
    source = getattr(array, _SOURCE_ATTR, None) or array.filename
    mapped = np.memmap(
        source, dtype=array.dtype, mode="r", offset=array.offset, shape=array.shape, order=order
    )
    if hasattr(array, _SOURCE_ATTR):
        setattr(mapped, _SOURCE_ATTR, source)
    return mapped


def release_pages(graph: Graph) -> None:
    """Reopen every memory-mapped array of :data:`SPILLED_ARRAYS` (see the module
    docstring); the old maps go away with their last reference. Call it inside
    :func:`spilled` (its temporary files are reopened through their descriptors)."""
    for name in SPILLED_ARRAYS:
        array = getattr(graph, name)
        if is_file_backed(array):
            setattr(graph, name, remap(array))


@contextmanager
def spilled(
    graph: Graph, log: Progress | None = None, directory: str | os.PathLike[str] | None = None
) -> Iterator[list[str]]:
    """Within the block, ``graph.indices`` and ``graph.features`` are read-only memory maps
    (yields the names of the arrays written to temporary files).

    An array is written to an unlinked temporary file in ``directory`` (default ``TMPDIR``)
    unless it is a memory map already (then it is only reopened), smaller than
    :data:`SPILL_MIN_BYTES`, or the disk lacks the room (then it stays, and ``log`` says so).
    The maps stay on the graph after the block (their files disappear with them). Only on
    Linux (``/proc/self/fd``); elsewhere nothing changes.
    """
    log = log or Progress(quiet=True)
    root = Path(directory) if directory is not None else Path(tempfile.gettempdir())
    held: list[int] = []
    names: list[str] = []
    try:
        for name in SPILLED_ARRAYS:
            fd = _spill_one(graph, name, root, log)  # a function: no reference outlives it
            if fd is not None:
                held.append(fd)
                names.append(name)
        if names:
            log(f"moved {' and '.join(names)} to temporary files in {root} for partitioning")
        trim_heap()
        yield names
    finally:
        for fd in held:
            os.close(fd)  # the maps keep the files alive; the disk space goes with them


def trim_heap() -> None:
    """Give the allocator's free heap pages back to the OS (glibc ``malloc_trim``): the
    loaders' chunk temporaries leave some behind, which would count while the engine runs.
    A no-op where the C library has no such call."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _spill_one(graph: Graph, name: str, root: Path, log: Progress) -> int | None:
    """Move ``graph.<name>`` to an unlinked file in ``root`` (see :func:`spilled`); return
    the file's descriptor, or None when the array stays (reopened if it is a map)."""
    array = getattr(graph, name)
    if is_file_backed(array):
        setattr(graph, name, remap(array))
        return None
    if not _FD_DIR.is_dir() or array.nbytes < SPILL_MIN_BYTES:
        return None
    if shutil.disk_usage(root).free < 2 * array.nbytes:
        log(
            f"keeping {name} ({array.nbytes / 2**30:.2f} GiB) in memory: {root} has too "
            "little free space to hold it during partitioning (set TMPDIR)"
        )
        return None
    fd = _write_unlinked(np.ascontiguousarray(array), root, name)
    source = str(_FD_DIR / str(fd))
    mapped = np.memmap(source, dtype=array.dtype, mode="r", shape=array.shape)
    setattr(mapped, _SOURCE_ATTR, source)
    setattr(graph, name, mapped)
    return fd


def _write_unlinked(array: np.ndarray, root: Path, name: str) -> int:
    """Write ``array``'s bytes to a new file in ``root``, unlink it, return its open fd.

    Raises:
        OutputError: ``cannot write spilled NAME into ROOT: REASON`` (``root`` full: set
            ``TMPDIR`` to a larger filesystem).
    """
    try:
        fd, path = tempfile.mkstemp(prefix=f"distmb-spill-{name}-", dir=root)
    except OSError as exc:
        raise output_error(f"spilled {name} into", root, exc) from exc
    try:
        os.unlink(path)
        flat = array.reshape(-1)
        step = max(1, _WRITE_CHUNK_BYTES // max(array.itemsize, 1))
        with os.fdopen(os.dup(fd), "wb") as f:
            for lo in range(0, flat.shape[0], step):
                f.write(memoryview(flat[lo : lo + step]).cast("B"))
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise output_error(f"spilled {name} into", root, exc) from exc
        raise
    return fd
