"""Training engine: the trainer's loop (:mod:`~distmb.engine.trainer`), the assembly of a run
from its configuration (:mod:`~distmb.engine.build`), exact evaluation, checkpoints,
per-epoch statistics and prediction from a checkpoint (:mod:`~distmb.engine.predict`).

The names below are imported on first use, so that importing a light module of the engine
(:mod:`distmb.engine.predict` for the command line's ``--help``) does not load the trainer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "Trainer": "distmb.engine.trainer",
    "TrainingDiverged": "distmb.engine.epoch_loss",
    "split_batches": "distmb.pipeline.plan",
}

__all__ = ["Trainer", "TrainingDiverged", "split_batches"]

if TYPE_CHECKING:
    from distmb.engine.epoch_loss import TrainingDiverged
    from distmb.engine.trainer import Trainer
    from distmb.pipeline.plan import split_batches


def __getattr__(name: str) -> Any:
    """Import the public name ``name`` from its module on first use."""
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'distmb.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
