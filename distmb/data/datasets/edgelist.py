"""``edgelist:DIR``: plain arrays in a directory.

- ``edges.npy`` (int[E, 2]) or one of ``edges.txt``/``edges.csv``/``edges.tsv`` (two integer
  vertex ids per line separated by whitespace or by a comma, ``#`` starts a comment); each
  row ``u v`` is the edge ``u -> v``;
- ``features.npy``: real[N, F], cast to float32 (a float32 file stays memory-mapped);
- ``labels.npy``: int[N], ``-1`` = unlabelled; N = ``len(labels)``;
- optional ``train_idx.npy``, ``val_idx.npy``, ``test_idx.npy`` (all three or none); without
  them a seeded stratified split with
  :data:`~distmb.data.datasets.npz.DEFAULT_SPLIT_FRACTIONS` is drawn.

The edges are read in chunks into the graph's compact CSR (:func:`~distmb.data.csr.build_csr`):
``edges.npy`` block by block with plain reads (never mapped or loaded whole), a text file
parsed block by block into int32 pairs (int64 beyond 2**31 - 1 vertices) that are the only
copy held besides the CSR.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NoReturn

import numpy as np

from distmb.core.errors import InputError
from distmb.data.csr import EDGE_CHUNK, EdgeChunks
from distmb.data.datasets.loader_utils import (
    SPLIT_NAMES,
    as_float32,
    int_labels,
    one_line,
    resolve_split,
    unlabelled_note,
)
from distmb.data.graph import Graph
from distmb.data.store.format import NPY_READ_ERRORS, index_dtype

#: Accepted edge files, the binary one first.
EDGE_FILES = ("edges.npy", "edges.txt", "edges.csv", "edges.tsv")

#: Bytes of a text edge list parsed at a time (whole lines).
_TEXT_BLOCK_BYTES = 16 << 20

_COMMENT = "#"
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = np.iinfo(np.int64).max


def load_edgelist(directory: str, *, symmetrize: bool = True, seed: int = 0) -> Graph:
    """Load an edge-list directory (see the module docstring).

    Args:
        directory: the folder; its basename names the graph.
        symmetrize: add every edge in reverse too.
        seed: seed of the stratified split drawn when the folder holds no split.

    Returns:
        A validated :class:`Graph`: features float32[N, F], labels int64[N], splits int64
        ascending.
    """
    d = Path(directory)
    if not d.is_dir():
        raise InputError(
            f"{d}: no such directory (expected edges.npy or edges.txt/.csv/.tsv, "
            "features.npy and labels.npy)"
        )
    labels_path = d / "labels.npy"
    labels, num_classes = int_labels(load_npy(labels_path), str(labels_path))
    num_nodes = labels.shape[0]
    features = _features(d / "features.npy", num_nodes)
    edges = _edges(d, num_nodes)
    notes: list[str] = []
    given = {k: load_npy(d / f"{k}.npy") for k in SPLIT_NAMES if (d / f"{k}.npy").is_file()}
    splits = resolve_split(given, labels, num_classes, seed, str(d), notes)
    notes.append(unlabelled_note(labels))
    return Graph.from_edge_chunks(
        d.resolve().name,
        edges,
        num_nodes,
        features,
        labels,
        *splits,
        num_classes,
        symmetrize=symmetrize,
        source=str(d),
        notes=notes,
    )


def load_npy(path: Path, *, mmap: bool = False) -> np.ndarray:
    """One ``.npy`` array, read without pickle (memory-mapped read-only with ``mmap``);
    :class:`InputError` naming ``path`` otherwise."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except NPY_READ_ERRORS as exc:
        raise InputError(
            f"{path}: not a readable .npy array without pickle ({one_line(exc)})"
        ) from None
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise InputError(f"{path}: is an .npz archive, expected a single .npy array")
    return arr


def _features(path: Path, num_nodes: int) -> np.ndarray:
    """float32[num_nodes, F] from ``features.npy``: the file itself, memory-mapped, when it
    holds C-order float32 (the partitioner then streams rows from it), else a converted copy
    in memory."""
    features = load_npy(path, mmap=True)
    if features.ndim != 2:
        raise InputError(f"{path}: expected a 2-D array [N, F], got shape {list(features.shape)}")
    if features.shape[0] != num_nodes:
        raise InputError(
            f"{path}: {features.shape[0]} rows but labels.npy has {num_nodes} "
            "entries (one row per vertex expected)"
        )
    return as_float32(features, str(path))


def _edges(d: Path, num_nodes: int) -> EdgeChunks:
    """The edges of the one edge file in ``d`` as a chunk source; ids checked against
    ``[0, num_nodes)`` with the file's edge or line number in the error."""
    present = [d / name for name in EDGE_FILES if (d / name).is_file()]
    if not present:
        raise InputError(f"{d}: no edge file (expected one of {', '.join(EDGE_FILES)})")
    if len(present) > 1:
        raise InputError(
            f"{d}: several edge files ({', '.join(p.name for p in present)}); keep one"
        )
    path = present[0]
    if path.suffix == ".npy":
        return _npy_edge_chunks(path, num_nodes)
    blocks = []
    first = 0
    for block in _text_edge_blocks(path):
        _check_ids(path, block[:, 0], block[:, 1], num_nodes, first)
        first += block.shape[0]
        dtype = index_dtype(num_nodes)
        blocks.append((block[:, 0].astype(dtype), block[:, 1].astype(dtype)))
        del block
    return lambda: iter(blocks)


def _check_ids(path: Path, src: np.ndarray, dst: np.ndarray, num_nodes: int, first: int) -> None:
    """Raise naming the first edge (``.npy``: its index; text: its line) of a chunk whose
    first edge is edge ``first`` of the file, when an id lies outside ``[0, num_nodes)``."""
    bad = (src < 0) | (src >= num_nodes) | (dst < 0) | (dst >= num_nodes)
    if not bad.any():
        return
    k = int(np.argmax(bad))
    e = first + k
    where = f"edge {e}" if path.suffix == ".npy" else f"line {_data_line_numbers(path)[e]}"
    raise InputError(
        f"{path}: {where}: {src[k]} -> {dst[k]} has a vertex id "
        f"outside [0, {num_nodes}) (N = len(labels.npy))"
    )


def _npy_edge_chunks(path: Path, num_nodes: int) -> EdgeChunks:
    """``edges.npy`` (int[E, 2], C or Fortran order) read in blocks of
    :data:`~distmb.data.csr.EDGE_CHUNK` rows with positioned reads: the file is never held
    whole in memory (nor mapped, so its pages do not count in this process' memory)."""
    edges = load_npy(path, mmap=True)  # only the header is used: shape, dtype, data offset
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise InputError(
            f"{path}: expected an [E, 2] array of (src, dst) rows, got shape {list(edges.shape)}"
        )
    if edges.size and not np.issubdtype(edges.dtype, np.integer):
        raise InputError(f"{path}: vertex ids must be integers, got dtype {edges.dtype}")
    count, dtype, offset = edges.shape[0], edges.dtype, int(edges.offset)
    by_rows = bool(edges.flags.c_contiguous)  # else Fortran order: all sources, then targets
    del edges

    def read(f: BinaryIO, start: int, items: int) -> np.ndarray:
        f.seek(offset + start * dtype.itemsize)
        out = np.fromfile(f, dtype=dtype, count=items)
        if out.shape[0] != items:
            raise InputError(f"{path}: truncated (expected {count} edges)")
        return out

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        with open(path, "rb") as f:
            for lo in range(0, count, EDGE_CHUNK):
                rows = min(EDGE_CHUNK, count - lo)
                if by_rows:
                    pairs = read(f, 2 * lo, 2 * rows).reshape(rows, 2)
                    src, dst = pairs[:, 0], pairs[:, 1]
                else:
                    src, dst = read(f, lo, rows), read(f, count + lo, rows)
                _check_ids(path, src, dst, num_nodes, lo)
                yield src, dst

    return chunks


def _text_edge_blocks(path: Path) -> Iterator[np.ndarray]:
    """int64[k, 2] blocks of a text edge list, each parsed by numpy's C parser from about
    :data:`_TEXT_BLOCK_BYTES` of whole lines (a Python scan locates errors)."""
    delimiter = _delimiter(path)
    try:
        with open(path, "rb") as f:
            tail = b""
            while True:
                data = f.read(_TEXT_BLOCK_BYTES)
                text = tail + data
                cut = text.rfind(b"\n") + 1 if data else len(text)
                tail = text[cut:]
                if cut:
                    block = _parse_text_block(path, text[:cut].decode("utf-8"), delimiter)
                    if block.size:
                        yield block
                if not data:
                    break
    except UnicodeDecodeError as exc:
        _raise_bad_line(path, delimiter, exc)
    except OSError as exc:
        raise InputError(f"{path}: not readable ({one_line(exc)})") from None


def _parse_text_block(path: Path, text: str, delimiter: str | None) -> np.ndarray:
    """int64[k, 2] of whole lines of a text edge list."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*input contained no data")
            edges = np.loadtxt(
                io.StringIO(text),
                dtype=np.int64,
                comments=_COMMENT,
                delimiter=delimiter,
                ndmin=2,
            )
    except ValueError as exc:
        _raise_bad_line(path, delimiter, exc)
    return edges.reshape(-1, 2) if edges.size == 0 else edges


def _raise_bad_line(path: Path, delimiter: str | None, exc: Exception) -> NoReturn:
    """Raise :class:`InputError` naming the first malformed line of the file."""
    lineno, line = _first_bad_line(path, delimiter)
    if lineno:
        sep = "a comma" if delimiter else "whitespace"
        raise InputError(
            f"{path}: line {lineno}: expected two integer vertex ids separated "
            f"by {sep}, got {line!r}"
        ) from None
    raise InputError(f"{path}: not a readable edge list ({one_line(exc)})") from None


def _data_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text without comment)`` of every non-blank line (slow; errors only)."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            text = line.split(_COMMENT, 1)[0].strip()
            if text:
                out.append((lineno, text))
    return out


def _delimiter(path: Path) -> str | None:
    """``","`` when the first data line holds a comma, else ``None`` (whitespace)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                text = line.split(_COMMENT, 1)[0].strip()
                if text:
                    return "," if "," in text else None
    except OSError as exc:
        raise InputError(f"{path}: not readable ({one_line(exc)})") from None
    return None


def _first_bad_line(path: Path, delimiter: str | None) -> tuple[int, str]:
    """``(line number, text)`` of the first line that is not two integers (0 if none)."""
    for lineno, text in _data_lines(path):
        fields = [f.strip() for f in text.split(delimiter)]
        if len(fields) != 2 or not all(
            _INTEGER.fullmatch(f) and abs(int(f)) <= _INT64_MAX for f in fields
        ):
            return lineno, text
    return 0, ""


def _data_line_numbers(path: Path) -> list[int]:
    """Line number of every edge, in order."""
    return [lineno for lineno, _ in _data_lines(path)]
