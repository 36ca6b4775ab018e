"""``--lr-schedule``: the learning rate per epoch, torch's schedulers stepped once per epoch.

- ``cosine``: :class:`torch.optim.lr_scheduler.CosineAnnealingLR` with ``T_max = --epochs``
  and ``eta_min = --lr-min``: epoch ``e`` trains with
  ``lr_min + (lr - lr_min) (1 + cos(pi e / epochs)) / 2``.
- ``step``: :class:`torch.optim.lr_scheduler.StepLR`: epoch ``e`` trains with
  ``lr * gamma ** (e // step_size)``.

The scheduler steps after each epoch's evaluation and before its checkpoint, so a checkpoint
holds the state for the next epoch; its ``state_dict`` is saved under ``"scheduler"``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LRScheduler, StepLR

from distmb.config.train import TrainConfig

#: Key of the scheduler's ``state_dict`` in a checkpoint.
SCHEDULER_KEY = "scheduler"


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> LRScheduler | None:
    """The scheduler of ``--lr-schedule`` over ``optimizer`` (None for ``none``)."""
    if config.lr_schedule == "cosine":
        return CosineAnnealingLR(optimizer, T_max=config.epochs, eta_min=config.lr_min)
    if config.lr_schedule == "step":
        return StepLR(optimizer, step_size=config.lr_step_size, gamma=config.lr_gamma)
    return None


def scheduled_lr(config: TrainConfig, base_lr: float, epoch: int, period: int) -> float:
    """The lr of ``epoch`` in closed form (``period``: the cosine's ``T_max``)."""
    if config.lr_schedule == "cosine":
        lo = config.lr_min
        return lo + (base_lr - lo) * (1 + math.cos(math.pi * epoch / period)) / 2
    if config.lr_schedule == "step":
        return base_lr * config.lr_gamma ** (epoch // config.lr_step_size)
    return base_lr


def restore_schedule(
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler | None,
    saved: dict[str, Any] | None,
    config: TrainConfig,
    next_epoch: int,
) -> list[str]:
    """Set the lr of a resumed run, whose optimizer state was just loaded.

    Without a schedule the lr is ``--lr``. With one, the saved scheduler state is loaded
    (bit-identical continuation); a changed ``--lr`` becomes the schedule's base, and a
    changed ``--epochs`` the cosine's period: the lr of ``next_epoch`` is then recomputed in
    closed form, as a run planned with these values from the start would have it. Returns
    what changed, for the log.
    """
    if scheduler is None:
        for group in optimizer.param_groups:
            group["lr"] = config.lr
        return []
    notes = []
    if saved is not None:
        scheduler.load_state_dict(saved)
    else:  # a checkpoint without a scheduler state: the schedule from its start
        scheduler.last_epoch = next_epoch
        scheduler.base_lrs = [config.lr] * len(optimizer.param_groups)
        notes.append("the checkpoint holds no scheduler state; lr of the schedule recomputed")
    rebased = any(b != config.lr for b in scheduler.base_lrs)
    if rebased:
        scheduler.base_lrs = [config.lr] * len(optimizer.param_groups)
    if isinstance(scheduler, CosineAnnealingLR) and scheduler.T_max != config.epochs:
        notes.append(f"cosine schedule now ends after epoch {config.epochs - 1}")
        scheduler.T_max = config.epochs
        rebased = True
    if rebased or saved is None:
        period = getattr(scheduler, "T_max", 1)
        lr = scheduled_lr(config, config.lr, next_epoch, period)
        for group in optimizer.param_groups:
            group["lr"] = lr
    return notes
