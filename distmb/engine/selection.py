"""Model selection: the best validation epoch so far and early stopping (``--early-stop``).

Every rank holds a :class:`ModelSelection` and feeds it the same numbers (the evaluation's
accuracies are all-reduced counts), so every rank takes the same decision: improved (write
``best.pt``), stop. Its :meth:`~ModelSelection.state` travels in checkpoints, so a resumed
run keeps the best so far and the count of evaluations since.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

#: Key of :meth:`ModelSelection.state` in a checkpoint.
SELECTION_KEY = "selection"


@dataclass(frozen=True)
class BestEpoch:
    """The epoch of the best validation accuracy so far (accuracies are fractions in
    [0, 1])."""

    epoch: int
    val_acc: float
    test_acc: float


class ModelSelection:
    """The best validation epoch and the evaluations since it.

    Args:
        patience: ``--early-stop``: stop after this many evaluations without a better
            validation accuracy; 0: never stop early.

    Attributes:
        best: the best epoch so far (None before the first evaluation with a validation
            accuracy). Ties keep the earlier epoch.
        since_best: evaluations after ``best`` that did not improve on it.
    """

    def __init__(self, patience: int) -> None:
        self.patience = int(patience)
        self.best: BestEpoch | None = None
        self.since_best = 0

    def update(self, epoch: int, val_acc: float, test_acc: float) -> bool:
        """Record the evaluation after ``epoch``; True when it is the new best (a strictly
        higher validation accuracy; a NaN one, of a graph without validation vertices,
        never is)."""
        if not math.isnan(val_acc) and (self.best is None or val_acc > self.best.val_acc):
            self.best = BestEpoch(epoch, val_acc, test_acc)
            self.since_best = 0
            return True
        self.since_best += 1
        return False

    @property
    def should_stop(self) -> bool:
        """``--early-stop`` is on and the last ``patience`` evaluations did not improve."""
        return self.patience > 0 and self.since_best >= self.patience

    def stop_reason(self) -> str:
        """Why the run stops early, for the log (call when :attr:`should_stop`)."""
        best = f"epoch {self.best.epoch}" if self.best is not None else "none"
        return (
            f"early stop: {self.since_best} evaluation(s) without a better validation "
            f"accuracy (--early-stop {self.patience}); best: {best}"
        )

    def record(self) -> dict[str, Any]:
        """The epoch record's fields: ``best_epoch``, ``best_val_acc``, ``best_test_acc`` (the
        best so far; empty before there is one)."""
        if self.best is None:
            return {}
        return {f"best_{key}": value for key, value in asdict(self.best).items()}

    def state(self) -> dict[str, Any]:
        """What a checkpoint stores: the best so far (or None) and :attr:`since_best`."""
        best = asdict(self.best) if self.best is not None else None
        return {"best": best, "since_best": self.since_best}

    def restore(self, state: dict[str, Any] | None) -> None:
        """Continue from a checkpoint's :meth:`state`; None (a checkpoint written before
        model selection existed) starts afresh."""
        if state is None:
            return
        best = state.get("best")
        self.best = (
            BestEpoch(int(best["epoch"]), float(best["val_acc"]), float(best["test_acc"]))
            if best is not None
            else None
        )
        self.since_best = int(state.get("since_best", 0))
