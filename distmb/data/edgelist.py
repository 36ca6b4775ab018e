"""``edgelist:DIR``: plain arrays in a directory.

- ``edges.npy`` (int[E, 2]) or one of ``edges.txt``/``edges.csv``/``edges.tsv`` (two integer
  vertex ids per line separated by whitespace or by a comma, ``#`` starts a comment); each
  row ``u v`` is the edge ``u -> v``;
- ``features.npy``: real[N, F], cast to float32;
- ``labels.npy``: int[N], ``-1`` = unlabelled; N = ``len(labels)``;
- optional ``train_idx.npy``, ``val_idx.npy``, ``test_idx.npy`` (all three or none); without
  them a seeded stratified split with
  :data:`~distmb.data.npz.DEFAULT_SPLIT_FRACTIONS` is drawn.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

from distmb.data.format import NPY_READ_ERRORS
from distmb.data.graph import Graph
from distmb.data.loader_utils import (
    SPLIT_NAMES,
    as_float32,
    int_labels,
    one_line,
    resolve_split,
    unlabelled_note,
)
from distmb.errors import InputError

#: Accepted edge files, the binary one first.
EDGE_FILES = ("edges.npy", "edges.txt", "edges.csv", "edges.tsv")

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
    src, dst = _edges(d, num_nodes)
    notes: list[str] = []
    given = {k: load_npy(d / f"{k}.npy") for k in SPLIT_NAMES if (d / f"{k}.npy").is_file()}
    splits = resolve_split(given, labels, num_classes, seed, str(d), notes)
    notes.append(unlabelled_note(labels))
    return Graph.from_edges(
        d.resolve().name,
        src,
        dst,
        num_nodes,
        features,
        labels,
        *splits,
        num_classes,
        symmetrize=symmetrize,
        source=str(d),
        notes=notes,
    )


def load_npy(path: Path) -> np.ndarray:
    """One ``.npy`` array, read without pickle; :class:`InputError` naming ``path`` otherwise."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        arr = np.load(path, allow_pickle=False)
    except NPY_READ_ERRORS as exc:
        raise InputError(
            f"{path}: not a readable .npy array without pickle ({one_line(exc)})"
        ) from None
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise InputError(f"{path}: is an .npz archive, expected a single .npy array")
    return arr


def _features(path: Path, num_nodes: int) -> np.ndarray:
    """float32[num_nodes, F] from ``features.npy``."""
    features = load_npy(path)
    if features.ndim != 2:
        raise InputError(f"{path}: expected a 2-D array [N, F], got shape {list(features.shape)}")
    if features.shape[0] != num_nodes:
        raise InputError(
            f"{path}: {features.shape[0]} rows but labels.npy has {num_nodes} "
            "entries (one row per vertex expected)"
        )
    return as_float32(features, str(path))


def _edges(d: Path, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(src int64[E], dst int64[E]) from the one edge file in ``d``; ids in ``[0, num_nodes)``."""
    present = [d / name for name in EDGE_FILES if (d / name).is_file()]
    if not present:
        raise InputError(f"{d}: no edge file (expected one of {', '.join(EDGE_FILES)})")
    if len(present) > 1:
        raise InputError(
            f"{d}: several edge files ({', '.join(p.name for p in present)}); keep one"
        )
    path = present[0]
    edges = _edges_npy(path) if path.suffix == ".npy" else _edges_text(path)
    bad = ((edges < 0) | (edges >= num_nodes)).any(axis=1)
    if bad.any():
        e = int(np.argmax(bad))
        where = f"edge {e}" if path.suffix == ".npy" else f"line {_data_line_numbers(path)[e]}"
        raise InputError(
            f"{path}: {where}: {edges[e, 0]} -> {edges[e, 1]} has a vertex id "
            f"outside [0, {num_nodes}) (N = len(labels.npy))"
        )
    return np.ascontiguousarray(edges[:, 0]), np.ascontiguousarray(edges[:, 1])


def _edges_npy(path: Path) -> np.ndarray:
    edges = load_npy(path)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise InputError(
            f"{path}: expected an [E, 2] array of (src, dst) rows, got shape {list(edges.shape)}"
        )
    if edges.size and not np.issubdtype(edges.dtype, np.integer):
        raise InputError(f"{path}: vertex ids must be integers, got dtype {edges.dtype}")
    return edges.astype(np.int64, copy=False)


def _edges_text(path: Path) -> np.ndarray:
    """int64[E, 2] of a text edge list (numpy's C parser; a Python scan locates errors)."""
    delimiter = _delimiter(path)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*input contained no data")
            edges = np.loadtxt(
                path,
                dtype=np.int64,
                comments=_COMMENT,
                delimiter=delimiter,
                ndmin=2,
                encoding="utf-8",
            )
    except (ValueError, UnicodeDecodeError) as exc:
        lineno, line = _first_bad_line(path, delimiter)
        if lineno:
            sep = "a comma" if delimiter else "whitespace"
            raise InputError(
                f"{path}: line {lineno}: expected two integer vertex ids separated "
                f"by {sep}, got {line!r}"
            ) from None
        raise InputError(f"{path}: not a readable edge list ({one_line(exc)})") from None
    except OSError as exc:
        raise InputError(f"{path}: not readable ({one_line(exc)})") from None
    return edges.reshape(-1, 2) if edges.size == 0 else edges


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
