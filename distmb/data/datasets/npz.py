"""``npz:FILE``: the GNN-benchmark ``.npz`` layout of Shchur et al. (``cora_ml.npz``, ...).

Keys read (everything else, e.g. the pickled ``node_names``/``class_names``, is ignored):

- adjacency as CSR parts ``adj_data``, ``adj_indices``, ``adj_indptr``, ``adj_shape``
  (row ``i``, column ``j`` is the edge ``i -> j``);
- attributes as CSR parts ``attr_data``, ``attr_indices``, ``attr_indptr``, ``attr_shape``
  or as a dense ``attr_matrix``;
- ``labels`` (1-D ints, ``-1`` = unlabelled) or CSR parts ``labels_data``, ``labels_indices``,
  ``labels_indptr``, ``labels_shape`` (class = column of the largest entry of the row; a row
  without entries is unlabelled);
- optional ``train_idx``, ``val_idx``, ``test_idx``; without them a seeded stratified split
  with :data:`DEFAULT_SPLIT_FRACTIONS` is drawn.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from distmb.core.errors import InputError
from distmb.data.csr import EdgeChunks, csr_edge_chunks
from distmb.data.datasets.loader_utils import (
    SPLIT_NAMES,
    argmax_rows,
    as_float32,
    check_csr,
    csr_shape,
    csr_to_coo,
    csr_to_dense,
    int_labels,
    one_line,
    resolve_split,
    unlabelled_note,
)
from distmb.data.graph import UNLABELED, Graph
from distmb.data.store.format import NPY_READ_ERRORS

_ADJ_KEYS = ("adj_data", "adj_indices", "adj_indptr", "adj_shape")
_ATTR_KEYS = ("attr_data", "attr_indices", "attr_indptr", "attr_shape")
_DENSE_ATTR_KEY = "attr_matrix"
_LABEL_KEY = "labels"
_CSR_LABEL_KEYS = ("labels_data", "labels_indices", "labels_indptr", "labels_shape")
_EXPECTED_KEYS = (
    f"{', '.join(_ADJ_KEYS)}; {', '.join(_ATTR_KEYS)} or {_DENSE_ATTR_KEY}; "
    f"{_LABEL_KEY} or {', '.join(_CSR_LABEL_KEYS)}; optionally {', '.join(SPLIT_NAMES)}"
)


def load_npz(path: str, *, symmetrize: bool = True, seed: int = 0) -> Graph:
    """Load a GNN-benchmark ``.npz`` file (see the module docstring for the keys).

    Args:
        path: the ``.npz`` file; the graph is named after its stem (``cora_ml``).
        symmetrize: add every edge in reverse too.
        seed: seed of the stratified split drawn when the file holds no split.

    Returns:
        A validated :class:`Graph`: features float32[N, F], labels int64[N]
        (:data:`UNLABELED` where the file has no label), splits int64 ascending.
    """
    p = Path(path)
    source = str(p)
    if not p.is_file():
        raise InputError(f"{source}: no such file (expected a GNN-benchmark .npz archive)")
    arrays = _read_archive(p)
    num_nodes, edges = _adjacency(arrays, source)
    features = _attributes(arrays, source, num_nodes)
    labels, num_classes = _labels(arrays, source, num_nodes)
    notes: list[str] = []
    given = {k: arrays[k] for k in SPLIT_NAMES if k in arrays}
    splits = resolve_split(given, labels, num_classes, seed, source, notes)
    notes.append(unlabelled_note(labels))
    return Graph.from_edge_chunks(
        p.stem,
        edges,
        num_nodes,
        features,
        labels,
        *splits,
        num_classes,
        symmetrize=symmetrize,
        source=source,
        notes=notes,
    )


def _read_archive(path: Path) -> dict[str, np.ndarray]:
    """Every array the loader may need, read with ``allow_pickle=False``."""
    source = str(path)
    wanted = _ADJ_KEYS + _ATTR_KEYS + (_DENSE_ATTR_KEY, _LABEL_KEY) + _CSR_LABEL_KEYS + SPLIT_NAMES
    try:
        archive = np.load(path, allow_pickle=False)
    except NPY_READ_ERRORS as exc:
        raise InputError(f"{source}: not a readable .npz archive ({one_line(exc)})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise InputError(f"{source}: holds a single .npy array, expected an .npz archive")
    out: dict[str, np.ndarray] = {}
    with archive:
        for key in wanted:
            if key not in archive.files:
                continue
            try:
                out[key] = archive[key]
            except ValueError as exc:  # object arrays need pickle, or a corrupt .npy header
                raise InputError(
                    f"{source}: array {key!r} cannot be read without pickle or is corrupt "
                    f"({one_line(exc)})"
                ) from None
            except (OSError, EOFError, zipfile.BadZipFile) as exc:
                raise InputError(f"{source}: array {key!r} is corrupt ({one_line(exc)})") from None
    return out


def _require(arrays: dict[str, np.ndarray], keys: tuple[str, ...], source: str) -> None:
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise InputError(f"{source}: missing {', '.join(missing)}; expected keys: {_EXPECTED_KEYS}")


def _adjacency(arrays: dict[str, np.ndarray], source: str) -> tuple[int, EdgeChunks]:
    """(num_nodes, the edges row -> column as chunks) from the adjacency CSR parts, which
    are read in place (the graph's CSR is built from blocks of rows; no COO copy)."""
    _require(arrays, _ADJ_KEYS, source)
    shape = csr_shape(arrays["adj_shape"], f"{source}: adj_shape")
    if shape[0] != shape[1]:
        raise InputError(f"{source}: adj_shape must be square [N, N], got {list(shape)}")
    indptr, indices, _ = check_csr(
        arrays["adj_data"], arrays["adj_indices"], arrays["adj_indptr"], shape, f"{source}: adj_"
    )
    return shape[0], csr_edge_chunks(indptr, indices, rows_are_targets=False)


def _attributes(arrays: dict[str, np.ndarray], source: str, num_nodes: int) -> np.ndarray:
    """float32[num_nodes, F] from ``attr_matrix`` or the ``attr_*`` CSR parts."""
    if _DENSE_ATTR_KEY in arrays:
        features = arrays[_DENSE_ATTR_KEY]
        what = f"{source}: {_DENSE_ATTR_KEY}"
        if features.ndim != 2:
            raise InputError(f"{what} must be 2-D [N, F], got shape {list(features.shape)}")
        features = as_float32(features, what)
    else:
        _require(arrays, _ATTR_KEYS, source)
        what = f"{source}: attr_"
        shape = csr_shape(arrays["attr_shape"], f"{what}shape")
        features = csr_to_dense(
            arrays["attr_data"], arrays["attr_indices"], arrays["attr_indptr"], shape, what
        )
    if features.shape[0] != num_nodes:
        raise InputError(
            f"{what.rstrip('_')} has {features.shape[0]} rows but the adjacency has "
            f"{num_nodes} vertices"
        )
    return features


def _labels(arrays: dict[str, np.ndarray], source: str, num_nodes: int) -> tuple[np.ndarray, int]:
    """(labels int64[num_nodes], num_classes) from ``labels`` or the ``labels_*`` CSR parts."""
    if _LABEL_KEY in arrays:
        labels, num_classes = int_labels(arrays[_LABEL_KEY], f"{source}: {_LABEL_KEY}")
    else:
        _require(arrays, _CSR_LABEL_KEYS, source)
        what = f"{source}: labels_"
        shape = csr_shape(arrays["labels_shape"], f"{what}shape")
        rows, cols, data = csr_to_coo(
            arrays["labels_data"], arrays["labels_indices"], arrays["labels_indptr"], shape, what
        )
        labels = argmax_rows(rows, cols, data, shape[0])
        num_classes = shape[1]
        if not (labels != UNLABELED).any():
            raise InputError(f"{source}: labels_*: no vertex has a label")
    if labels.shape[0] != num_nodes:
        raise InputError(
            f"{source}: {labels.shape[0]} labels but the adjacency has {num_nodes} vertices"
        )
    return labels, num_classes
