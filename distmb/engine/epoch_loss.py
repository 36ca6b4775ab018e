"""The training loss and accuracy of one epoch, kept where the model runs.

Each step keeps its summed loss (the loss's own scalar) and writes its count of correct
predictions into a slot of a device tensor (no host read per step); they are read back
once, at the end of the epoch
(:meth:`EpochLoss.finish`), or when a progress line prints the latest loss
(:meth:`EpochLoss.latest`). The epoch's mean loss is summed on the host in step order from
the same float32 values as a per-step ``.item()`` would give, so the records are unchanged.
"""

from __future__ import annotations

import math

import torch

from distmb.core.errors import DistmbError
from distmb.core.host_reads import host_scalar, host_values


class TrainingDiverged(DistmbError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""

    exit_code = 3


class EpochLoss:
    """Per-step loss sums and correct counts of one epoch, on ``device``.

    Args:
        num_steps: the epoch's iterations.
        device: where the logits live.
    """

    def __init__(self, num_steps: int, device: torch.device) -> None:
        #: Step ``i``'s loss summed over its seeds (float32 scalars on ``device``), kept as
        #: the loss computed them: copying each into a slot would be a launch per step.
        self.loss_sums: list[torch.Tensor] = []
        #: int64[num_steps]: step ``i``'s correct predictions.
        self.correct = torch.zeros(num_steps, dtype=torch.int64, device=device)
        #: Seeds of each step added so far.
        self.sizes: list[int] = []

    def add(
        self, step: int, loss_sum: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor
    ) -> None:
        """Record step ``step`` (the next one): ``loss_sum`` float32 scalar, ``logits``
        float[n, classes], ``labels`` int64[n]. Three launches on a GPU (argmax, compare,
        a sum written into the step's slot), no read."""
        if step != len(self.sizes):
            raise ValueError(f"EpochLoss.add: step {step} given, {len(self.sizes)} expected")
        self.loss_sums.append(loss_sum.detach())
        torch.sum(logits.detach().argmax(1) == labels, dim=0, out=self.correct[step])
        self.sizes.append(int(labels.shape[0]))

    def latest(self) -> LatestLoss:
        """The last added step's mean loss, read only when printed."""
        return LatestLoss(self, len(self.sizes) - 1)

    def finish(self, epoch: int, kept: str = "") -> tuple[float, int, int]:
        """``(summed loss, correct, seen)`` of the epoch: one host read.

        Args:
            epoch: for the error message.
            kept: appended to the error message (where the last good checkpoint is).

        Raises:
            TrainingDiverged: some step's loss is NaN or infinite (the first one is named).
        """
        n = len(self.sizes)
        if not n:
            return 0.0, 0, 0
        losses = torch.stack(self.loss_sums).double()
        values = host_values(torch.cat([losses, self.correct[:n].double()]))
        total, correct = 0.0, 0
        for step, size in enumerate(self.sizes):
            loss_value = values[step] / max(size, 1)
            if not math.isfinite(loss_value):
                raise TrainingDiverged(
                    f"loss is {loss_value} at epoch {epoch}, iteration {step}{kept}; "
                    "try a lower --lr"
                )
            total += loss_value * size
            correct += int(values[n + step])
        return total, correct, sum(self.sizes)


class LatestLoss:
    """One step's mean loss as a progress meter's field: ``str()`` reads it from the device
    (so a meter that prints every few seconds reads it that often, not every step)."""

    def __init__(self, losses: EpochLoss, step: int) -> None:
        self.losses, self.step = losses, step

    def __str__(self) -> str:
        size = max(self.losses.sizes[self.step], 1)
        return f"{host_scalar(self.losses.loss_sums[self.step]) / size:.4f}"
