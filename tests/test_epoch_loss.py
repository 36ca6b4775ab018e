"""EpochLoss: per-step losses and correct counts kept on the device, read once per epoch;
checked against plain Python sums of the same steps, by either way in (``add``: the eager
step; ``add_values``: a captured step's row from ``step_values``)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from distmb.core.host_reads import HOST_READS
from distmb.engine.epoch_loss import CORRECT, LOSS, EpochLoss, TrainingDiverged, step_values
from distmb.engine.op_census import _OpCounter


def steps(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(5 + i, 4, generator=g), torch.randint(0, 4, (5 + i,), generator=g))
        for i in range(n)
    ]


def add_step(
    losses: EpochLoss,
    step: int,
    loss: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
    rows: bool,
) -> None:
    """Add a step by ``add``, or (``rows``) by ``add_values`` of its ``step_values`` row."""
    if rows:
        losses.add_values(step, step_values(loss, logits, labels), int(labels.shape[0]))
    else:
        losses.add(step, loss, logits, labels)


@pytest.mark.parametrize("rows", [False, True])
def test_finish_equals_python_sums_with_one_read(rows):
    batches = steps(4)
    losses = EpochLoss(len(batches), torch.device("cpu"))
    before, _ = HOST_READS.snapshot()
    for step, (logits, labels) in enumerate(batches):
        loss = F.cross_entropy(logits, labels, reduction="sum")
        add_step(losses, step, loss, logits, labels, rows)
    total, correct, seen = losses.finish(epoch=0)
    assert HOST_READS.snapshot()[0] - before == 1
    want_total = sum(float(F.cross_entropy(lg, lb, reduction="sum")) for lg, lb in batches)
    want_correct = sum(int((lg.argmax(1) == lb).sum()) for lg, lb in batches)
    assert total == pytest.approx(want_total, rel=1e-12)
    assert (correct, seen) == (want_correct, sum(len(lb) for _, lb in batches))
    assert str(losses.latest()) == f"{float(F.cross_entropy(*batches[-1], reduction='mean')):.4f}"


@pytest.mark.parametrize("rows", [False, True])
def test_a_non_finite_loss_names_its_iteration(rows):
    batches = steps(3)
    losses = EpochLoss(3, torch.device("cpu"))
    for step, (logits, labels) in enumerate(batches):
        loss = torch.tensor(math.nan) if step == 1 else logits.sum()
        add_step(losses, step, loss, logits, labels, rows)
    with pytest.raises(TrainingDiverged, match="epoch 7, iteration 1"):
        losses.finish(epoch=7)


def test_steps_are_added_in_order():
    (logits, labels), = steps(1)  # fmt: skip
    losses = EpochLoss(2, torch.device("cpu"))
    with pytest.raises(ValueError, match="step 1 given, 0 expected"):
        losses.add(1, logits.sum(), logits, labels)
    with pytest.raises(ValueError, match="step 1 given, 0 expected"):
        losses.add_values(1, step_values(logits.sum(), logits, labels), 5)


def test_an_epoch_takes_one_way_in():
    """An epoch's steps all come by ``add`` or all by ``add_values`` (the losses of ``add``
    fill their column at the end, in step order)."""
    (logits, labels), = steps(1)  # fmt: skip
    row = step_values(logits.sum(), logits, labels)
    by_add, by_rows = EpochLoss(2, torch.device("cpu")), EpochLoss(2, torch.device("cpu"))
    by_add.add(0, logits.sum(), logits, labels)
    by_rows.add_values(0, row, 5)
    with pytest.raises(ValueError, match="earlier steps came from add"):
        by_add.add_values(1, row, 5)
    with pytest.raises(ValueError, match="earlier steps came from add_values"):
        by_rows.add(1, logits.sum(), logits, labels)


def test_both_ways_give_the_same_bits():
    """A graphed run's records equal an eager run's on the same steps: the same float32 losses
    and counts, whichever way they came in; the row holds them exactly."""
    batches = steps(5, seed=3)
    results, latest = [], []
    for rows in (False, True):
        losses = EpochLoss(len(batches), torch.device("cpu"))
        for step, (logits, labels) in enumerate(batches):
            loss = F.cross_entropy(logits, labels, reduction="sum")
            add_step(losses, step, loss, logits, labels, rows)
            latest.append(str(losses.latest()))
        results.append(losses.finish(epoch=0))
    assert results[0] == results[1]
    assert latest[: len(batches)] == latest[len(batches) :]
    logits, labels = batches[0]
    loss = F.cross_entropy(logits, labels, reduction="sum")
    row = step_values(loss, logits, labels)
    assert row.dtype == torch.float64 and row.shape == (2,)
    assert row[LOSS].item() == float(loss)  # float32 -> float64, exact
    assert row[CORRECT].item() == sum(  # brute force: the first maximum is the prediction
        int(max(range(4), key=lambda c: float(lg[c])) == int(lb))
        for lg, lb in zip(logits, labels, strict=True)
    )


def test_a_step_costs_three_launches():
    """``add``: argmax, compare, and a sum written into its slot: no copy per step."""
    (logits, labels), = steps(1)  # fmt: skip
    losses = EpochLoss(1, torch.device("cpu"))
    loss = F.cross_entropy(logits, labels, reduction="sum")
    assert launches(lambda: losses.add(0, loss, logits, labels)) == 3


def test_a_row_costs_one_launch_and_its_epoch_none():
    """``add_values``: the row's copy into its slot; ``finish`` then reads the rows, no
    launch. ``add``'s epoch launches two more at its end: the losses' stack and their copy
    into their column (no zeros, casts or concatenation)."""
    (logits, labels), = steps(1)  # fmt: skip
    loss = F.cross_entropy(logits, labels, reduction="sum")
    row = step_values(loss, logits, labels)
    by_rows, by_add = EpochLoss(1, torch.device("cpu")), EpochLoss(1, torch.device("cpu"))
    assert launches(lambda: by_rows.add_values(0, row, int(labels.shape[0]))) == 1
    assert launches(lambda: by_add.add(0, loss, logits, labels)) == 3
    assert launches(lambda: by_rows.finish(epoch=0)) == 0
    assert launches(lambda: by_add.finish(epoch=0)) == 2
    assert launches(lambda: EpochLoss(4, torch.device("cpu"))) == 0


def launches(call: Callable[[], object]) -> int:
    """The ops ``call`` dispatches that launch on a GPU (not views, not allocations)."""
    counter = _OpCounter()
    with counter:
        call()
    return (
        sum(counter.ops.values()) - sum(counter.views.values()) - sum(counter.launch_free.values())
    )
