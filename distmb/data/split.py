"""Seeded train/val/test splits for datasets that ship none."""

from __future__ import annotations

import numpy as np

from distmb.core.errors import InputError
from distmb.data.graph import UNLABELED


def stratified_split(
    labels: np.ndarray,
    num_classes: int,
    train_frac: float,
    val_frac: float,
    test_frac: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split the labelled vertices class by class into train/val/test.

    Args:
        labels: int64[num_nodes], class or :data:`UNLABELED`.
        train_frac, val_frac, test_frac: fractions of each class's vertices (sum <= 1).
        seed: RNG seed; the same seed gives the same split.

    Returns:
        (train_idx, val_idx, test_idx), each int64, ascending and disjoint.
    """
    for name, frac in (("train", train_frac), ("val", val_frac), ("test", test_frac)):
        if not 0.0 <= frac <= 1.0:
            raise InputError(f"{name} fraction must be in [0, 1], got {frac}")
    total = train_frac + val_frac + test_frac
    if total > 1.0 + 1e-9:
        raise InputError(f"train+val+test fractions must sum to at most 1, got {total}")
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    bounds = np.searchsorted(sorted_labels, np.arange(num_classes + 1))
    for c in range(num_classes):
        members = order[bounds[c] : bounds[c + 1]]
        members = members[rng.permutation(members.size)]
        n_train = int(round(train_frac * members.size))
        n_val = int(round(val_frac * members.size))
        n_test = min(int(round(test_frac * members.size)), members.size - n_train - n_val)
        parts[0].append(members[:n_train])
        parts[1].append(members[n_train : n_train + n_val])
        parts[2].append(members[n_train + n_val : n_train + n_val + n_test])
    out = tuple(
        np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, np.int64) for p in parts
    )
    assert all(not np.any(labels[o] == UNLABELED) for o in out)
    return out  # type: ignore[return-value]
