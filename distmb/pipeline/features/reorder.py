"""Match-Reorder (FastGL, section 4.1): order a superbatch's batches so that consecutive
batches share the most input rows, which the device feature cache's *Match*
(:class:`~distmb.pipeline.features.device.DeviceFeatures` with ``reuse_previous``) then takes from
the previous batch's rows in device memory instead of reading them from host memory again.

FastGL's greedy reorder (its Algorithm 1), for the K batches of a superbatch in their
sampled order: the first batch stays first; then, repeatedly, the batch not yet placed that
shares the most input rows with the batch placed last comes next (ties: the earliest in the
sampled order). FastGL ranks by the *match degree* (shared rows over the smaller batch's
rows); this module ranks by the shared rows themselves, which is what Match saves, and counts
only rows outside the device cache (a cached row costs no transfer either way).

What it does to training: the batches of an epoch are the same (a batch's seeds and random
stream are fixed by its index in the epoch's plan, :class:`~distmb.pipeline.loader.EpochPlan`);
only their order inside each superbatch of ``K`` changes, so the gradient steps see the same
batches in another order. The reordering is deterministic (it depends only on the sampled
batches, which depend only on the seed, the epoch and the batch index). It is an explicit
option: a :class:`MatchReorder` is the BatchLoader's ``reorder`` policy; without one the
production order is the plan's.

Cost: the order needs each batch's input ids before the epoch's plan is made (the trainer
needs the production order up front), so :class:`MatchReorder` samples every batch once
more (same stream, same blocks) at planning time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

#: ``inputs(epoch, index, seeds) -> ids``: the input row ids batch ``index`` will gather.
BatchInputs = Callable[[int, int, np.ndarray], np.ndarray | torch.Tensor]


def _as_ids(ids: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    t = ids if isinstance(ids, torch.Tensor) else torch.from_numpy(np.asarray(ids, dtype=np.int64))
    return t.to(device=device, dtype=torch.int64)


def overlap_matrix(
    sets: Sequence[np.ndarray | torch.Tensor],
    num_rows: int,
    resident: torch.Tensor | None = None,
) -> np.ndarray:
    """int64[K, K]: ``m[i, j]`` = distinct rows in both ``sets[i]`` and ``sets[j]`` and not
    ``resident`` (``m[i, i]``: the distinct non-resident rows of ``sets[i]``).

    Args:
        sets: K arrays of row ids in ``[0, num_rows)`` (repeats allowed).
        resident: bool[num_rows] (rows in the device cache) or None; its device is where the
            counting runs (default CPU).

    One membership pass per batch: ``K`` scatters and ``K`` gathers over all the ids, on the
    device the ids are on.
    """
    device = resident.device if resident is not None else torch.device("cpu")
    k = len(sets)
    m = torch.zeros((k, k), dtype=torch.int64, device=device)
    if not k:
        return m.cpu().numpy()
    ids = [torch.unique(_as_ids(s, device)) for s in sets]
    labels = torch.cat(
        [torch.full((t.numel(),), i, dtype=torch.int64, device=device) for i, t in enumerate(ids)]
    )
    every = torch.cat(ids)
    member = torch.zeros(num_rows, dtype=torch.bool, device=device)
    for i, t in enumerate(ids):
        member.zero_()
        member[t] = True
        if resident is not None:
            member &= ~resident
        m[i] = torch.bincount(labels[member[every]], minlength=k)
    return m.cpu().numpy()


def greedy_order(overlap: np.ndarray) -> list[int]:
    """FastGL's greedy order for a ``[K, K]`` overlap matrix: position 0 first, then always
    the unplaced position with the largest overlap with the last placed (ties: lowest)."""
    k = int(overlap.shape[0])
    if not k:
        return []
    order = [0]
    placed = np.zeros(k, dtype=bool)
    placed[0] = True
    for _ in range(k - 1):
        row = np.where(placed, -1, overlap[order[-1]].astype(np.int64))
        nxt = int(np.argmax(row))  # first maximum: the lowest position among ties
        order.append(nxt)
        placed[nxt] = True
    return order


def match_order(
    sets: Sequence[np.ndarray | torch.Tensor],
    num_rows: int,
    resident: torch.Tensor | None = None,
) -> list[int]:
    """Positions into ``sets`` in Match-Reorder's order (see :func:`overlap_matrix`)."""
    return greedy_order(overlap_matrix(sets, num_rows, resident))


def shared_with_previous(
    sets: Sequence[np.ndarray | torch.Tensor],
    resident: np.ndarray | None = None,
) -> list[int]:
    """Per batch, in the given order: its distinct non-resident rows that the batch before it
    also had (0 for the first): the rows Match takes from the previous batch."""
    out: list[int] = []
    previous: np.ndarray | None = None
    for s in sets:
        ids = np.unique(np.asarray(s.cpu() if isinstance(s, torch.Tensor) else s, dtype=np.int64))
        if resident is not None:
            ids = ids[~resident[ids]]
        out.append(0 if previous is None else int(np.intersect1d(ids, previous).size))
        previous = ids
    return out


class MatchReorder:
    """The BatchLoader's ``reorder`` policy for Match-Reorder (see the module docstring).

    Args:
        inputs: the input row ids of a batch (:func:`loader_inputs`).
        num_rows: rows of the feature table.
        resident: bool[num_rows], rows in the device cache (not counted), or None; the
            counting runs on its device.
    """

    def __init__(
        self, inputs: BatchInputs, num_rows: int, resident: torch.Tensor | None = None
    ) -> None:
        self.inputs = inputs
        self.num_rows = int(num_rows)
        self.resident = resident

    def __call__(self, epoch: int, indices: list[int], batches: Sequence[np.ndarray]) -> list[int]:
        sets = [self.inputs(epoch, i, batches[i]) for i in indices]
        return [indices[p] for p in match_order(sets, self.num_rows, self.resident)]


def loader_inputs(loader) -> BatchInputs:  # noqa: ANN001 - a BatchLoader (import cycle)
    """The input ids the BatchLoader ``loader`` gathers for a batch: its sampler's blocks (the
    same as in training: same epoch, index and seeds), through ``loader.gather_ids``."""

    def inputs(epoch: int, index: int, seeds: np.ndarray) -> torch.Tensor:
        return loader.gather_ids(loader.sampler.sample(seeds, epoch, index))

    return inputs
