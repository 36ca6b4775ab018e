"""The binary cache of an ``ogb:DIR`` dataset, ``DIR/distmb-cache/``.

``.npy`` files plus ``meta.json``, which records the cache version, the layout the arrays were
converted from (``csv`` or ``npz``), the size and mtime of every source file
(:func:`fingerprint`), the split scheme, the class count and every array's bytes, dtype and
shape. :func:`read_cache` accepts a cache only when all of these match the load at hand
(edges and features are then memory-mapped, read-only); any other cache is rebuilt.
:func:`write_cache` builds a cache in a temporary directory inside DIR and renames it into
place, so an interrupted build never leaves a cache that looks valid.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distmb.data.datasets.loader_utils import one_line

#: Name of the cache directory created inside the dataset directory.
CACHE_DIRNAME = "distmb-cache"

#: Version of the cache layout; a cache of another version is rebuilt.
CACHE_VERSION = 1

#: Prefix of the temporary directories a cache is built in (safe to delete when no load runs).
CACHE_TMP_PREFIX = ".distmb-cache-tmp-"

_CACHE_TRASH_PREFIX = ".distmb-cache-old-"
#: How the note of a cache that could not be written starts.
CACHE_NOT_WRITTEN = "cache not written"
_META_FILE = "meta.json"

#: Layout names recorded in the cache's ``meta.json`` (a cache without one is ``csv``).
CSV_LAYOUT = "csv"
NPZ_LAYOUT = "npz"
#: Arrays memory-mapped when read back.
MMAP_ARRAYS = ("src", "dst", "features")


@dataclass
class CachedArrays:
    """What a valid cache holds: arrays by name (memory-mapped where listed) and classes."""

    arrays: dict[str, np.ndarray]
    num_classes: int


def fingerprint(root: Path, files: list[Path]) -> dict[str, list[int]]:
    """``{path relative to root: [size, mtime_ns]}`` of every source file."""
    out = {}
    for path in files:
        st = path.stat()
        out[path.relative_to(root).as_posix()] = [st.st_size, st.st_mtime_ns]
    return out


def read_cache(
    cache: Path, fingerprint: dict[str, list[int]], layout: str, names: tuple[str, ...]
) -> tuple[CachedArrays | None, str]:
    """The cached arrays ``names`` when ``cache`` is complete, of ``layout`` and built from
    these sources, else ``(None, why not)``. Arrays in :data:`MMAP_ARRAYS` are memory-mapped."""
    if not cache.is_dir():
        return None, "no cache yet"
    try:
        meta = json.loads((cache / _META_FILE).read_text())
        if meta.get("version") != CACHE_VERSION:
            return None, f"cache version {meta.get('version')!r} is not {CACHE_VERSION}"
        if meta.get("sources") != fingerprint:
            return None, "the source files changed since the cache was built"
        if meta.get("layout", CSV_LAYOUT) != layout or sorted(meta["arrays"]) != sorted(names):
            return None, "the cache holds other arrays than this load needs"
        arrays = {name: _read_cached_array(cache, name, meta["arrays"][name]) for name in names}
        out = CachedArrays(arrays, int(meta["num_classes"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError) as exc:
        return None, f"invalid cache {cache}: {one_line(exc)}"
    return out, ""


def _read_cached_array(cache: Path, name: str, spec: dict) -> np.ndarray:
    """One cached ``.npy``; ValueError unless its size, dtype and shape match ``spec``."""
    path = cache / f"{name}.npy"
    if path.stat().st_size != spec["bytes"]:
        raise ValueError(f"{path.name} has {path.stat().st_size} bytes, expected {spec['bytes']}")
    mmap = "r" if name in MMAP_ARRAYS and int(np.prod(spec["shape"])) > 0 else None
    arr = np.load(path, mmap_mode=mmap, allow_pickle=False)
    if arr.dtype.str != spec["dtype"] or list(arr.shape) != spec["shape"]:
        raise ValueError(
            f"{path.name} holds {arr.dtype.str}{list(arr.shape)}, expected "
            f"{spec['dtype']}{spec['shape']}"
        )
    return arr


def write_cache(
    d: Path,
    fingerprint: dict[str, list[int]],
    scheme: str,
    layout: str,
    num_classes: int,
    write: Callable[[Path], dict[str, dict]],
) -> str:
    """Write the cache atomically into ``d / CACHE_DIRNAME``; returns a note of the outcome.

    ``write(tmp)`` writes the arrays as ``tmp/NAME.npy`` (flushed to disk) and returns the
    ``meta.json`` entry of each (:func:`save_array`'s). An unwritable directory or a full disk
    is not an error: the note says the cache was not written (start ``"cache not written"``).
    """
    try:
        tmp = Path(tempfile.mkdtemp(prefix=CACHE_TMP_PREFIX, dir=d))
    except OSError as exc:
        return f"{CACHE_NOT_WRITTEN} ({d} is not writable: {one_line(exc)})"
    try:
        os.chmod(tmp, stat.S_IMODE(d.stat().st_mode) & 0o777)  # mkdtemp makes it owner-only
        meta = {
            "version": CACHE_VERSION,
            "layout": layout,
            "sources": fingerprint,
            "split_scheme": scheme,
            "num_classes": num_classes,
            "arrays": write(tmp),
        }
        with open(tmp / _META_FILE, "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        return _install(tmp, d / CACHE_DIRNAME, fingerprint, layout, tuple(meta["arrays"]))
    except OSError as exc:
        return f"{CACHE_NOT_WRITTEN} ({one_line(exc)})"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when installed


def save_array(path: Path, arr: np.ndarray) -> dict:
    """Write ``arr`` as ``.npy`` (flushed to disk); returns its meta entry."""
    with open(path, "wb") as f:
        np.save(f, arr, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": path.stat().st_size, "dtype": arr.dtype.str, "shape": list(arr.shape)}


def _install(
    tmp: Path, final: Path, fingerprint: dict[str, list[int]], layout: str, names: tuple[str, ...]
) -> str:
    """Rename the finished ``tmp`` to ``final``, replacing a stale cache there."""
    if final.exists():
        existing, _ = read_cache(final, fingerprint, layout, names)
        if existing is not None:  # another process installed a valid cache meanwhile
            return f"cache {final} was written concurrently; kept that one"
        trash = Path(tempfile.mkdtemp(prefix=_CACHE_TRASH_PREFIX, dir=final.parent))
        os.replace(final, trash / CACHE_DIRNAME)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # lost a race with another process
            return f"cache {final} was written concurrently; kept that one"
        raise
    return f"cache written to {final}"
