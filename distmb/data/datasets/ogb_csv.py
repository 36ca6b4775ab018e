"""The CSV layout of ``ogb:DIR`` (ogbn-arxiv, ogbn-products), parsed without ``ogb``.

The files are listed in :mod:`distmb.data.datasets.ogb`. They are parsed block by block
(:data:`BLOCK_BYTES` of decompressed text at a time, so memory stays bounded by the arrays
themselves), strictly (every line holds the expected count of numbers; the error names the
file and line), and converted once into the binary cache
(:mod:`distmb.data.datasets.ogb_cache`), which later loads read while the sources are
unchanged.
"""

from __future__ import annotations

import gzip
import os
import re
import time
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distmb.core.errors import InputError
from distmb.core.progress import meter
from distmb.data.datasets.loader_utils import SPLIT_NAMES, checked_index, one_line
from distmb.data.datasets.ogb_arrays import (
    LAYOUTS,
    OgbArrays,
    check_split_labelled,
    class_ids,
    label_classes,
)
from distmb.data.datasets.ogb_cache import (
    CACHE_DIRNAME,
    CSV_LAYOUT,
    fingerprint,
    read_cache,
    save_array,
    write_cache,
)

#: Decompressed bytes of CSV text parsed at a time.
BLOCK_BYTES = 32 << 20

#: Arrays of the cache of this layout.
_CACHE_ARRAYS = ("src", "dst", "features", "labels") + SPLIT_NAMES

_NEWLINE = ord("\n")
_COMMA = ord(",")
_SIGNS = (ord("-"), ord("+"))
_DIGITS = b"0123456789"
#: Bytes a CSV block of integers / of floats may hold.
_INT_BYTES = _DIGITS + b"+-,\n"
_FLOAT_BYTES = _DIGITS + b"+-.eEnaiftyNAIFTY,\n"  # nan, inf, infinity in any case
_FIELD_SPACE = re.compile(rb"[ \t]*([,\n])[ \t]*")

_REQUIRED_RAW = ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz")


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


def read_csv_layout(d: Path, scheme: str, splits: dict[str, Path], notes: list[str]) -> OgbArrays:
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


def _locate(d: Path, scheme: str, splits: dict[str, Path]) -> _Sources:
    """The CSV layout's files; :class:`InputError` naming the first one missing."""
    raw = d / "raw"
    for name in _REQUIRED_RAW:
        if not (raw / name).is_file():
            raise InputError(f"{raw / name}: no such file (expected {LAYOUTS})")
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
    splits = [read_ids(s.splits[k], num_nodes) for k in SPLIT_NAMES]
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


def read_ids(path: Path, num_nodes: int) -> np.ndarray:
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
