"""The training loss and accuracy of one epoch, kept where the model runs.

Each step's summed loss and count of correct predictions end in a row of one float64 device
tensor (:attr:`EpochLoss.values`, no host read per step), read back once, at the end of the
epoch (:meth:`EpochLoss.finish`), or when a progress line prints the latest loss
(:meth:`EpochLoss.latest`). Two ways in, one per training path:

- :meth:`EpochLoss.add` (the eager step): the loss is kept as the step's own scalar and
  written into its column at :meth:`~EpochLoss.finish` (one stack and one copy per epoch);
  the correct count is written into its slot at once (argmax, compare, a sum: three launches).
- :meth:`EpochLoss.add_values` (``--cuda-graphs``): the captured step computes its row with
  :func:`step_values`, and the epoch copies it into its slot (one launch).

The epoch's mean loss is summed on the host in step order from the same float32 values as a
per-step ``.item()`` would give (float64 holds every float32 and every count exactly), so the
records are the same on either path.
"""

from __future__ import annotations

import math

import torch

from distmb.core.errors import DistmbError
from distmb.core.host_reads import host_scalar, host_values

#: Columns of a step's row of :attr:`EpochLoss.values`: its loss summed over its seeds and
#: its count of correct predictions.
LOSS, CORRECT = 0, 1


class TrainingDiverged(DistmbError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""

    exit_code = 3


def count_correct(logits: torch.Tensor, labels: torch.Tensor, out: torch.Tensor) -> None:
    """Write the number of rows of ``logits`` (float[n, classes]) whose argmax is the row's
    label (``labels``: int64[n]) into ``out`` (a float64 scalar, exact): three launches
    (argmax, compare, a sum written into ``out``), no read."""
    torch.sum(logits.detach().argmax(1) == labels, dim=0, dtype=torch.float64, out=out)


def step_values(loss_sum: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """float64[2]: one step's row of :attr:`EpochLoss.values` (columns :data:`LOSS`,
    :data:`CORRECT`) from its summed loss (float32 scalar), logits (float[n, classes]) and
    labels (int64[n]); what a captured step returns for :meth:`EpochLoss.add_values`."""
    values = torch.empty(2, dtype=torch.float64, device=logits.device)
    values[LOSS].copy_(loss_sum.detach())
    count_correct(logits, labels, values[CORRECT])
    return values


class EpochLoss:
    """Per-step loss sums and correct counts of one epoch, on ``device``.

    Args:
        num_steps: the epoch's iterations.
        device: where the logits live.
    """

    def __init__(self, num_steps: int, device: torch.device) -> None:
        #: float64[num_steps, 2]: step ``i``'s row (its loss sum, column :data:`LOSS`, and its
        #: correct count, :data:`CORRECT`); the rows of the steps added so far are written
        #: (the loss column of :meth:`add`'s steps at :meth:`finish`), the others never read.
        self.values = torch.empty((num_steps, 2), dtype=torch.float64, device=device)
        #: float64[num_steps]: the correct counts' column of :attr:`values` (a view).
        self.correct = self.values[:, CORRECT]
        #: The loss sums of :meth:`add`'s steps (float32 scalars on ``device``), kept as the
        #: loss computed them: copying each into its slot would be a launch per step.
        self.loss_sums: list[torch.Tensor] = []
        #: Seeds of each step added so far.
        self.sizes: list[int] = []

    def add(
        self, step: int, loss_sum: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor
    ) -> None:
        """Record step ``step`` (the next one): ``loss_sum`` float32 scalar, ``logits``
        float[n, classes], ``labels`` int64[n]. Three launches on a GPU (argmax, compare,
        a sum written into the step's slot), no read."""
        self._check_next(step)
        if len(self.loss_sums) != step:
            raise ValueError("EpochLoss.add: the epoch's earlier steps came from add_values")
        self.loss_sums.append(loss_sum.detach())
        count_correct(logits, labels, self.correct[step])
        self.sizes.append(int(labels.shape[0]))

    def add_values(self, step: int, values: torch.Tensor, size: int) -> None:
        """Record step ``step`` (the next one) from its row ``values`` (float64[2], from
        :func:`step_values`; it may be overwritten after this call) over ``size`` seeds: one
        copy on a GPU, no read."""
        self._check_next(step)
        if self.loss_sums:
            raise ValueError("EpochLoss.add_values: the epoch's earlier steps came from add")
        self.values[step].copy_(values)
        self.sizes.append(size)

    def _check_next(self, step: int) -> None:
        if step != len(self.sizes):
            raise ValueError(f"EpochLoss: step {step} given, {len(self.sizes)} expected")

    def latest(self) -> LatestLoss:
        """The last added step's mean loss, read only when printed."""
        return LatestLoss(self, len(self.sizes) - 1)

    def loss_sum(self, step: int) -> torch.Tensor:
        """Step ``step``'s summed loss on the device (a scalar; step added already)."""
        return self.loss_sums[step] if self.loss_sums else self.values[step, LOSS]

    def finish(self, epoch: int, kept: str = "") -> tuple[float, int, int]:
        """``(summed loss, correct, seen)`` of the epoch: one host read (after, for
        :meth:`add`'s steps, a stack and a copy of their losses into their column).

        Args:
            epoch: for the error message.
            kept: appended to the error message (where the last good checkpoint is).

        Raises:
            TrainingDiverged: some step's loss is NaN or infinite (the first one is named).
        """
        n = len(self.sizes)
        if not n:
            return 0.0, 0, 0
        if self.loss_sums:
            self.values[:n, LOSS].copy_(torch.stack(self.loss_sums))
        rows = host_values(self.values[:n])
        total, correct = 0.0, 0
        for step, (size, row) in enumerate(zip(self.sizes, rows, strict=True)):
            loss_value = row[LOSS] / max(size, 1)
            if not math.isfinite(loss_value):
                raise TrainingDiverged(
                    f"loss is {loss_value} at epoch {epoch}, iteration {step}{kept}; "
                    "try a lower --lr"
                )
            total += loss_value * size
            correct += int(row[CORRECT])
        return total, correct, sum(self.sizes)


class LatestLoss:
    """One step's mean loss as a progress meter's field: ``str()`` reads it from the device
    (so a meter that prints every few seconds reads it that often, not every step)."""

    def __init__(self, losses: EpochLoss, step: int) -> None:
        self.losses, self.step = losses, step

    def __str__(self) -> str:
        size = max(self.losses.sizes[self.step], 1)
        return f"{host_scalar(self.losses.loss_sum(self.step)) / size:.4f}"
