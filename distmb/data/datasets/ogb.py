"""``ogb:DIR``: an OGB node-property-prediction directory as downloaded, read without ``ogb``.

Two layouts, as OGB ships them (``master.csv``'s ``binary`` column decides which a dataset
uses). The CSV layout (ogbn-arxiv, ogbn-products; all files gzip'd, without header)::

    DIR/raw/edge.csv.gz            E lines "src,dst"            (edge src -> dst)
    DIR/raw/node-feat.csv.gz       N lines of F numbers
    DIR/raw/node-label.csv.gz      N lines, one class id, or "nan" (unlabelled)
    DIR/raw/num-node-list.csv.gz   optional: one line, N
    DIR/raw/num-edge-list.csv.gz   optional: one line, E (lets the edge arrays be preallocated)
    DIR/split/<scheme>/{train,valid,test}.csv.gz   one vertex id per line

The binary layout (ogbn-papers100M) replaces the ``raw/`` CSV files by ``raw/data.npz`` and
``raw/node-label.npz``; it is read by :mod:`distmb.data.datasets.ogb_npz`. A directory with
``raw/edge.csv.gz`` is read as CSV, else one with ``raw/data.npz`` as binary.

The CSVs are parsed block by block (:data:`BLOCK_BYTES` of text at a time, so memory stays
bounded by the arrays themselves) and converted once to a binary cache ``DIR/distmb-cache/``
(``.npy`` files plus ``meta.json`` recording the size and mtime of every source file). Later
loads read the cache (edges and features memory-mapped, read-only) while the sources are
unchanged. The cache is built in a temporary directory inside DIR and renamed into place, so
an interrupted build never leaves a cache that looks valid; an invalid cache is rebuilt.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import shutil
import stat
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distmb.core.errors import InputError
from distmb.core.progress import meter
from distmb.data.datasets.loader_utils import (
    SPLIT_NAMES,
    checked_index,
    class_count,
    one_line,
    unlabelled_note,
)
from distmb.data.graph import UNLABELED, Graph

#: Name of the cache directory created inside the dataset directory.
CACHE_DIRNAME = "distmb-cache"

#: Version of the cache layout; a cache of another version is rebuilt.
CACHE_VERSION = 1

#: Decompressed bytes of CSV text parsed at a time.
BLOCK_BYTES = 32 << 20

#: Prefix of the temporary directories a cache is built in (safe to delete when no load runs).
CACHE_TMP_PREFIX = ".distmb-cache-tmp-"

_CACHE_TRASH_PREFIX = ".distmb-cache-old-"
#: How the note of a cache that could not be written starts.
CACHE_NOT_WRITTEN = "cache not written"
_META_FILE = "meta.json"

#: Split file of each split array, in ``split/<scheme>/``.
_SPLIT_FILES = dict(zip(SPLIT_NAMES, ("train.csv.gz", "valid.csv.gz", "test.csv.gz"), strict=True))

#: Arrays of the cache, and those memory-mapped when read back.
_CACHE_ARRAYS = ("src", "dst", "features", "labels") + SPLIT_NAMES
_MMAP_ARRAYS = ("src", "dst", "features")

_NEWLINE = ord("\n")
_COMMA = ord(",")
_SIGNS = (ord("-"), ord("+"))
_DIGITS = b"0123456789"
#: Bytes a CSV block of integers / of floats may hold.
_INT_BYTES = _DIGITS + b"+-,\n"
_FLOAT_BYTES = _DIGITS + b"+-.eEnaiftyNAIFTY,\n"  # nan, inf, infinity in any case
_FIELD_SPACE = re.compile(rb"[ \t]*([,\n])[ \t]*")

_REQUIRED_RAW = ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz")
_SPLIT_LAYOUT = "split/<scheme>/{train,valid,test}.csv.gz"
_LAYOUT = (
    f"raw/edge.csv.gz, raw/node-feat.csv.gz, raw/node-label.csv.gz and {_SPLIT_LAYOUT}"
    f", or raw/data.npz, raw/node-label.npz and {_SPLIT_LAYOUT}"
)
#: Layout names recorded in the cache's ``meta.json`` (a cache without one is ``csv``).
CSV_LAYOUT = "csv"
NPZ_LAYOUT = "npz"
#: Split file of OGB's own saver that is a torch pickle (never read).
_PICKLED_SPLIT = "split_dict.pt"


@dataclass
class _Sources:
    """The files of one OGB directory (CSV layout) that a load reads."""

    root: Path
    edge: Path
    feat: Path
    label: Path
    num_nodes: Path | None
    num_edges: Path | None
    scheme: str
    splits: dict[str, Path]

    def files(self) -> list[Path]:
        optional = [p for p in (self.num_nodes, self.num_edges) if p is not None]
        return [self.edge, self.feat, self.label, *optional, *self.splits.values()]

    def fingerprint(self) -> dict[str, list[int]]:
        return fingerprint(self.root, self.files())


@dataclass
class OgbArrays:
    """Parsed contents: src/dst int64[E], features float32[N, F], labels int64[N], splits."""

    src: np.ndarray
    dst: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int


@dataclass
class _Cached:
    """What a valid cache holds: arrays by name (memory-mapped where listed) and classes."""

    arrays: dict[str, np.ndarray]
    num_classes: int


def load_ogb(directory: str, *, symmetrize: bool = True) -> Graph:
    """Load an OGB node-property-prediction directory (see the module docstring).

    Args:
        directory: the dataset directory (``ogbn_products/``, ``ogbn-arxiv/``); its basename
            names the graph (``ogbn_products`` -> ``ogbn-products``).
        symmetrize: add every edge in reverse too (OGB stores each undirected edge once).

    Returns:
        A validated :class:`Graph`: features float32[N, F] (a read-only memory map when read
        from the cache or from an uncompressed ``data.npz``), labels int64[N]
        (:data:`UNLABELED` for ``nan``), the OGB split.
    """
    arrays, notes, source = read_ogb_arrays(directory)
    return Graph.from_edges(
        dataset_name(Path(directory)),
        arrays.src,
        arrays.dst,
        arrays.labels.shape[0],
        arrays.features,
        arrays.labels,
        arrays.train_idx,
        arrays.val_idx,
        arrays.test_idx,
        arrays.num_classes,
        symmetrize=symmetrize,
        source=source,
        notes=notes,
    )


def read_ogb_arrays(directory: str) -> tuple[OgbArrays, list[str], str]:
    """The arrays of an OGB directory without building the graph: edges and features
    memory-mapped (from the cache, converted on a first load, or from an uncompressed
    ``data.npz``), labels and splits in memory.

    Returns:
        (arrays, notes on what was read, the source to name in graph errors).
    """
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"{d}: no such directory (expected an OGB dataset with {_LAYOUT})")
    raw = d / "raw"
    binary = not (raw / "edge.csv.gz").is_file() and (raw / "data.npz").is_file()
    scheme, splits = locate_split(d)
    notes: list[str] = []
    schemes = _schemes(d)
    if len(schemes) > 1:
        notes.append(
            f"several split schemes in {d / 'split'} ({', '.join(schemes)}); "
            f"used {scheme!r}, the first in sorted order"
        )
    if binary:
        from distmb.data.datasets.ogb_npz import read_npz_layout

        arrays, source = read_npz_layout(d, scheme, splits, notes)
    else:
        arrays = _read_csv_layout(d, scheme, splits, notes)
        source = str(d)
    notes.append(
        f"split: OGB split/{scheme} ({arrays.train_idx.size}/"
        f"{arrays.val_idx.size}/{arrays.test_idx.size})"
    )
    notes.append(unlabelled_note(arrays.labels))
    return arrays, notes, source


def _read_csv_layout(d: Path, scheme: str, splits: dict[str, Path], notes: list[str]) -> OgbArrays:
    """The arrays of a CSV-layout directory, from the cache or parsed (and then cached)."""
    sources = _locate(d, scheme, splits)
    fp = sources.fingerprint()
    cached, reason = read_cache(d / CACHE_DIRNAME, fp, CSV_LAYOUT, _CACHE_ARRAYS)
    if cached is not None:
        arrays = OgbArrays(**cached.arrays, num_classes=cached.num_classes)
        if _consistent(arrays):
            notes.append(f"cache hit: read {d / CACHE_DIRNAME}")
            return arrays
        reason = f"invalid cache {d / CACHE_DIRNAME}: inconsistent array shapes"
    started = time.perf_counter()
    arrays = _parse_raw(sources)
    split = {k: getattr(arrays, k) for k in SPLIT_NAMES}
    check_split_labelled(arrays.labels, split, splits, sources.label)
    elapsed = time.perf_counter() - started

    def write(tmp: Path) -> dict[str, dict]:
        return {
            name: save_array(tmp / f"{name}.npy", getattr(arrays, name)) for name in _CACHE_ARRAYS
        }

    written = write_cache(d, fp, scheme, CSV_LAYOUT, arrays.num_classes, write)
    notes.append(f"cache miss ({reason}): parsed the CSV files in {elapsed:.1f} s; {written}")
    return arrays


def _consistent(arrays: OgbArrays) -> bool:
    """Whether the shapes of (cached) arrays fit together."""
    n = arrays.labels.shape[0]
    return (
        arrays.src.shape == arrays.dst.shape
        and arrays.features.ndim == 2
        and arrays.features.shape[0] == n
        and arrays.num_classes >= 1
    )


def check_split_labelled(
    labels: np.ndarray, split: dict[str, np.ndarray], splits: dict[str, Path], label_file: Path
) -> None:
    """:class:`InputError` naming the split file when a split holds an unlabelled vertex."""
    for name in SPLIT_NAMES:
        idx = split[name]
        bad = labels[idx] == UNLABELED
        if bad.any():
            raise InputError(
                f"{splits[name]}: vertex {int(idx[np.argmax(bad)])} has no label (nan in "
                f"{label_file.name}); a split may hold labelled vertices only"
            )


def fingerprint(root: Path, files: list[Path]) -> dict[str, list[int]]:
    """``{path relative to root: [size, mtime_ns]}`` of every source file."""
    out = {}
    for path in files:
        st = path.stat()
        out[path.relative_to(root).as_posix()] = [st.st_size, st.st_mtime_ns]
    return out


def dataset_name(d: Path) -> str:
    """The directory's basename, ``ogbn_x``/``ogbn-x`` normalised to ``ogbn-x``."""
    base = d.resolve().name
    if base.lower().startswith("ogbn"):
        return "ogbn-" + base[len("ogbn") :].lstrip("-_").replace("_", "-")
    return base


def _schemes(d: Path) -> list[str]:
    split_root = d / "split"
    if not split_root.is_dir():
        return []
    return sorted(p.name for p in split_root.iterdir() if p.is_dir())


def locate_split(d: Path) -> tuple[str, dict[str, Path]]:
    """(scheme, split file of each of :data:`SPLIT_NAMES`): the first ``split/<scheme>/`` in
    sorted order; :class:`InputError` naming the first file missing."""
    schemes = _schemes(d)
    if not schemes:
        raise InputError(f"{d / 'split'}: no split scheme directory (expected {_LAYOUT})")
    scheme = schemes[0]
    splits = {k: d / "split" / scheme / f for k, f in _SPLIT_FILES.items()}
    for path in splits.values():
        if not path.is_file():
            hint = ""
            if (path.parent / _PICKLED_SPLIT).is_file():
                hint = f"; {_PICKLED_SPLIT} there is a torch pickle and is not read"
            raise InputError(f"{path}: no such file (expected {_SPLIT_LAYOUT}){hint}")
    return scheme, splits


def _locate(d: Path, scheme: str, splits: dict[str, Path]) -> _Sources:
    """The CSV layout's files; :class:`InputError` naming the first one missing."""
    raw = d / "raw"
    for name in _REQUIRED_RAW:
        if not (raw / name).is_file():
            raise InputError(f"{raw / name}: no such file (expected {_LAYOUT})")
    optional = {n: raw / f"{n}.csv.gz" for n in ("num-node-list", "num-edge-list")}
    return _Sources(
        root=d,
        edge=raw / "edge.csv.gz",
        feat=raw / "node-feat.csv.gz",
        label=raw / "node-label.csv.gz",
        num_nodes=optional["num-node-list"] if optional["num-node-list"].is_file() else None,
        num_edges=optional["num-edge-list"] if optional["num-edge-list"].is_file() else None,
        scheme=scheme,
        splits=splits,
    )


# --------------------------------------------------------------------------------------------
# Parsing the gzip'd CSV files.
# --------------------------------------------------------------------------------------------


def _parse_raw(s: _Sources) -> OgbArrays:
    """Parse every source file and check that they fit together."""
    labels, num_classes = _read_labels(s.label)
    num_nodes = labels.shape[0]
    if s.num_nodes is not None:
        declared = _read_count(s.num_nodes, "vertices")
        if declared != num_nodes:
            raise InputError(
                f"{s.label}: {num_nodes} lines but {s.num_nodes.name} declares {declared} vertices"
            )
    features = _read_features(s.feat, num_nodes, s.label)
    num_edges = _read_count(s.num_edges, "edges") if s.num_edges is not None else None
    src, dst = _read_edges(s.edge, num_nodes, num_edges)
    splits = [_read_ids(s.splits[k], num_nodes) for k in SPLIT_NAMES]
    return OgbArrays(src, dst, features, labels, *splits, num_classes=num_classes)


def _read_count(path: Path, what: str) -> int:
    """The single non-negative integer of ``num-node-list``/``num-edge-list``."""
    values = np.concatenate([v[:, 0] for _, v in _csv_blocks(path, np.int64, 1)] or [[]])
    if values.shape != (1,) or values[0] < 0:
        raise InputError(
            f"{path}: expected one line with the number of {what} (a graph of a "
            f"node-property-prediction dataset), got {values.size} values"
        )
    return int(values[0])


def _read_labels(path: Path) -> tuple[np.ndarray, int]:
    """(labels int64[N], num_classes) from one class id or ``nan`` per line."""
    chunks = [
        class_ids(values[:, 0], path, lambda k, first=first_line: f"line {first + k}")
        for first_line, values in _csv_blocks(path, np.float64, 1)
    ]
    labels = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    return labels, label_classes(labels, path)


def class_ids(y: np.ndarray, path: Path, where: Callable[[int], str]) -> np.ndarray:
    """int64 class ids of OGB labels ``y``: floats with ``nan`` for unlabelled (which becomes
    :data:`UNLABELED`, never an integer cast of NaN), or integers with ``-1`` for unlabelled.
    :class:`InputError` names ``path`` and ``where(k)`` of the first value that is not a
    class id."""
    if np.issubdtype(y.dtype, np.integer):
        bad = y < UNLABELED
        if bad.any():
            k = int(np.argmax(bad))
            raise InputError(
                f"{path}: {where(k)}: label {int(y[k])} is not a class id (expected an "
                f"integer >= 0, or {UNLABELED} for unlabelled)"
            )
        return y.astype(np.int64)
    if not np.issubdtype(y.dtype, np.floating):
        raise InputError(f"{path}: labels must be real numbers, got dtype {y.dtype}")
    labelled = ~np.isnan(y)
    bad = labelled & ((y < 0) | (y != np.floor(y)) | np.isinf(y))
    if bad.any():
        k = int(np.argmax(bad))
        raise InputError(
            f"{path}: {where(k)}: label {float(y[k])!r} is not a class id (expected an "
            "integer >= 0, or nan for unlabelled)"
        )
    return np.where(labelled, y, UNLABELED).astype(np.int64)


def label_classes(labels: np.ndarray, path: Path) -> int:
    """num_classes of int64 labels (largest + 1); :class:`InputError` when none is labelled."""
    if not (labels != UNLABELED).any():
        raise InputError(f"{path}: no vertex has a label")
    return class_count(labels, str(path))


def _read_features(path: Path, num_nodes: int, label_path: Path) -> np.ndarray:
    """float32[num_nodes, F], F taken from the first line; every value finite."""
    features: np.ndarray | None = None
    filled = 0
    for first_line, values in _csv_blocks(path, np.float32, None):
        if features is None:
            features = np.empty((num_nodes, values.shape[1]), dtype=np.float32)
        if filled + values.shape[0] > num_nodes:
            raise InputError(
                f"{path}: more than {num_nodes} lines (one per vertex, as in {label_path.name})"
            )
        finite = np.isfinite(values).all(axis=1)
        if not finite.all():
            k = int(np.argmin(finite))
            raise InputError(f"{path}: line {first_line + k}: feature value is NaN or Inf")
        features[filled : filled + values.shape[0]] = values
        filled += values.shape[0]
    if features is None or filled != num_nodes:
        raise InputError(
            f"{path}: {filled} lines, expected {num_nodes} (one per vertex, as in "
            f"{label_path.name})"
        )
    return features


def _read_edges(path: Path, num_nodes: int, num_edges: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(src int64[E], dst int64[E]); every id in ``[0, num_nodes)``. With ``num_edges`` known
    the arrays are filled in place, else blocks are concatenated at the end."""
    src_parts: list[np.ndarray] = []
    dst_parts: list[np.ndarray] = []
    if num_edges is not None:
        src_all = np.empty(num_edges, dtype=np.int64)
        dst_all = np.empty(num_edges, dtype=np.int64)
    filled = 0
    for first_line, values in _csv_blocks(path, np.int64, 2):
        bad = ((values < 0) | (values >= num_nodes)).any(axis=1)
        if bad.any():
            k = int(np.argmax(bad))
            raise InputError(
                f"{path}: line {first_line + k}: edge {values[k, 0]},{values[k, 1]}"
                f" has an endpoint outside the {num_nodes} vertices"
            )
        rows = values.shape[0]
        if num_edges is None:
            src_parts.append(values[:, 0].copy())
            dst_parts.append(values[:, 1].copy())
        elif filled + rows > num_edges:
            raise InputError(f"{path}: more than the {num_edges} lines num-edge-list declares")
        else:
            src_all[filled : filled + rows] = values[:, 0]
            dst_all[filled : filled + rows] = values[:, 1]
        filled += rows
    if num_edges is None:
        empty = np.zeros(0, np.int64)
        return np.concatenate(src_parts or [empty]), np.concatenate(dst_parts or [empty])
    if filled != num_edges:
        raise InputError(f"{path}: {filled} lines but num-edge-list declares {num_edges} edges")
    return src_all, dst_all


def _read_ids(path: Path, num_nodes: int) -> np.ndarray:
    """int64 ascending vertex ids of a split file (one per line, in range, no repeats)."""
    chunks = []
    for first_line, values in _csv_blocks(path, np.int64, 1):
        ids = values[:, 0]
        bad = (ids < 0) | (ids >= num_nodes)
        if bad.any():
            k = int(np.argmax(bad))
            raise InputError(
                f"{path}: line {first_line + k}: vertex id {int(ids[k])} is "
                f"outside [0, {num_nodes})"
            )
        chunks.append(ids)
    ids = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    return checked_index(ids, num_nodes, str(path))


def _csv_blocks(
    path: Path, dtype: type[np.generic], ncols: int | None
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(line number of the first row, values[rows, ncols])`` block by block.

    ``ncols=None`` takes the column count from the first line. Every line must hold exactly
    ``ncols`` comma-separated numbers of ``dtype``; :class:`InputError` names the file and line.
    """
    for first_line, block in _line_blocks(path):
        if ncols is None:
            ncols = block[: block.index(b"\n")].count(b",") + 1
        yield first_line, _parse_block(block, dtype, ncols, path, first_line)


def _line_blocks(path: Path) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line number, text)`` where text is whole lines, each ending with a newline."""
    line_no = 1
    carry = b""
    try:
        with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as f:
            size_mib = os.fstat(raw.fileno()).st_size / 2**20
            bar = meter(f"parsing {path.name}", size_mib, "MiB", decimals=1)
            done_mib = 0.0
            while True:
                chunk = f.read(BLOCK_BYTES)
                now_mib = raw.tell() / 2**20  # compressed bytes read so far
                bar.update(now_mib - done_mib)
                done_mib = now_mib
                if not chunk:
                    bar.close()
                    break
                chunk = carry + chunk if carry else chunk
                cut = chunk.rfind(b"\n") + 1
                if cut == 0:  # no line end yet: keep reading
                    carry = chunk
                    continue
                block, carry = chunk[:cut], chunk[cut:]
                yield line_no, block
                line_no += block.count(b"\n")
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise InputError(f"{path}: not a readable gzip'd CSV file ({one_line(exc)})") from None
    if carry:  # last line without a newline
        yield line_no, carry + b"\n"


def _parse_block(
    block: bytes, dtype: type[np.generic], ncols: int, path: Path, first_line: int
) -> np.ndarray:
    """values[rows, ncols] of a block of whole lines; strict about the text's form."""
    if b"\r" in block:
        block = block.replace(b"\r", b"")
    if b" " in block or b"\t" in block:
        block = _FIELD_SPACE.sub(rb"\1", block).lstrip(b" \t")
    buf = np.frombuffer(block, dtype=np.uint8)
    newlines = np.flatnonzero(buf == _NEWLINE)
    per_line = np.diff(np.searchsorted(np.flatnonzero(buf == _COMMA), newlines), prepend=0)
    wrong = per_line != ncols - 1
    if wrong.any():
        k = int(np.argmax(wrong))
        raise InputError(
            f"{path}: line {first_line + k}: expected {ncols} comma-separated "
            f"values, found {int(per_line[k]) + 1}: {_line(block, k)!r}"
        )
    values = None
    if _well_formed(block, buf, dtype):
        values = _fromstring(block[:-1].replace(b"\n", b","), dtype)
    if values is None or values.size != newlines.size * ncols:
        k = _first_bad_line(block, dtype, ncols)
        kind = "integers" if np.issubdtype(dtype, np.integer) else "numbers"
        raise InputError(
            f"{path}: line {first_line + k}: expected {ncols} comma-separated "
            f"{kind}, got {_line(block, k)!r}"
        )
    return values.reshape(newlines.size, ncols)


def _well_formed(block: bytes, buf: np.ndarray, dtype: type[np.generic]) -> bool:
    """Checks for what numpy's lenient text parser lets through: foreign bytes (blanks make
    ``"1, ,2"`` parse as three numbers) and lone signs (``"1,-"`` parses as ``[1, 0]``).

    Empty fields need no check: numpy rejects them, except one trailing separator, which
    shows as a missing value. ``buf`` is ``block`` as uint8.
    """
    allowed = _INT_BYTES if np.issubdtype(dtype, np.integer) else _FLOAT_BYTES
    if block.translate(None, allowed):
        return False
    if block.count(b"-") or block.count(b"+"):
        signs = np.flatnonzero((buf == _SIGNS[0]) | (buf == _SIGNS[1]))
        after = buf[signs + 1]  # in range: a block ends with a newline
        if not np.isin(after, np.frombuffer(_DIGITS + b".infINF", np.uint8)).all():
            return False
    return True


def _fromstring(text: bytes, dtype: type[np.generic]) -> np.ndarray | None:
    """numpy's C text parser (comma separated); ``None`` where it stops early."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            return np.fromstring(text, dtype=dtype, sep=",")
        except (ValueError, DeprecationWarning):
            return None


def _first_bad_line(block: bytes, dtype: type[np.generic], ncols: int) -> int:
    """Index of the first line of ``block`` that is not ``ncols`` numbers (slow; errors only)."""
    for k, line in enumerate(block.split(b"\n")[:-1]):
        fields = line.split(b",")
        if len(fields) != ncols or not all(_is_number(f, dtype) for f in fields):
            return k
    return 0


def _is_number(field: bytes, dtype: type[np.generic]) -> bool:
    try:
        (int if np.issubdtype(dtype, np.integer) else float)(field.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return False
    return field.strip() == field and b"_" not in field


def _line(block: bytes, k: int) -> str:
    """Line ``k`` of ``block`` (shortened) for error messages."""
    line = block.split(b"\n", k + 1)[k]
    text = line[:80].decode("utf-8", errors="replace")
    return text + ("..." if len(line) > 80 else "")


# --------------------------------------------------------------------------------------------
# The binary cache.
# --------------------------------------------------------------------------------------------


def read_cache(
    cache: Path, fingerprint: dict[str, list[int]], layout: str, names: tuple[str, ...]
) -> tuple[_Cached | None, str]:
    """The cached arrays ``names`` when ``cache`` is complete, of ``layout`` and built from
    these sources, else ``(None, why not)``. Arrays in :data:`_MMAP_ARRAYS` are memory-mapped."""
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
        out = _Cached(arrays, int(meta["num_classes"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError) as exc:
        return None, f"invalid cache {cache}: {one_line(exc)}"
    return out, ""


def _read_cached_array(cache: Path, name: str, spec: dict) -> np.ndarray:
    """One cached ``.npy``; ValueError unless its size, dtype and shape match ``spec``."""
    path = cache / f"{name}.npy"
    if path.stat().st_size != spec["bytes"]:
        raise ValueError(f"{path.name} has {path.stat().st_size} bytes, expected {spec['bytes']}")
    mmap = "r" if name in _MMAP_ARRAYS and int(np.prod(spec["shape"])) > 0 else None
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
