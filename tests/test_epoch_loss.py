"""EpochLoss: per-step losses and correct counts kept on the device, read once per epoch;
checked against plain Python sums of the same steps."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from distmb.core.host_reads import HOST_READS
from distmb.engine.epoch_loss import EpochLoss, TrainingDiverged
from distmb.engine.op_census import _OpCounter


def steps(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(5 + i, 4, generator=g), torch.randint(0, 4, (5 + i,), generator=g))
        for i in range(n)
    ]


def test_finish_equals_python_sums_with_one_read():
    batches = steps(4)
    losses = EpochLoss(len(batches), torch.device("cpu"))
    before, _ = HOST_READS.snapshot()
    for step, (logits, labels) in enumerate(batches):
        losses.add(step, F.cross_entropy(logits, labels, reduction="sum"), logits, labels)
    total, correct, seen = losses.finish(epoch=0)
    assert HOST_READS.snapshot()[0] - before == 1
    want_total = sum(float(F.cross_entropy(lg, lb, reduction="sum")) for lg, lb in batches)
    want_correct = sum(int((lg.argmax(1) == lb).sum()) for lg, lb in batches)
    assert total == pytest.approx(want_total, rel=1e-12)
    assert (correct, seen) == (want_correct, sum(len(lb) for _, lb in batches))
    assert str(losses.latest()) == f"{float(F.cross_entropy(*batches[-1], reduction='mean')):.4f}"


def test_a_non_finite_loss_names_its_iteration():
    batches = steps(3)
    losses = EpochLoss(3, torch.device("cpu"))
    for step, (logits, labels) in enumerate(batches):
        loss = torch.tensor(math.nan) if step == 1 else logits.sum()
        losses.add(step, loss, logits, labels)
    with pytest.raises(TrainingDiverged, match="epoch 7, iteration 1"):
        losses.finish(epoch=7)


def test_steps_are_added_in_order():
    (logits, labels), = steps(1)  # fmt: skip
    losses = EpochLoss(2, torch.device("cpu"))
    with pytest.raises(ValueError, match="step 1 given, 0 expected"):
        losses.add(1, logits.sum(), logits, labels)


def test_a_step_costs_three_launches():
    """argmax, compare, and a sum written into its slot: no copy per step."""
    (logits, labels), = steps(1)  # fmt: skip
    losses = EpochLoss(1, torch.device("cpu"))
    loss = F.cross_entropy(logits, labels, reduction="sum")
    counter = _OpCounter()
    with counter:
        losses.add(0, loss, logits, labels)
    launching = sum(counter.ops.values()) - sum(counter.views.values())
    assert launching == 3, dict(counter.by_name)
