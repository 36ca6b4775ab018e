"""The graph file that distmb's side writes and a peer framework's side reads (numpy only).

``benchmarks/peers/dgl_vs_distmb.py`` writes the graph it trains on into one uncompressed
``.npz`` (atomically), and the peer's worker, which runs in another virtual environment
without distmb, reads it back with :func:`load_graph_arrays`: both sides train on identical
data. Keys (:data:`KEYS`):

- ``indptr``: int64[num_nodes + 1] and ``indices``: int64[num_edges], the **in-edge** CSR of
  distmb's :class:`~distmb.data.graph.Graph`: ``indices[indptr[v]:indptr[v + 1]]`` are the
  sources ``u`` of the edges ``u -> v`` (:func:`edge_list` turns it into ``(src, dst)``);
- ``features``: float32[num_nodes, feat_dim];
- ``labels``: int64[num_nodes], in ``[0, num_classes)`` (or -1: unlabelled);
- ``train_idx``, ``val_idx``, ``test_idx``: int64 vertex ids; ``train_idx`` is the
  training set both sides run (the benchmark may cut it to a whole number of batches);
- ``num_classes``: int64 scalar.

Reading uses ``allow_pickle=False``; a missing key, a wrong dtype or shape, or an id out of
range raises :class:`GraphFileError` naming the file and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import numpy as np

#: Every key of the file and its dtype (``num_classes`` is a 0-d array).
KEYS: dict[str, np.dtype] = {
    "indptr": np.dtype(np.int64),
    "indices": np.dtype(np.int64),
    "features": np.dtype(np.float32),
    "labels": np.dtype(np.int64),
    "train_idx": np.dtype(np.int64),
    "val_idx": np.dtype(np.int64),
    "test_idx": np.dtype(np.int64),
    "num_classes": np.dtype(np.int64),
}

#: The vertex-id arrays of the splits.
SPLITS = ("train_idx", "val_idx", "test_idx")

#: Label of an unlabelled vertex (distmb's ``UNLABELED``).
UNLABELED = -1


class GraphFileError(ValueError):
    """The graph file is missing, unreadable or inconsistent."""


def write_graph_arrays(f: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` (exactly :data:`KEYS`, with their dtypes) as an uncompressed ``.npz``
    into the open binary file ``f`` (the caller makes the write atomic)."""
    missing = sorted(set(KEYS) - set(arrays))
    extra = sorted(set(arrays) - set(KEYS))
    if missing or extra:
        raise GraphFileError(f"graph arrays: missing keys {missing}, unexpected keys {extra}")
    np.savez(f, **{k: np.asarray(arrays[k], dtype=KEYS[k]) for k in KEYS})


def load_graph_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Read and check a graph file written by :func:`write_graph_arrays`.

    Returns:
        ``{key: array}`` for every key of :data:`KEYS` (``num_classes`` as a 0-d int64).

    Raises:
        GraphFileError: naming ``path`` and the first problem found.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            missing = [k for k in KEYS if k not in archive.files]
            if missing:
                raise GraphFileError(f"{path}: missing keys {missing}; expected {', '.join(KEYS)}")
            arrays = {k: archive[k] for k in KEYS}
    except (OSError, ValueError) as err:
        if isinstance(err, GraphFileError):
            raise
        raise GraphFileError(f"{path}: not a readable graph .npz ({err})") from None
    check_graph_arrays(arrays, str(path))
    return arrays


def check_graph_arrays(arrays: dict[str, np.ndarray], source: str) -> None:
    """Raise :class:`GraphFileError` (prefixed with ``source``) unless the arrays have the
    dtypes of :data:`KEYS` and a consistent CSR, features, labels and splits."""

    def fail(message: str) -> None:
        raise GraphFileError(f"{source}: {message}")

    for key, dtype in KEYS.items():
        if arrays[key].dtype != dtype:
            fail(f"{key} has dtype {arrays[key].dtype}; expected {dtype}")
    indptr, indices = arrays["indptr"], arrays["indices"]
    features, labels = arrays["features"], arrays["labels"]
    if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0:
        fail("indptr must be 1-D and start at 0")
    num_nodes = indptr.size - 1
    if np.any(np.diff(indptr) < 0) or indptr[-1] != indices.size or indices.ndim != 1:
        fail(f"indptr must be non-decreasing and end at len(indices) = {indices.size}")
    if indices.size and (indices.min() < 0 or indices.max() >= num_nodes):
        fail(f"indices must lie in [0, {num_nodes})")
    if features.ndim != 2 or features.shape[0] != num_nodes:
        fail(f"features has shape {list(features.shape)}; expected [{num_nodes}, feat_dim]")
    if labels.shape != (num_nodes,):
        fail(f"labels has shape {list(labels.shape)}; expected [{num_nodes}]")
    num_classes = arrays["num_classes"]
    if num_classes.shape != () or int(num_classes) < 1:
        fail("num_classes must be a positive scalar")
    if labels.size and (labels.min() < UNLABELED or labels.max() >= int(num_classes)):
        fail(f"labels must lie in [0, {int(num_classes)}) or be {UNLABELED}")
    for split in SPLITS:
        ids = arrays[split]
        if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= num_nodes)):
            fail(f"{split} must be 1-D vertex ids in [0, {num_nodes})")
        if ids.size and np.any(labels[ids] == UNLABELED):
            fail(f"{split} holds unlabelled vertices")


def edge_list(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)``, int64[num_edges] each: the edges ``src[i] -> dst[i]`` of the in-edge
    CSR, in CSR order (what a framework's ``graph((src, dst))`` constructor takes)."""
    indptr = arrays["indptr"]
    dst = np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))
    return arrays["indices"], dst
