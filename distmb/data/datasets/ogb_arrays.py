"""What both layouts of ``ogb:DIR`` are read into, and the checks of OGB labels they share.

:class:`OgbArrays` is the result of :func:`~distmb.data.datasets.ogb_csv.read_csv_layout` and
:func:`~distmb.data.datasets.ogb_npz.read_npz_layout`; :func:`class_ids`,
:func:`label_classes` and :func:`check_split_labelled` turn OGB's labels (a float with
``nan``, or an integer with ``-1``, for an unlabelled vertex) into int64 class ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distmb.core.errors import InputError
from distmb.data.datasets.loader_utils import SPLIT_NAMES, class_count
from distmb.data.graph import UNLABELED

#: The split files of both layouts, as error messages describe them.
SPLIT_LAYOUT = "split/<scheme>/{train,valid,test}.csv.gz"
#: Both layouts, as error messages describe them.
LAYOUTS = (
    f"raw/edge.csv.gz, raw/node-feat.csv.gz, raw/node-label.csv.gz and {SPLIT_LAYOUT}"
    f", or raw/data.npz, raw/node-label.npz and {SPLIT_LAYOUT}"
)


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
