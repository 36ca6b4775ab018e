"""The binary layout of ``ogb:DIR`` (ogbn-papers100M), read without ``ogb`` and without pickle.

The layout OGB's ``DatasetSaver`` writes and ``NodePropPredDataset`` reads for datasets whose
``master.csv`` entry has ``binary`` = True (``ogb/io/read_graph_raw.py``,
``read_binary_graph_raw``)::

    DIR/raw/data.npz        edge_index int[2, E]: edge edge_index[0, e] -> edge_index[1, e]
                            node_feat  real[N, F]
                            num_nodes_list int[1] = [N], num_edges_list int[1] = [E]
                            (other node_*/edge_* arrays, e.g. papers100M's node_year
                            int64[N, 1], are not read)
    DIR/raw/node-label.npz  node_label real[N, 1] (or [N]): class id, nan = unlabelled
    DIR/split/<scheme>/{train,valid,test}.csv.gz   one vertex id per line, as the CSV layout

**Memory.** OGB writes both archives with ``np.savez_compressed``; a compressed member cannot be
memory-mapped, so it is decompressed as a stream, :data:`~distmb.data.store.npzmember.BLOCK_BYTES`
at a time (:mod:`distmb.data.store.npzmember`), straight into the cache ``DIR/distmb-cache/``:
``src.npy``/``dst.npy`` int64[E] (the two rows of ``edge_index``) and ``features.npy``
float32[N, F], which this and later loads memory-map read-only. A member stored
uncompressed (``np.savez``), in C order, with the dtype the graph uses (int64 edges, float32
features) and naturally aligned data is memory-mapped from ``data.npz`` itself and not copied
into the cache. Labels (int64[N], from ``nan`` -> :data:`UNLABELED`) and the splits are
always cached. The edges are thus never held twice: they are streamed to files block by block
(or mapped), and the graph's CSR is then built from the two mapped rows
(:meth:`Graph.from_edges`, whose kernel de-duplicates in place).

Without a writable ``DIR`` the converted arrays are held in memory instead (noted).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from distmb.core.errors import InputError
from distmb.core.progress import meter
from distmb.data.datasets.loader_utils import SPLIT_NAMES
from distmb.data.datasets.ogb_arrays import (
    OgbArrays,
    check_split_labelled,
    class_ids,
    label_classes,
)
from distmb.data.datasets.ogb_cache import (
    CACHE_DIRNAME,
    CACHE_NOT_WRITTEN,
    NPZ_LAYOUT,
    CachedArrays,
    fingerprint,
    read_cache,
    save_array,
    write_cache,
)
from distmb.data.datasets.ogb_csv import read_ids
from distmb.data.store.npzmember import NpzMember, iter_c_order, memmap, read_members, read_whole

DATA_FILE = "data.npz"
LABEL_FILE = "node-label.npz"
EDGE_KEY = "edge_index"
FEATURE_KEY = "node_feat"
NUM_NODES_KEY = "num_nodes_list"
NUM_EDGES_KEY = "num_edges_list"
LABEL_KEY = "node_label"
_EXPECTED = (
    f"raw/{DATA_FILE} with {EDGE_KEY} int[2, E], {FEATURE_KEY} float[N, F], "
    f"{NUM_NODES_KEY} int[1], {NUM_EDGES_KEY} int[1]; raw/{LABEL_FILE} with {LABEL_KEY} "
    "float[N, 1] (nan = unlabelled)"
)

#: Cached arrays of this layout: always the small ones; edges and features unless mapped.
_SMALL_ARRAYS = ("labels", *SPLIT_NAMES)
_EDGE_ARRAYS = ("src", "dst")
_FEATURE_ARRAY = "features"
_EDGE_DTYPE = np.dtype(np.int64)
_FEATURE_DTYPE = np.dtype(np.float32)


@dataclass
class _Members:
    """The checked arrays of one binary-layout directory."""

    edges: NpzMember  # int[2, E]
    features: NpzMember  # real[N, F]
    labels: NpzMember  # real[N, 1] or [N]
    num_nodes: int
    num_edges: int


def read_npz_layout(
    d: Path, scheme: str, splits: dict[str, Path], notes: list[str]
) -> tuple[OgbArrays, str]:
    """The arrays of a binary-layout directory (see the module docstring).

    Returns:
        (arrays, the source to name in graph errors: ``DIR/raw/data.npz``).
    """
    data_path, label_path = d / "raw" / DATA_FILE, d / "raw" / LABEL_FILE
    m = _members(data_path, label_path)
    why_not_mapped = {
        "edges": m.edges.unmappable(_EDGE_DTYPE),
        "features": m.features.unmappable(_FEATURE_DTYPE),
    }
    names = (
        _SMALL_ARRAYS
        + (_EDGE_ARRAYS if why_not_mapped["edges"] else ())
        + ((_FEATURE_ARRAY,) if why_not_mapped["features"] else ())
    )
    fp = fingerprint(d, [data_path, label_path, *splits.values()])
    cache = d / CACHE_DIRNAME
    cached, reason = read_cache(cache, fp, NPZ_LAYOUT, names)
    if cached is not None and not _consistent(cached, m):
        cached, reason = None, f"invalid cache {cache}: inconsistent array shapes"
    if cached is not None:
        notes.append(f"cache hit: read {cache}")
    else:
        started = time.perf_counter()
        cached, written = _convert(d, fp, scheme, m, splits, names)
        notes.append(
            f"cache miss ({reason}): converted raw/{DATA_FILE} and raw/{LABEL_FILE} in "
            f"{time.perf_counter() - started:.1f} s; {written}"
        )
    a = cached.arrays
    if why_not_mapped["edges"]:
        src, dst = a["src"], a["dst"]
        notes.append(f"edges: {EDGE_KEY} is {why_not_mapped['edges']}; read from the cache")
    else:
        edge_index = memmap(m.edges)
        src, dst = edge_index[0], edge_index[1]
        notes.append(f"edges: memory-mapped from raw/{DATA_FILE} (stored uncompressed)")
    if why_not_mapped["features"]:
        features = a[_FEATURE_ARRAY]
        notes.append(
            f"features: {FEATURE_KEY} is {why_not_mapped['features']}; read from the cache"
        )
    else:
        features = memmap(m.features)
        notes.append(f"features: memory-mapped from raw/{DATA_FILE} (stored uncompressed)")
    arrays = OgbArrays(
        src, dst, features, a["labels"], *(a[k] for k in SPLIT_NAMES), cached.num_classes
    )
    return arrays, str(data_path)


def _members(data_path: Path, label_path: Path) -> _Members:
    """Find and check the arrays of both archives; :class:`InputError` naming the file."""
    for path in (data_path, label_path):
        if not path.is_file():
            raise InputError(f"{path}: no such file (expected {_EXPECTED})")
    data = read_members(data_path)
    for key in (EDGE_KEY, FEATURE_KEY, NUM_NODES_KEY, NUM_EDGES_KEY):
        if key not in data:
            raise InputError(f"{data_path}: no array {key!r} (expected {_EXPECTED})")
    num_nodes = _single_count(data[NUM_NODES_KEY], "vertices")
    num_edges = _single_count(data[NUM_EDGES_KEY], "edges")
    edges = data[EDGE_KEY]
    if len(edges.shape) != 2 or edges.shape[0] != 2 or not _is_int(edges.dtype):
        raise InputError(
            f"{edges.what}: expected int[2, E] (sources, then targets), got "
            f"{edges.dtype.str}{list(edges.shape)}"
        )
    if edges.shape[1] != num_edges:
        raise InputError(
            f"{edges.what}: {edges.shape[1]} edges but {NUM_EDGES_KEY} declares {num_edges}"
        )
    features = data[FEATURE_KEY]
    if len(features.shape) != 2 or not _is_real(features.dtype):
        raise InputError(
            f"{features.what}: expected real numbers [N, F], got "
            f"{features.dtype.str}{list(features.shape)}"
        )
    if features.shape[0] != num_nodes:
        raise InputError(
            f"{features.what}: {features.shape[0]} rows but {NUM_NODES_KEY} declares "
            f"{num_nodes} vertices"
        )
    label_members = read_members(label_path)
    if LABEL_KEY not in label_members:
        raise InputError(f"{label_path}: no array {LABEL_KEY!r} (expected {_EXPECTED})")
    labels = label_members[LABEL_KEY]
    if labels.shape not in ((num_nodes,), (num_nodes, 1)) or not _is_real(labels.dtype):
        raise InputError(
            f"{labels.what}: expected one class per vertex, real[{num_nodes}, 1] "
            f"(multi-task labels are not supported), got {labels.dtype.str}{list(labels.shape)}"
        )
    return _Members(edges, features, labels, num_nodes, num_edges)


def _is_int(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.integer)


def _is_real(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or _is_int(dtype)


def _single_count(member: NpzMember, what: str) -> int:
    """N or E of ``num_nodes_list``/``num_edges_list``: one graph, a count >= 0."""
    if len(member.shape) != 1 or not _is_int(member.dtype):
        raise InputError(
            f"{member.what}: expected int[1] (the number of {what}), got "
            f"{member.dtype.str}{list(member.shape)}"
        )
    if member.shape[0] != 1:
        raise InputError(
            f"{member.what}: {member.shape[0]} graphs; ogb: reads node-property datasets of "
            "one graph"
        )
    count = int(read_whole(member)[0])
    if count < 0:
        raise InputError(f"{member.what}: the number of {what} is {count}")
    return count


def _consistent(cached: CachedArrays, m: _Members) -> bool:
    """Whether cached arrays have the shapes the archives declare."""
    a = cached.arrays
    ok = a["labels"].shape == (m.num_nodes,) and cached.num_classes >= 1
    if "src" in a:
        ok = ok and a["src"].shape == a["dst"].shape == (m.num_edges,)
    if _FEATURE_ARRAY in a:
        ok = ok and a[_FEATURE_ARRAY].shape == m.features.shape
    return ok


# --------------------------------------------------------------------------------------------
# Conversion (streamed into the cache, or into memory when the cache cannot be written).
# --------------------------------------------------------------------------------------------


def _convert(
    d: Path,
    fp: dict[str, list[int]],
    scheme: str,
    m: _Members,
    splits: dict[str, Path],
    names: tuple[str, ...],
) -> tuple[CachedArrays, str]:
    """Convert what ``names`` lists; returns (the arrays, a note on the cache)."""
    labels = _read_labels(m)
    num_classes = label_classes(labels, m.labels.archive)
    split = {k: read_ids(splits[k], m.num_nodes) for k in SPLIT_NAMES}
    check_split_labelled(labels, split, splits, m.labels.archive)
    small = {"labels": labels} | split

    def write(tmp: Path) -> dict[str, dict]:
        specs = {name: save_array(tmp / f"{name}.npy", arr) for name, arr in small.items()}
        if "src" in names:
            shape = (m.num_edges,)
            with (
                _NpyWriter(tmp / "src.npy", _EDGE_DTYPE, shape) as src,
                _NpyWriter(tmp / "dst.npy", _EDGE_DTYPE, shape) as dst,
            ):
                _stream_edges(m, [src, dst], tmp)
                specs |= {"src": src.finish(), "dst": dst.finish()}
        if _FEATURE_ARRAY in names:
            path = tmp / f"{_FEATURE_ARRAY}.npy"
            with _NpyWriter(path, _FEATURE_DTYPE, m.features.shape) as sink:
                _stream_features(m, sink, tmp)
                specs[_FEATURE_ARRAY] = sink.finish()
        return specs

    note = write_cache(d, fp, scheme, NPZ_LAYOUT, num_classes, write)
    if not note.startswith(CACHE_NOT_WRITTEN):
        cached, _ = read_cache(d / CACHE_DIRNAME, fp, NPZ_LAYOUT, names)
        if cached is not None:
            return cached, note
        note = f"{note}, but it could not be read back"
    arrays = dict(small)
    if "src" in names:
        fillers = [_Filler(_EDGE_DTYPE, (m.num_edges,)) for _ in _EDGE_ARRAYS]
        _stream_edges(m, fillers, None)
        arrays |= {k: f.array for k, f in zip(_EDGE_ARRAYS, fillers, strict=True)}
    if _FEATURE_ARRAY in names:
        filler = _Filler(_FEATURE_DTYPE, m.features.shape)
        _stream_features(m, filler, None)
        arrays[_FEATURE_ARRAY] = filler.array
    return CachedArrays(arrays, num_classes), f"{note}; converted into memory instead"


def _blocks(member: NpzMember, spill_dir: Path | None) -> Iterator[np.ndarray]:
    """:func:`iter_c_order` with a progress meter (MiB of array data)."""
    bar = meter(
        f"reading {member.archive.name}:{member.key}", member.nbytes / 2**20, "MiB", decimals=1
    )
    for block in iter_c_order(member, spill_dir=spill_dir):
        yield block
        bar.update(block.nbytes / 2**20)
    bar.close()


def _read_labels(m: _Members) -> np.ndarray:
    """int64[N] class ids of ``node_label`` (:func:`class_ids`: nan -> UNLABELED)."""
    labels = np.empty(m.num_nodes, dtype=np.int64)
    pos = 0
    for block in _blocks(m.labels, None):
        labels[pos : pos + block.size] = class_ids(
            block, m.labels.archive, lambda k, first=pos: f"{LABEL_KEY} of vertex {first + k}"
        )
        pos += block.size
    return labels


def _stream_edges(m: _Members, sinks: list[_Sink], spill_dir: Path | None) -> None:
    """Append ``edge_index`` row 0 to ``sinks[0]`` and row 1 to ``sinks[1]`` as int64, each
    id checked to lie in ``[0, N)``. The blocks come in C order: all sources, then targets."""
    e, n = m.num_edges, m.num_nodes
    pos = 0
    for block in _blocks(m.edges, spill_dir):
        ids = block.astype(np.int64, copy=False)
        bad = (ids < 0) | (ids >= n)
        if bad.any():
            k = pos + int(np.argmax(bad))
            raise InputError(
                f"{m.edges.what}: edge {k % e} has {('source', 'target')[k // e]} "
                f"{int(ids[k - pos])}, outside the {n} vertices [0, {n})"
            )
        cut = max(0, min(ids.size, e - pos))
        if cut:
            sinks[0].append(ids[:cut])
        if cut < ids.size:
            sinks[1].append(ids[cut:])
        pos += ids.size


def _stream_features(m: _Members, sink: _Sink, spill_dir: Path | None) -> None:
    """Append ``node_feat`` in C order as float32, every value checked to be finite."""
    pos, width = 0, max(1, m.features.shape[1])
    for block in _blocks(m.features, spill_dir):
        values = block.astype(_FEATURE_DTYPE, copy=False)
        finite = np.isfinite(values)
        if not finite.all():
            vertex = (pos + int(np.argmin(finite))) // width
            raise InputError(f"{m.features.what}: vertex {vertex}: feature value is NaN or Inf")
        sink.append(values)
        pos += values.size


class _Sink(Protocol):
    """Where converted blocks go, in order: a :class:`_NpyWriter` or a :class:`_Filler`."""

    def append(self, block: np.ndarray) -> None: ...


class _NpyWriter:
    """A C-order ``.npy`` of known dtype and shape written block by block with plain
    sequential writes (a full disk raises OSError; a memory map would fault instead).
    Use as a context manager; :meth:`finish` flushes it to disk."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.path, self.dtype, self.shape = path, dtype, shape
        self.expected = int(np.prod(shape, dtype=np.int64))
        self.written = 0
        self.f = open(path, "wb")  # noqa: SIM115 - closed by __exit__
        header = {
            "descr": np.lib.format.dtype_to_descr(dtype),
            "fortran_order": False,
            "shape": shape,
        }
        np.lib.format.write_array_header_1_0(self.f, header)

    def __enter__(self) -> _NpyWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()

    def append(self, block: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(block, dtype=self.dtype).data)
        self.written += block.size

    def finish(self) -> dict:
        """Flush to disk; returns the ``meta.json`` entry (as :func:`save_array`'s)."""
        assert self.written == self.expected, (self.path, self.written, self.expected)
        self.f.flush()
        os.fsync(self.f.fileno())
        return {
            "bytes": os.fstat(self.f.fileno()).st_size,
            "dtype": self.dtype.str,
            "shape": list(self.shape),
        }


class _Filler:
    """The in-memory counterpart of :class:`_NpyWriter`: ``array`` filled block by block."""

    def __init__(self, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.array = np.empty(shape, dtype=dtype)
        self._flat: np.ndarray = self.array.reshape(-1)
        self._pos = 0

    def append(self, block: np.ndarray) -> None:
        self._flat[self._pos : self._pos + block.size] = block
        self._pos += block.size
