"""Helpers shared by the file loaders (npz, planetoid, ogb, edgelist): CSR decoding,
label and split checks, one-line error text."""

from __future__ import annotations

import numpy as np

from distmb.core.errors import InputError
from distmb.data.graph import UNLABELED
from distmb.data.split import stratified_split

#: (train, val, test) fractions of every class's labelled vertices when a dataset ships no split.
DEFAULT_SPLIT_FRACTIONS = (0.1, 0.1, 0.8)

#: Names of the three split arrays, in order.
SPLIT_NAMES = ("train_idx", "val_idx", "test_idx")


def one_line(exc: BaseException) -> str:
    """``exc`` as one line of text (error messages must fit on one line)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


#: Rows converted per step by :func:`as_float32` (bounds the temporaries).
_CONVERT_ROWS = 1 << 16


def as_float32(a: np.ndarray, what: str) -> np.ndarray:
    """A real-valued array as C-contiguous float32; :class:`InputError` for other dtypes.

    A C-contiguous float32 array (a read-only memory map included) is returned as is;
    anything else is converted into a new array :data:`_CONVERT_ROWS` rows at a time, so a
    memory-mapped source is never copied whole in its own dtype.
    """
    if not (
        np.issubdtype(a.dtype, np.floating)
        or np.issubdtype(a.dtype, np.integer)
        or a.dtype == np.bool_
    ):
        raise InputError(f"{what} must hold real numbers, got dtype {a.dtype}")
    if a.dtype == np.float32 and a.flags.c_contiguous:
        return a
    if a.ndim == 0:
        return np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty(a.shape, dtype=np.float32)
    for lo in range(0, a.shape[0], _CONVERT_ROWS):
        out[lo : lo + _CONVERT_ROWS] = a[lo : lo + _CONVERT_ROWS]
    return out


def csr_shape(shape: np.ndarray, what: str) -> tuple[int, int]:
    """A CSR ``shape`` array (two non-negative ints) as a tuple."""
    shape = np.asarray(shape)
    if shape.shape != (2,) or not np.issubdtype(shape.dtype, np.integer) or (shape < 0).any():
        raise InputError(f"{what} must be two non-negative integers, got {shape.tolist()!r}")
    return int(shape[0]), int(shape[1])


def check_csr(
    data: np.ndarray | None,
    indices: np.ndarray,
    indptr: np.ndarray,
    shape: tuple[int, int],
    what: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Check CSR parts without expanding them.

    Args:
        data: values[nnz] (any real dtype) or ``None`` when only the pattern matters.
        indices: int[nnz] column of every entry, in ``[0, shape[1])``.
        indptr: int[shape[0] + 1] row pointers, ``0`` first, non-decreasing, ``nnz`` last.
        what: prefix of the part names in error messages, e.g. ``"FILE: adj_"`` gives
            ``"FILE: adj_indptr ..."``.

    Returns:
        (indptr int64[shape[0] + 1], indices as given (any integer dtype, not copied),
        data or None).
    """
    indices, indptr = np.asarray(indices), np.asarray(indptr)
    for name, arr in (("indices", indices), ("indptr", indptr)):
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise InputError(
                f"{what}{name} must be a 1-D integer array, got {arr.dtype}{list(arr.shape)}"
            )
    nnz = indices.shape[0]
    if indptr.shape[0] != shape[0] + 1:
        raise InputError(
            f"{what}indptr has {indptr.shape[0]} entries, expected rows + 1 = "
            f"{shape[0] + 1} for shape {list(shape)}"
        )
    indptr = indptr.astype(np.int64)
    if indptr[0] != 0 or indptr[-1] != nnz or (np.diff(indptr) < 0).any():
        raise InputError(
            f"{what}indptr must rise from 0 to the number of entries ({nnz}) without decreasing"
        )
    if nnz and (int(indices.min()) < 0 or int(indices.max()) >= shape[1]):
        raise InputError(f"{what}indices holds a column outside [0, {shape[1]})")
    if data is not None:
        data = np.asarray(data)
        if data.shape != (nnz,):
            raise InputError(
                f"{what}data has shape {list(data.shape)}, expected [{nnz}] "
                "(one value per entry of indices)"
            )
    return indptr, indices, data


def csr_to_coo(
    data: np.ndarray | None,
    indices: np.ndarray,
    indptr: np.ndarray,
    shape: tuple[int, int],
    what: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Check CSR parts (:func:`check_csr`) and expand them to coordinates.

    Returns:
        (rows int64[nnz], cols int64[nnz], data or None).
    """
    indptr, indices, data = check_csr(data, indices, indptr, shape, what)
    rows = np.repeat(np.arange(shape[0], dtype=np.int64), np.diff(indptr))
    return rows, indices.astype(np.int64), data


def csr_to_dense(
    data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: tuple[int, int], what: str
) -> np.ndarray:
    """float32[shape] dense matrix of checked CSR parts (repeated entries are summed)."""
    rows, cols, values = csr_to_coo(data, indices, indptr, shape, what)
    assert values is not None
    values = as_float32(values, f"{what}data")
    dense = np.zeros(shape, dtype=np.float32)
    np.add.at(dense, (rows, cols), values)
    return dense


def argmax_rows(rows: np.ndarray, cols: np.ndarray, data: np.ndarray, num_rows: int) -> np.ndarray:
    """int64[num_rows]: per row the column of its largest entry (smallest column on ties);
    :data:`UNLABELED` for rows without entries."""
    labels = np.full(num_rows, UNLABELED, dtype=np.int64)
    if rows.size == 0:
        return labels
    order = np.lexsort((cols, -np.asarray(data, dtype=np.float64), rows))
    first = np.ones(order.size, dtype=bool)
    first[1:] = rows[order[1:]] != rows[order[:-1]]
    labels[rows[order[first]]] = cols[order[first]]
    return labels


def int_labels(labels: np.ndarray, what: str) -> tuple[np.ndarray, int]:
    """Check a 1-D integer label array (``-1`` = unlabelled).

    Returns:
        (labels int64[N], num_classes = largest label + 1).
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise InputError(
            f"{what} must be 1-D (one class per vertex), got shape {list(labels.shape)}"
        )
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise InputError(f"{what} must be integers, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    bad = labels < UNLABELED
    if bad.any():
        v = int(np.argmax(bad))
        raise InputError(
            f"{what}: label {int(labels[v])} of vertex {v} is out of range "
            f"(expected a class id >= 0, or {UNLABELED} for unlabelled)"
        )
    if not (labels != UNLABELED).any():
        raise InputError(f"{what}: no vertex has a label")
    return labels, class_count(labels, what)


def class_count(labels: np.ndarray, what: str) -> int:
    """``largest label + 1``, refused above :func:`~distmb.data.graph.max_classes` (the
    same bound :meth:`Graph.validate` applies): a stray label such as 10**9 would otherwise
    size the per-class loops and buffers of splitting and partitioning, and the
    model's output layer, before anything else could object."""
    from distmb.data.graph import max_classes

    num_classes = int(labels.max()) + 1
    n_labelled = int((labels != UNLABELED).sum())
    if num_classes > max_classes(n_labelled):
        v = int(np.argmax(labels))
        raise InputError(
            f"{what}: label {num_classes - 1} of vertex {v} implies {num_classes} classes for "
            f"{n_labelled} labelled vertices; class ids must be 0..K-1: relabel the classes"
        )
    return num_classes


def checked_index(idx: np.ndarray, num_nodes: int, what: str) -> np.ndarray:
    """A vertex-id array (split) as int64, sorted; :class:`InputError` for non-integers,
    ids outside ``[0, num_nodes)`` or repeats."""
    idx = np.asarray(idx)
    if idx.ndim != 1:
        raise InputError(f"{what} must be 1-D, got shape {list(idx.shape)}")
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise InputError(f"{what} must hold integer vertex ids, got dtype {idx.dtype}")
    idx = np.sort(idx.astype(np.int64))
    if idx.size and (idx[0] < 0 or idx[-1] >= num_nodes):
        bad = idx[0] if idx[0] < 0 else idx[-1]
        raise InputError(f"{what}: vertex id {int(bad)} is outside [0, {num_nodes})")
    repeats = idx[1:] == idx[:-1]
    if repeats.any():
        raise InputError(f"{what}: vertex id {int(idx[1:][repeats][0])} is listed twice")
    return idx


def resolve_split(
    given: dict[str, np.ndarray],
    labels: np.ndarray,
    num_classes: int,
    seed: int,
    source: str,
    notes: list[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The dataset's own split when all of :data:`SPLIT_NAMES` are ``given``, else a seeded
    stratified split with :data:`DEFAULT_SPLIT_FRACTIONS`; what was used goes to ``notes``.

    Returns:
        (train_idx, val_idx, test_idx), int64 ascending.
    """
    if given and len(given) != len(SPLIT_NAMES):
        missing = [k for k in SPLIT_NAMES if k not in given]
        raise InputError(
            f"{source}: has {', '.join(sorted(given))} but not "
            f"{', '.join(missing)}; give all of {', '.join(SPLIT_NAMES)} or none"
        )
    n = labels.shape[0]
    if given:
        out = tuple(checked_index(given[k], n, f"{source}: {k}") for k in SPLIT_NAMES)
        notes.append(
            "split: train/val/test as given in the dataset "
            f"({out[0].size}/{out[1].size}/{out[2].size})"
        )
        return out  # type: ignore[return-value]
    train, val, test = DEFAULT_SPLIT_FRACTIONS
    out = stratified_split(labels, num_classes, train, val, test, seed)
    notes.append(
        f"split: none in the dataset; seeded stratified split (seed {seed}, "
        f"per class {train:g}/{val:g}/{test:g} of the labelled vertices -> "
        f"{out[0].size}/{out[1].size}/{out[2].size})"
    )
    return out


def unlabelled_note(labels: np.ndarray) -> str:
    """A note line counting the unlabelled vertices."""
    return f"{int((labels == UNLABELED).sum())} of {labels.shape[0]} vertices unlabelled"
