"""Bring your own model: the contract a model meets to train through
:class:`~distmb.engine.Trainer`, its check, and ``--model package.module:Class``.

The contract (what the trainer, layer-wise evaluation and the halo schemes call):

- ``num_layers``: int, one layer per block (``len(--fanout)``);
- ``layer_dims()``: list of ``num_layers`` ints, the input width of every layer
  (``layer_dims()[0]`` = the feature width); the halo schemes size their caches with it;
- ``forward_layer(l, block, x_src)``: layer ``l`` alone, ``x_src`` float32[block.n_src,
  layer_dims()[l]] -> float32[block.n_dst, width] (``layer_dims()[l + 1]``, or
  ``num_classes`` for the last layer); layer-wise exact evaluation calls it on
  full-neighbour blocks;
- ``forward(blocks, x, *, layer_input=None)``: the layer loop; with ``layer_input`` the
  model must pass every layer's computed rows through it,
  ``h = layer_input(l, blocks[l], h)``, before applying layer ``l`` (``x`` then holds
  ``blocks[0].n_computed`` rows; a multi-rank halo scheme appends the halo leaves' rows
  there); returns float32[blocks[-1].n_dst, num_classes] logits.

Subclassing :class:`~distmb.nn.BlockModel` gives all four: append one module per layer,
called ``layer(block, x_src)``, to ``self.layers`` and pass the input widths to
``super().__init__(layer_dims)``. :func:`check_block_model` checks a model against the
contract on a tiny hand-built mini-batch before training starts.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from distmb.core.errors import InputError
from distmb.pipeline.sample import Block

#: The keyword arguments ``--model package.module:Class`` is constructed with (each passed
#: when its ``__init__`` accepts it; all of them when it takes ``**kwargs``).
USER_MODEL_ARGS = ("in_dim", "hidden", "num_classes", "num_layers", "dropout", "heads")
#: Methods and attributes of the contract (module docstring).
CONTRACT = ("num_layers", "layer_dims", "forward_layer", "forward")


def is_model_spec(model: str) -> bool:
    """Whether ``--model`` names a user's class, ``package.module:Class`` (dotted names of
    Python identifiers on both sides of one colon)."""
    module, sep, name = model.partition(":")
    return bool(sep) and all(part.isidentifier() for part in (*module.split("."), *name.split(".")))


def model_spec(model: nn.Module) -> str:
    """``package.module:Class`` of ``model``'s class (recorded in checkpoints)."""
    cls = type(model)
    return f"{cls.__module__}:{cls.__qualname__}"


def load_model_class(spec: str, flag: str = "--model") -> type:
    """The class named by ``package.module:Class`` (imported).

    Raises:
        InputError: naming ``flag``: the module cannot be imported, has no such class, or
            the name is not a class.
    """
    if not is_model_spec(spec):
        raise InputError(f"{flag} {spec!r}: expected package.module:Class")
    module_name, _, qualname = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(
            f"{flag} {spec}: cannot import module {module_name!r} ({exc}); is it on "
            "PYTHONPATH or installed?"
        ) from None
    obj: Any = module
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{flag} {spec}: module {module_name!r} has no {qualname!r}")
        obj = getattr(obj, part)
    if not inspect.isclass(obj) or not issubclass(obj, nn.Module):
        raise InputError(f"{flag} {spec}: {qualname!r} is not a torch.nn.Module class")
    return obj


def construct_user_model(
    spec: str, arguments: Mapping[str, Any], flag: str = "--model"
) -> nn.Module:
    """Build ``spec``'s class with the ``arguments`` (of :data:`USER_MODEL_ARGS`) its
    ``__init__`` accepts.

    Raises:
        InputError: naming ``flag``: a required argument distmb does not provide, or the
            constructor failed.
    """
    cls = load_model_class(spec, flag)
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = dict(arguments)
    else:
        kwargs = {k: v for k, v in arguments.items() if k in params}
    missing = [
        name
        for name, p in list(params.items())[1:]  # skip self
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and name not in kwargs
    ]
    if missing:
        raise InputError(
            f"{flag} {spec}: __init__ requires {', '.join(missing)}, which distmb does not "
            f"pass (it passes the keyword arguments {', '.join(USER_MODEL_ARGS)} that "
            "__init__ accepts)"
        )
    try:
        return cls(**kwargs)
    except Exception as exc:  # the user's constructor: report it in one line
        raise InputError(
            f"{flag} {spec}: constructing it with {kwargs} failed: {type(exc).__name__}: {exc}"
        ) from None


def probe_blocks(num_layers: int) -> list[Block]:
    """A tiny consistent mini-batch: ``num_layers`` blocks, each with 3 destinations over 4
    sources (the destinations first), every destination with two in-edges; block ``l``'s
    destinations are block ``l + 1``'s computed sources."""
    blocks = []
    for l in range(num_layers):
        n_dst = 2 if l == num_layers - 1 else 3
        n_src = 3 if l > 0 else 4
        indices = torch.tensor([1, 2, 0, 2, 0, 1][: 2 * n_dst], dtype=torch.int64)
        if l == 0:
            indices[-1] = 3  # a source that is not a destination
        blocks.append(
            Block(
                n_dst=n_dst,
                n_src=n_src,
                n_halo=0,
                indptr=torch.arange(0, 2 * n_dst + 1, 2, dtype=torch.int64),
                indices=indices,
                src_ids=torch.arange(n_src, dtype=torch.int64),
            )
        )
    return blocks


def check_block_model(
    model: nn.Module, in_dim: int, num_classes: int, num_layers: int, what: str = "model"
) -> None:
    """Check ``model`` against the contract (module docstring) before training: its
    attributes, ``layer_dims()``, and one forward pass in evaluation mode over
    :func:`probe_blocks` through a ``layer_input`` hook and layer by layer. The model's
    mode and torch's RNG state are left as they were.

    Raises:
        InputError: naming ``what`` and the first unmet part of the contract.
    """
    if not isinstance(model, nn.Module):
        raise InputError(f"{what}: expected a torch.nn.Module, got {type(model).__name__}")
    name = f"{what} {type(model).__name__}"
    absent = [attr for attr in CONTRACT if not hasattr(model, attr)]
    if absent:
        raise InputError(
            f"{name} lacks {', '.join(absent)} (subclass distmb.nn.BlockModel; docs/api.md)"
        )
    if "layer_input" not in inspect.signature(model.forward).parameters:
        raise InputError(
            f"{name}.forward does not take layer_input=; it must call "
            "h = layer_input(l, blocks[l], h) before every layer (docs/api.md)"
        )
    if model.num_layers != num_layers:
        raise InputError(
            f"{name} has {model.num_layers} layers but --fanout lists {num_layers} "
            "(one fan-out per layer)"
        )
    dims = list(model.layer_dims())
    if len(dims) != num_layers or not all(isinstance(d, int) and d >= 1 for d in dims):
        raise InputError(
            f"{name}.layer_dims() returned {dims}; expected {num_layers} positive ints"
        )
    if dims[0] != in_dim:
        raise InputError(
            f"{name}.layer_dims()[0] is {dims[0]} but the features have {in_dim} columns"
        )
    _probe(model, name, dims, in_dim, num_classes)


def _probe(model: nn.Module, name: str, dims: list[int], in_dim: int, num_classes: int) -> None:
    """One forward pass over :func:`probe_blocks`, whole and layer by layer."""
    blocks = probe_blocks(len(dims))
    param = next(model.parameters(), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    x = torch.linspace(-1, 1, blocks[0].n_src * in_dim, dtype=dtype).view(-1, in_dim)
    seen: list[int] = []

    def layer_input(l: int, block: Block, h: torch.Tensor) -> torch.Tensor:
        seen.append(l)
        if tuple(h.shape) != (block.n_computed, dims[l]):
            raise InputError(
                f"{name}: the input of layer {l} has shape {tuple(h.shape)}, expected "
                f"({block.n_computed}, {dims[l]}) (layer_dims()[{l}] = {dims[l]})"
            )
        return h

    was_training = model.training
    rng = torch.get_rng_state()
    model.eval()
    try:
        with torch.no_grad():
            try:
                out = model(blocks, x, layer_input=layer_input)
                h = x
                for l, block in enumerate(blocks):
                    h = model.forward_layer(l, block, h)
            except InputError:
                raise
            except Exception as exc:
                raise InputError(
                    f"{name} failed on a 3-vertex test mini-batch: {type(exc).__name__}: {exc}"
                ) from None
    finally:
        model.train(was_training)
        torch.set_rng_state(rng)
    if seen != list(range(len(dims))):
        raise InputError(
            f"{name}.forward called layer_input for layers {seen}, expected "
            f"{list(range(len(dims)))} (once per layer, in order)"
        )
    expected = (blocks[-1].n_dst, num_classes)
    for what, value in (("forward", out), ("forward_layer, layer by layer,", h)):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != expected:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value)
            raise InputError(
                f"{name}.{what} returned {shape} for {expected[0]} seeds, expected "
                f"{expected} (seeds x classes)"
            )
