"""Training engine: the trainer, exact evaluation, checkpoints and per-epoch statistics."""

from distmb.engine.trainer import Trainer, TrainingDiverged, split_batches

__all__ = ["Trainer", "TrainingDiverged", "split_batches"]
