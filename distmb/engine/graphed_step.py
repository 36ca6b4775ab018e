"""``--cuda-graphs``: one rank's training step replayed as one CUDA graph per padded layout.

A training step on the device path dispatches every op of the model's forward and backward
and of the optimizer from the host, one launch at a time. Captured once in a
:class:`torch.cuda.CUDAGraph` (PyTorch's "whole-network capture": forward, loss, backward and
``optimizer.step()``), the step is one replay. A graph replays fixed shapes and fixed
addresses, so each padded layout gets static buffers (:class:`~distmb.pipeline.sample.padded.
PaddedBatch`: the blocks padded to fixed shapes, the input rows and the labels) refilled in
place before every replay, and a static loss weight. A batch size's first layout is fitted
to its first batch (:func:`~distmb.pipeline.sample.padded.fitted_caps`: its sizes with 10 %
headroom, far below the bounds, which count every sampled neighbour as new); a later batch
that does not fit it gets a second fitted layout, and past :data:`MAX_FITTED_LAYOUTS` the
bounds' layout, which every batch of the size fits. The batches of an epoch have at most two
sizes (:meth:`~distmb.engine.trainer.Trainer.epoch_batches` splits them evenly), and a
size's batches differ little, so a run holds about two graphs.

**What a graph holds**: the trainer's forward on the padded batch (the halo scheme's calls
included: on one rank they launch nothing), ``logits[:n_seeds].float()``, the cross-entropy
summed over the real seeds, times the static loss weight, the backward and the optimizer step
(Adam with ``capturable=True``: its step counts live on the device), and the step's row of
the epoch's loss and accuracy (:func:`~distmb.engine.epoch_loss.step_values`: the summed loss
and the count of correct predictions, so that outside the graph the epoch copies one row per
step instead of counting from the logits). The outputs, that row and the logits, are static:
the next replay of the same graph overwrites them, so a caller that keeps them copies them.

**When graphs are captured**: lazily, at the steps of a batch size after its first
:data:`WARMUP_STEPS`, which run eagerly on a side stream (as the PyTorch docs' examples do:
Adam's state, Triton's compilation and cuBLAS's workspaces are made outside any capture). A
checkpoint's resume, which replaces the optimizer's state tensors, happens before the first
step, so no graph reads replaced tensors. The learning rate and weight decay are baked into
a graph as the optimizer's host floats: when they change (``--lr-schedule`` sets the lr once
per epoch) every graph is dropped and recaptured at its next step (no new warm-up). Capture
uses ``capture_error_mode="thread_local"``: the loader's prefetch thread may sample and read
the device while the training thread captures.

**Dropout** inside a graph draws from the CUDA default generator, which PyTorch registers
with every capture: each replay advances its offset, so replays draw fresh masks (checked by
``tests/test_graphed_step.py`` on a GPU).

**On the CPU**, where CUDA graphs do not exist, the same class runs the same static-buffer
step eagerly every time (``--cuda-graphs`` with ``--device cpu --sampler device``): CI tests
everything but the capture itself, and the op census counts the padded path's ops.

**Refused** (:class:`~distmb.core.errors.InputError` naming ``--cuda-graphs``): what the
options decide is :func:`~distmb.config.train.cuda_graphs_problem`'s, asked when the flag is
parsed and again here for a Trainer built in code (``--precision fp16``, whose gradient scaler
skips steps and updates its scale on the host; the C++ sampler; fan-out ``-1``, a layer of
all neighbours with no size bound; a ``--model`` that is not a built-in). What only the built
run knows is checked here: more than one rank (halo exchanges and the gradient all-reduce run
between the phases a graph fuses); a sampler other than the device path's (the graphed step
is the device path's); a model object that is not a built-in's class (the padding's proof,
padded rows never reach a real row, holds for the built-in layers; a user's layer may also
read a block's ``src_ids``, which padded blocks do not carry, or the host); on CUDA an
optimizer whose param groups are not ``capturable``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from distmb.config.train import TrainConfig, cuda_graphs_problem
from distmb.core.errors import InputError
from distmb.core.graph_lock import GRAPH_LOCK
from distmb.engine.epoch_loss import step_values
from distmb.engine.precision import MixedPrecision
from distmb.nn.models import BUILT_IN_MODELS
from distmb.pipeline.minibatch import MiniBatch
from distmb.pipeline.sample.padded import PaddedBatch, PaddedLayout, fitted_caps, padded_layout

#: Eager steps of each padded layout before its graph is captured (the PyTorch docs' examples
#: warm up 3 iterations on a side stream).
WARMUP_STEPS = 3
#: Layouts per batch size fitted to its batches (module docstring) before the bounds'
#: layout is taken: a batch that fits none of them gets a new one while there are fewer.
MAX_FITTED_LAYOUTS = 2

#: ``forward(batch, step, num_steps) -> logits``: the trainer's forward (halo scheme calls
#: and the model's layer loop).
Forward = Callable[[MiniBatch, int, int], torch.Tensor]


@dataclass
class StepOutputs:
    """What a training step returns.

    Attributes:
        values: float64[2], the step's row of the epoch's loss and accuracy
            (:func:`~distmb.engine.epoch_loss.step_values`: the cross-entropy summed over the
            batch's seeds, column ``LOSS``, and its correct predictions, ``CORRECT``).
        logits: float32[n_seeds, classes], the seeds' logits (detached).

    After a replay both are a graph's static outputs, overwritten by its next replay.
    """

    values: torch.Tensor
    logits: torch.Tensor


@dataclass
class _BatchSize:
    """The static state of one batch size.

    Attributes:
        padded: the padded blocks, input rows and labels.
        loss_weight: float32 scalar on the device, refilled every step.
        fitted: whether the layout is fitted to a batch (else the bounds').
        eager_steps: steps run eagerly so far (the warm-up).
        graph: the captured step (None until captured, or after it was dropped).
        outputs: the graph's static outputs.
    """

    padded: PaddedBatch
    loss_weight: torch.Tensor
    fitted: bool = False
    eager_steps: int = 0
    graph: Any = None  # torch.cuda.CUDAGraph (a CUDA build's class)
    outputs: StepOutputs | None = None


class GraphedStep:
    """The training step of one rank over padded static buffers, replayed as one CUDA graph
    per padded layout (module docstring); eager on the CPU.

    Args:
        optimizer: the model's optimizer (on CUDA: every param group ``capturable``).
        forward: the trainer's forward (:data:`Forward`) through the model.
        precision: the handling of ``config.precision`` (not fp16).
        device: the training device.
        config: the run's options (:func:`~distmb.config.train.cuda_graphs_problem`'s rules;
            ``--fanout``, input layer first, sizes the padded blocks).
        n_solid: the part's solid vertices (the bounds' cap).
        num_ranks: ranks of the run (must be 1).
        device_path: whether the run samples on the device path (it must).
        built_in: whether the model is a built-in's instance (it must be; on ``device``).

    Raises:
        InputError: a configuration the graphed step refuses (module docstring).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        forward: Forward,
        precision: MixedPrecision,
        device: torch.device,
        config: TrainConfig,
        n_solid: int,
        *,
        num_ranks: int = 1,
        device_path: bool = True,
        built_in: bool = True,
    ) -> None:
        problem = cuda_graphs_problem(config) or _run_refusal(num_ranks, device_path, built_in)
        if problem:
            raise InputError(problem)
        self.optimizer = optimizer
        self.forward = forward
        self.precision = precision
        self.device = device
        self.fanouts = tuple(config.fanout)
        self.n_solid = n_solid
        #: Whether steps replay CUDA graphs (a CUDA device), else run eagerly.
        self.graphs = device.type == "cuda"
        #: Graph replays and captures so far.
        self.replays = 0
        self.captures = 0
        self._sizes: dict[int, list[_BatchSize]] = {}  # per seed count, smallest first
        self._baked: tuple = ()
        self._stream = torch.cuda.Stream(device) if self.graphs else None
        if self.graphs:
            self._check_capturable()

    # -- a step --------------------------------------------------------------------------------
    def step(self, batch: MiniBatch, step: int, num_steps: int, loss_weight: float) -> StepOutputs:
        """Train on ``batch`` (one rank's, on the device): refill its layout's buffers
        (:meth:`~distmb.pipeline.sample.padded.PaddedBatch.launches` launches and the loss
        weight's fill, no host read), then replay its graph; or, before the graph
        exists, run the step eagerly (the warm-up) or capture and replay it.

        Args:
            batch: the mini-batch (its blocks within the bounds of its size).
            step, num_steps: the iteration and the epoch's iterations (for the halo scheme).
            loss_weight: the factor of the summed loss (``1 / batch size`` on one rank).
        """
        x = batch.input_rows()
        size = self._size_of(batch, x)
        size.padded.fill(batch.blocks, x, batch.labels)
        size.loss_weight.fill_(loss_weight)
        # Dropout, captures and replays use the CUDA generator: never during a capture of
        # the loader thread's sampler graphs (distmb.core.graph_lock).
        with GRAPH_LOCK:
            return self._step(batch, size, step, num_steps)

    def _step(self, batch: MiniBatch, size: _BatchSize, step: int, num_steps: int) -> StepOutputs:
        """:meth:`step` on the refilled buffers of ``size``."""
        if not self.graphs:
            return self._run(batch, size, step, num_steps)
        self._drop_stale_graphs()
        if size.graph is None:
            if size.eager_steps < WARMUP_STEPS:
                size.eager_steps += 1
                return self._side_stream_step(batch, size, step, num_steps)
            self._capture(batch, size, step, num_steps)
        size.graph.replay()
        self.replays += 1
        assert size.outputs is not None  # set by the capture
        return size.outputs

    def _size_of(self, batch: MiniBatch, x: torch.Tensor) -> _BatchSize:
        """The static state that ``batch`` (input rows ``x``) fits: the smallest of its
        batch size's layouts that it fits, else a new one, allocated at that batch: fitted
        to it (:func:`~distmb.pipeline.sample.padded.fitted_caps`) while the size has fewer
        than :data:`MAX_FITTED_LAYOUTS`, else the bounds' layout, which every batch fits."""
        n_seeds = batch.blocks[-1].n_dst
        sizes = self._sizes.setdefault(n_seeds, [])
        for size in sizes:  # smallest first
            if size.padded.layout.fits(batch.blocks):
                return size
        fitted = sum(size.fitted for size in sizes) < MAX_FITTED_LAYOUTS
        caps = fitted_caps(batch.blocks, self.fanouts) if fitted else None
        layout = padded_layout(n_seeds, self.fanouts, self.n_solid, caps)
        padded = PaddedBatch(layout, int(x.shape[1]), x.dtype, self.device)
        weight = torch.zeros((), dtype=torch.float32, device=self.device)
        size = _BatchSize(padded, weight, fitted=fitted)
        sizes.append(size)
        sizes.sort(key=lambda s: (sum(s.padded.layout.edges), s.padded.layout.input_rows))
        return size

    def layouts(self) -> dict[int, list[PaddedLayout]]:
        """The padded layouts allocated so far, per batch size (seeds), smallest first."""
        return {n: [size.padded.layout for size in sizes] for n, sizes in self._sizes.items()}

    def _run(self, batch: MiniBatch, size: _BatchSize, step: int, num_steps: int) -> StepOutputs:
        """The step on the static buffers: forward, loss, the step's row of loss and correct
        count, backward, optimizer step (what a graph captures). Gradients are set to None
        first: a captured backward then makes them in the graph's memory, and every replay
        writes them afresh."""
        padded = size.padded
        self.optimizer.zero_grad(set_to_none=True)
        static = MiniBatch(
            epoch=batch.epoch,
            index=batch.index,
            seeds=batch.seeds,
            blocks=padded.blocks(),
            labels=padded.labels,
            x=padded.x,
        )
        with self._autocast():
            logits = self.forward(static, step, num_steps)
        logits = logits[: padded.layout.n_seeds].float()  # the loss in float32
        loss_sum = F.cross_entropy(logits, padded.labels, reduction="sum")
        values = step_values(loss_sum, logits, padded.labels)
        self.precision.backward(loss_sum * size.loss_weight)
        self.optimizer.step()
        return StepOutputs(values, logits.detach())

    @contextlib.contextmanager
    def _autocast(self) -> Iterator[None]:
        """The forward's precision; autocast without its weight cache, which a capture must
        not keep across replays (PyTorch's CUDA graphs notes)."""
        if self.precision.dtype is None:  # fp32, tf32
            with self.precision.autocast():
                yield
            return
        with torch.autocast(self.device.type, dtype=self.precision.dtype, cache_enabled=False):
            yield

    # -- CUDA graphs ---------------------------------------------------------------------------
    def _side_stream_step(
        self, batch: MiniBatch, size: _BatchSize, step: int, num_steps: int
    ) -> StepOutputs:
        """One warm-up step, eager, on the side stream (ordered after the refill and before
        whatever the current stream does next)."""
        current = torch.cuda.current_stream(self.device)
        assert self._stream is not None  # CUDA
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            outputs = self._run(batch, size, step, num_steps)
        current.wait_stream(self._stream)
        for tensor in (outputs.values, outputs.logits):
            tensor.record_stream(current)  # used there next
        return outputs

    def _capture(self, batch: MiniBatch, size: _BatchSize, step: int, num_steps: int) -> None:
        """Capture the step of ``size`` (nothing runs; the caller replays it)."""
        self._check_capturable()
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            size.outputs = self._run(batch, size, step, num_steps)
        size.graph = graph
        self.captures += 1

    def _drop_stale_graphs(self) -> None:
        """Drop every graph when a value baked into them changed (the lr, weight decay)."""
        baked = tuple(
            tuple(_baked_value(group[key]) for key in ("lr", "weight_decay") if key in group)
            for group in self.optimizer.param_groups
        )
        if baked != self._baked:
            for sizes in self._sizes.values():
                for size in sizes:
                    size.graph, size.outputs = None, None
            self._baked = baked

    def _check_capturable(self) -> None:
        """Refuse an optimizer a graph cannot capture (a param group not ``capturable``)."""
        if not all(group.get("capturable", False) for group in self.optimizer.param_groups):
            raise InputError(
                f"--cuda-graphs: the optimizer ({type(self.optimizer).__name__}) must be "
                "capturable on a GPU (e.g. torch.optim.Adam(..., capturable=True))"
            )


def _baked_value(value: Any) -> Any:  # noqa: ANN401 - a param group's value
    """A param group's value as a graph bakes it: a host number by value, a tensor (read by
    the graph where it lives) by identity."""
    return ("tensor", id(value)) if isinstance(value, torch.Tensor) else value


def _run_refusal(num_ranks: int, device_path: bool, built_in: bool) -> str | None:
    """Why the graphed step cannot run with what the built run has (module docstring; the
    options' rules are :func:`~distmb.config.train.cuda_graphs_problem`'s), or None."""
    if num_ranks != 1:
        return (
            f"--cuda-graphs: one rank only, this run has {num_ranks} (halo exchanges and the "
            "gradient all-reduce run between the phases a graph fuses)"
        )
    if not device_path:
        return "--cuda-graphs: needs the device path (--sampler device, or auto with --device cuda)"
    if not built_in:
        return "--cuda-graphs: the built-in models only (sage, gat, gcn, gin), not a user's model"
    return None


def graphed_step_for(trainer: Any) -> GraphedStep:  # noqa: ANN401 - a Trainer
    """``--cuda-graphs``' step over ``trainer``'s model, optimizer and forward (a
    :class:`~distmb.engine.trainer.Trainer`, built up to its optimizer and loader).

    Raises:
        InputError: the options' refusals (:func:`~distmb.config.train.cuda_graphs_problem`),
            more than one rank, no device path, a user's model, or an optimizer that is not
            capturable on a GPU.
    """
    return GraphedStep(
        trainer.optimizer,
        # Looked up at every call: the trainer's forward may be wrapped after this.
        lambda batch, step, num_steps: trainer.forward(batch, step, num_steps),
        trainer.precision,
        trainer.device,
        trainer.cfg,
        int(trainer.local.n_solid),
        num_ranks=trainer.num_ranks,
        device_path=trainer.parts.device_stages is not None,
        built_in=type(trainer.model) in BUILT_IN_MODELS,
    )
