"""``--compile``: the training forward through ``torch.compile(dynamic=True, fullgraph=True)``
(:class:`CompiledForward`).

What is compiled: the model's layer loop over one batch's blocks, from the input rows to the
logits (the loss, the backward and the optimizer stay eager; AOTAutograd compiles the
forward's backward graph with it). The Triton layers' nodes are the custom operators of
:mod:`distmb.nn.kernels.ops` while the compiler traces, so one graph without a break covers a
whole model (``fullgraph=True`` makes a break an error). Evaluation (layer-wise inference)
stays eager: it runs once an epoch, over blocks of other shapes.

Recompilation is bounded: the compiled function takes every block as its tensors
(``indptr``, ``indices``, ``src_ids``) and rebuilds the :class:`~distmb.pipeline.sample.Block`
inside the graph with its sizes read from their shapes, so every size is a symbol of the
graph (a block's Python ints would be constants, and specialise the graph to one batch);
and duck sizing is off while it runs (sizes that happen to be equal in the first batch,
e.g. a batch size and a feature width, would share one symbol and recompile at the first
batch where they differ). An epoch then compiles once (:attr:`CompiledForward.compiles`
counts it), a recompilation comes only from a size of 0 or 1 (PyTorch specialises them) or
a change of the model's mode.

The model itself is not wrapped: the trainer keeps the plain module, so its ``state_dict``
keys (checkpoints, resume, predict) are those of an eager run (no ``_orig_mod.`` prefix).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
from torch import Tensor, nn

from distmb.config.train import compile_problem
from distmb.core.errors import InputError
from distmb.nn.models import BUILT_IN_MODELS
from distmb.pipeline.rows import IndexedRows
from distmb.pipeline.sample import Block

#: The compiler back end of ``--compile`` (inductor: generated Triton kernels on a GPU, C++
#: on the CPU); tests trace with ``"aot_eager"`` (the same graphs, no code generated).
BACKEND = "inductor"

#: One block as the compiled function takes it: ``(indptr, indices, src_ids)``.
BlockTensors = tuple[Tensor, Tensor, Tensor]


class CompiledForward:
    """The model's training forward, compiled (module docstring): ``forward(blocks, x)``
    gives the logits of ``model(blocks, x)``, the same values and gradients as the eager
    Triton path (the same kernels; inductor may fuse and reorder the elementwise ops around
    them, float rounding apart).

    Args:
        model: a built-in model (its layers' Triton nodes trace).
        backend: the ``torch.compile`` back end (default :data:`BACKEND`).

    Attributes:
        compiles: graphs compiled so far (each a compilation of the forward; AOTAutograd
            compiles its backward with it).
        compile_s: wall seconds of the calls that compiled (tracing and code generation,
            plus those calls' own forward).
    """

    def __init__(self, model: nn.Module, backend: str | None = None) -> None:
        self.model = model
        self.compiles = 0
        self.compile_s = 0.0
        inner = torch._dynamo.lookup_backend(backend or BACKEND)

        def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
            # Counted once compiled: the compiler may restart an analysis from the back end
            # (a float made a tensor), which raises here and traces again.
            code = inner(gm, example_inputs)
            self.compiles += 1
            return code

        self._compiled = torch.compile(
            self._run, backend=counting_backend, dynamic=True, fullgraph=True
        )

    def _run(self, csr: Sequence[BlockTensors], x: Tensor) -> Tensor:
        """The traced function: the blocks rebuilt from their tensors (sizes symbolic; no
        halo leaves: one rank), then the model's layer loop."""
        blocks = [
            Block(indptr.shape[0] - 1, src_ids.shape[0], 0, indptr, indices, src_ids)
            for indptr, indices, src_ids in csr
        ]
        return self.model(blocks, x)

    def __call__(self, blocks: Sequence[Block], x: Tensor | IndexedRows) -> Tensor:
        """Logits float[blocks[-1].n_dst, num_classes] of ``x`` float[blocks[0].n_src, in].

        Raises:
            ValueError: a block with halo leaves (a one-rank run has none).
        """
        if any(b.n_halo for b in blocks):
            raise ValueError("--compile: blocks with halo leaves (several ranks) do not trace")
        if isinstance(x, IndexedRows):
            x = x.materialize()
        csr = [(b.indptr, b.indices, b.src_ids) for b in blocks]
        before, start = self.compiles, time.perf_counter()
        with fx_config.patch(use_duck_shape=False):
            out = self._compiled(csr, x)
        if self.compiles != before:
            self.compile_s += time.perf_counter() - start
        return out


def compile_refusal(num_ranks: int, built_in: bool) -> str | None:
    """Why ``--compile`` cannot run in this built run (beside :func:`compile_problem`'s
    refusals of the options), or None."""
    if num_ranks != 1:
        return (
            f"--compile: one rank only, this run has {num_ranks} (the halo schemes' exchanges "
            "run inside the forward, between its layers, and do not trace)"
        )
    if not built_in:
        return "--compile: the built-in models only, not a model object given to the Trainer"
    return None


def compiled_forward_for(trainer: Any, backend: str | None = None) -> CompiledForward:  # noqa: ANN401 - a Trainer
    """``--compile``'s forward over ``trainer``'s model (a
    :class:`~distmb.engine.trainer.Trainer`, built up to its model).

    Raises:
        InputError: the options' refusals (:func:`~distmb.config.train.compile_problem`),
            more than one rank, or a model that is not a built-in one.
    """
    built_in = type(trainer.model) in BUILT_IN_MODELS
    problem = compile_problem(trainer.cfg) or compile_refusal(trainer.num_ranks, built_in)
    if problem:
        raise InputError(problem)
    return CompiledForward(trainer.model, backend)
