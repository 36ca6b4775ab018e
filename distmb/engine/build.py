"""Assembly: the pieces of a run built from a :class:`~distmb.config.train.TrainConfig`."""

from __future__ import annotations

from torch import nn

from distmb.config.train import TrainConfig
from distmb.nn.models import MODELS, build_model
from distmb.nn.user import construct_user_model


def model_from_config(config: TrainConfig, in_dim: int, num_classes: int) -> nn.Module:
    """The model ``config.model`` names: a built-in (:func:`~distmb.nn.build_model`) or a
    user's class (:func:`construct_user_model`) with the run's widths."""
    if config.model in MODELS:
        return build_model(
            config.model,
            in_dim=in_dim,
            hidden=config.hidden,
            num_classes=num_classes,
            num_layers=config.layers,
            heads=config.heads,
            dropout=config.dropout,
            aggr=config.aggr,
            gin_eps=config.gin_eps,
            gin_train_eps=config.gin_train_eps,
        )
    arguments = dict(
        in_dim=in_dim,
        hidden=config.hidden,
        num_classes=num_classes,
        num_layers=config.layers,
        dropout=config.dropout,
        heads=config.heads,
    )
    return construct_user_model(config.model, arguments)
