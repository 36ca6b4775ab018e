"""The model and its optimizer, built from a :class:`~distmb.config.train.TrainConfig` (or
the user's own, checked), on the training device."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from distmb.config.train import TrainConfig
from distmb.core.errors import InputError
from distmb.data.local import LocalGraph
from distmb.engine.budget import GraphShape, check_memory
from distmb.nn.models import MODELS, build_model
from distmb.nn.user import check_block_model, construct_user_model, model_spec

#: Devices whose parameters the built-in optimizer updates with torch's fused Adam.
FUSED_ADAM_DEVICES = ("cpu", "cuda")


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


@dataclass
class ModelParts:
    """What :func:`build_model_and_optimizer` returns.

    Attributes:
        model: the model, on the training device.
        optimizer: the optimizer over its parameters.
        spec: what the model is in checkpoints and records: ``config.model`` (a built-in's
            name or a ``package.module:Class``), or the user's model's class as such a spec.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    spec: str


def build_model_and_optimizer(
    local: LocalGraph,
    config: TrainConfig,
    num_ranks: int,
    device: torch.device,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> ModelParts:
    """The run's model and optimizer: ``config.model`` seeded with ``config.seed`` (the same
    initial weights on every rank) unless ``model`` is given, and Adam with ``config.lr`` and
    ``config.weight_decay`` unless ``optimizer`` is given (``capturable`` on a GPU with
    ``--cuda-graphs``, :mod:`distmb.engine.graphed_step`). The memory estimate is checked
    before a built-in model is allocated (after a user's, counting its parameters).

    Raises:
        InputError: the estimate exceeds this machine's memory, the model breaks the block
            model contract (:mod:`distmb.nn.user`), or the optimizer updates other tensors.
    """
    spec = config.model if model is None else model_spec(model)
    shape = GraphShape.of(local)
    built_in = model is None and config.model in MODELS
    if built_in:  # estimated before anything is allocated
        check_memory(config, shape, num_ranks)
    if model is None:
        torch.manual_seed(config.seed)  # identical model initialisation on every rank
        model = model_from_config(config, local.feat_dim, local.num_classes)
    check_block_model(
        model, local.feat_dim, local.num_classes, len(config.fanout), what="Trainer model"
    )
    if not built_in:  # a user's model: its parameters counted once it exists
        check_memory(config, shape, num_ranks, params=sum(p.numel() for p in model.parameters()))
    model = model.to(device)
    if optimizer is None:
        params = list(model.parameters())
        # One fused kernel per parameter instead of ~10 elementwise ops, each of which
        # wakes the thread pool: the step took 2.5 ms of a 150 ms SAGE batch unfused.
        fused = all(p.device.type in FUSED_ADAM_DEVICES for p in params)
        # --cuda-graphs: Adam's step counts on the GPU, so a captured step can advance them.
        capturable = config.cuda_graphs and all(p.device.type == "cuda" for p in params)
        optimizer = torch.optim.Adam(
            params,
            lr=config.lr,
            weight_decay=config.weight_decay,
            fused=fused,
            capturable=capturable,
        )
    check_optimizer(optimizer, model)
    return ModelParts(model, optimizer, spec)


def check_optimizer(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """Refuse an optimizer that updates tensors that are not ``model``'s parameters (one
    built for another model), or none of them.

    Raises:
        InputError: naming the optimizer's class.
    """
    own = {id(p) for p in model.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    if not held or any(id(p) not in own for p in held):
        raise InputError(
            f"Trainer optimizer {type(optimizer).__name__}: it must update the model's "
            "parameters (build it from model.parameters() of the model passed as model=)"
        )
