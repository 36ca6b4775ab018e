"""An epoch's batches, known up front: the seeds' order, their split into batches, and the
order the BatchLoader produces them in (:class:`EpochPlan`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class EpochPlan:
    """An epoch's batches, known ahead.

    A batch's identity (its index in :attr:`batches`) fixes its random stream; the
    production order is separate, so a reordering policy may permute the batches of a
    superbatch without changing what any batch contains.

    Attributes:
        epoch: the epoch.
        batches: ``batches[i]`` is batch ``i``'s seeds (int64, ``VID_p``).
        order: the production order, a permutation of ``range(len(batches))`` that only
            permutes within consecutive superbatches.
        superbatch: K, batches per superbatch.
    """

    epoch: int
    batches: list[np.ndarray]
    order: list[int]
    superbatch: int

    def __len__(self) -> int:
        return len(self.batches)

    def superbatches(self) -> list[list[int]]:
        """The production order cut into consecutive superbatches of K indices."""
        k = self.superbatch
        return [self.order[i : i + k] for i in range(0, len(self.order), k)]


def shuffled(ids: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """``ids`` in epoch ``epoch``'s random order (a permutation keyed by ``(seed, epoch)``:
    the same on every call and machine)."""
    return ids[np.random.default_rng([seed, epoch]).permutation(ids.size)]


def split_batches(order: np.ndarray, num_batches: int) -> list[np.ndarray]:
    """Split ``order`` into ``num_batches`` consecutive batches whose sizes differ by at most
    one. With fewer vertices than batches, batch ``i`` is ``order[i % n]`` alone, so no batch
    is ever empty (a rank must not skip an iteration's collectives)."""
    if order.size == 0:
        raise ValueError("split_batches: no training vertices")
    if order.size >= num_batches:
        return np.array_split(order, num_batches)
    return [order[i % order.size : i % order.size + 1] for i in range(num_batches)]
