"""A census of one training epoch's work on the device path, per iteration: the CPU proxies
of a GPU run's kernel launches and host synchronisations (docs/cuda.md, "Launches and host
synchronisations").

- **aten ops**: every ATen operator dispatched (a :class:`TorchDispatchMode` below autograd,
  so backward ops count too), by stage: ``sample``, ``gather``, ``hec`` (the halo scheme's
  calls), ``forward``, ``backward``, ``allreduce``, ``optimizer`` and ``other`` (the loop's
  own: loss bookkeeping), and ``graph``: with ``--cuda-graphs`` the step that a GPU captures
  and replays as one CUDA graph (on the CPU it runs eagerly and its ops are counted there,
  inside ``forward``). On a GPU nearly every one is a kernel launch, so fewer ops is
  fewer launches. Not launches: views, and the ops of :data:`LAUNCH_FREE_OPS` (an
  allocation without a fill, the profiler's markers); ``launch_ops`` counts the others.
  Where the CPU decomposes an op that CUDA runs as one kernel (``dropout``: ``bernoulli_``,
  ``div_``, ``mul`` on the CPU, one ``native_dropout`` on CUDA) the proxy counts more than a
  GPU launches.
- **sync-prone ops**: the aten ops among them whose output size or value the host must read
  back on a GPU (:data:`SYNCING_OPS`: ``nonzero``, ``unique``, ``bincount``, an ``item``
  ...; and, by their arguments, ``repeat_interleave`` without ``output_size`` and boolean-mask
  indexing: :func:`syncs_on_a_gpu`); each is a hidden host synchronisation on a GPU, even
  where the CPU runs it without one.
- **host reads** and **device waits**: :data:`distmb.core.host_reads.HOST_READS`, the exact
  count of the device path's explicit reads and of the phase timers' waits.
- **Triton launches**, by stage: one per kernel run (``kernel[grid](...)``), whether compiled
  (a GPU) or interpreted (``TRITON_INTERPRET=1`` on CPU tensors); the ATen ops Triton's
  interpreter dispatches to run a kernel on the CPU are not counted (a GPU runs none). So on
  CPU tensors with the Triton back ends forced on, ``launches`` (``launch_ops +
  triton_launches``) is the proxy of the GPU configuration's launches.

Counted on the calling thread: the census runs the loader synchronously (``--prefetch 0``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from distmb.core.host_reads import HOST_READS

#: ATen ops that read a device value or a data-dependent size back to the host.
SYNCING_OPS = frozenset(
    {
        "aten._local_scalar_dense",  # .item(), int(t), bool(t), float(t)
        "aten.nonzero",
        "aten.masked_select",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten._unique",
        "aten.is_nonzero",
        "aten.equal",
        "aten.bincount",  # its output size is the input's maximum: read back on a GPU
    }
)


#: ATen ops that launch no kernel on a GPU (besides views): allocations without a fill and
#: the profiler's ``record_function`` markers (the optimizer's step opens one).
LAUNCH_FREE_OPS = frozenset(
    {
        "aten.empty",
        "aten.empty_like",
        "aten.empty_strided",
        "aten.new_empty",
        "aten.new_empty_strided",
        "profiler._record_function_enter",
        "profiler._record_function_enter_new",
        "profiler._record_function_exit",
    }
)


def syncs_on_a_gpu(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the ATen op ``name`` called with ``args``/``kwargs`` would make the host wait
    for a GPU (a device value or a data-dependent size read back): every op of
    :data:`SYNCING_OPS`, and by their arguments ``repeat_interleave`` without
    ``output_size`` (it sums the repeats on the host) and indexing with a boolean mask (a
    hidden ``nonzero``). On CPU tensors none of them waits, so the census inspects the
    call."""
    if name in SYNCING_OPS:
        return True
    if name == "aten.repeat_interleave":
        return kwargs.get("output_size") is None
    if name in ("aten.index", "aten.index_put_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(getattr(i, "dtype", None) in (torch.bool, torch.uint8) for i in indices or ())
    return False


#: The stages ops are counted by (``other``: outside every stage; ``graph``: a
#: ``--cuda-graphs`` step's captured part).
STAGES = (
    "sample", "gather", "hec", "forward", "backward", "allreduce", "optimizer", "graph", "other"
)  # fmt: skip
#: The trainer's phase timer names, as stages.
_PHASE_STAGE = {"fwd": "forward", "bwd": "backward", "ared": "allreduce", "opt": "optimizer"}
#: The halo scheme's per-iteration calls.
_HALO_CALLS = ("after_sample", "layer_input", "end_iteration")


class _OpCounter(TorchDispatchMode):
    """Counts every dispatched ATen op by the innermost open stage."""

    def __init__(self) -> None:
        super().__init__()
        self.stages: list[str] = []
        self.ops: Counter[str] = Counter()
        self.views: Counter[str] = Counter()
        self.launch_free: Counter[str] = Counter()
        self.syncing: Counter[str] = Counter()
        self.by_name: Counter[str] = Counter()
        self.triton: Counter[str] = Counter()
        #: Steps counted per stage (the ``graph`` stage's runs).
        self.entered: Counter[str] = Counter()
        #: Nesting depth of Triton kernel runs: their own ATen ops are not counted.
        self.in_kernel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if self.in_kernel:
            return func(*args, **(kwargs or {}))
        stage = self.stages[-1] if self.stages else "other"
        name = str(func.overloadpacket)
        self.ops[stage] += 1
        if func.is_view:
            self.views[stage] += 1
        elif name in LAUNCH_FREE_OPS:
            self.launch_free[stage] += 1
        self.by_name[name] += 1
        if syncs_on_a_gpu(name, args, kwargs or {}):
            self.syncing[stage] += 1
        return func(*args, **(kwargs or {}))

    @contextmanager
    def kernel(self) -> Iterator[None]:
        """One Triton kernel run: counted once, in the current stage; its ops are not."""
        self.triton[self.stages[-1] if self.stages else "other"] += 1
        self.in_kernel += 1
        try:
            yield
        finally:
            self.in_kernel -= 1

    @contextmanager
    def stage(self, name: str, steps: int = 0) -> Iterator[None]:
        """Count ops in stage ``name`` meanwhile; ``steps``: added to :attr:`entered`."""
        self.entered[name] += steps
        self.stages.append(name)
        try:
            yield
        finally:
            self.stages.pop()


@dataclass
class EpochCensus:
    """One epoch's counts, totals and per iteration.

    Attributes:
        iterations: training iterations of the epoch.
        aten_ops: ATen ops by stage (:data:`STAGES`), epoch totals.
        view_ops: those of them that are views (no kernel on a GPU), by stage.
        launch_free_ops: those of them in :data:`LAUNCH_FREE_OPS` (no kernel either), by
            stage.
        syncing_ops: sync-prone ops (:data:`SYNCING_OPS`) by stage, epoch totals.
        host_reads: explicit device-to-host reads (:func:`~distmb.core.host_reads.to_host`).
        device_waits: explicit waits for the device (the phase timers).
        top_ops: the most frequent op names and their epoch totals.
        triton_launches: Triton kernel runs by stage, epoch totals.
        graph_steps: ``--cuda-graphs`` steps run (each one replay on a GPU; 0 without).
        sampler_replays: the device sampler's batches replayed from a graph
            (:mod:`distmb.pipeline.sample.graphed`; its CPU stand-in's ops are counted in the
            ``graph`` stage).
    """

    iterations: int
    aten_ops: dict[str, int]
    view_ops: dict[str, int]
    syncing_ops: dict[str, int]
    host_reads: int
    device_waits: int
    top_ops: dict[str, int] = field(default_factory=dict)
    triton_launches: dict[str, int] = field(default_factory=dict)
    launch_free_ops: dict[str, int] = field(default_factory=dict)
    graph_steps: int = 0
    sampler_replays: int = 0

    def launch_ops(self) -> dict[str, int]:
        """ATen ops that launch a kernel on a GPU (neither views nor
        :data:`LAUNCH_FREE_OPS`), by stage, epoch totals."""
        return {
            stage: ops - self.view_ops.get(stage, 0) - self.launch_free_ops.get(stage, 0)
            for stage, ops in self.aten_ops.items()
        }

    def per_iteration(self) -> dict[str, Any]:
        """The counts divided by the iterations (rounded to 0.01), for a record:
        ``aten_ops`` (and by stage), ``non_view_ops``, ``launch_ops`` (and by stage: the
        launch proxy, :meth:`launch_ops`), ``syncing_ops`` (and by stage), ``host_reads``,
        ``device_waits``, ``triton_launches`` (and by stage), and ``launches``: launch ops
        plus Triton launches; with ``--cuda-graphs`` also ``launches_graphed``, what a GPU
        launches: those outside the ``graph`` stage plus one per replay (the step's and the
        sampler's)."""
        n = max(self.iterations, 1)
        launch_ops = self.launch_ops()
        in_graph = launch_ops.get("graph", 0) + self.triton_launches.get("graph", 0)
        total = sum(launch_ops.values()) + sum(self.triton_launches.values())
        replays = self.graph_steps + self.sampler_replays
        graphed = total - in_graph + replays

        def each(value: float) -> float:
            return round(value / n, 2)

        return {
            "iterations": self.iterations,
            "aten_ops": each(sum(self.aten_ops.values())),
            "aten_ops_by_stage": {k: each(v) for k, v in self.aten_ops.items()},
            "non_view_ops": each(sum(self.aten_ops.values()) - sum(self.view_ops.values())),
            "launch_ops": each(sum(launch_ops.values())),
            "launch_ops_by_stage": {k: each(v) for k, v in launch_ops.items()},
            "syncing_ops": each(sum(self.syncing_ops.values())),
            "syncing_ops_by_stage": {k: each(v) for k, v in self.syncing_ops.items() if v},
            "host_reads": each(self.host_reads),
            "device_waits": each(self.device_waits),
            "triton_launches": each(sum(self.triton_launches.values())),
            "triton_launches_by_stage": {k: each(v) for k, v in self.triton_launches.items() if v},
            "launches": each(total),
            **({"launches_graphed": each(graphed)} if replays else {}),
        }


def _wrap(owner: Any, name: str, enter: Callable[[], Any], undo: list) -> None:  # noqa: ANN401
    """Replace ``owner.name`` by a call inside the context ``enter()``; ``undo`` restores."""
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        with enter():
            return original(*args, **kwargs)

    had_own = name in vars(owner)
    setattr(owner, name, wrapped)
    undo.append(lambda: setattr(owner, name, original) if had_own else delattr(owner, name))


class _StagedTimer:
    """The trainer's phase timer, its phases also opening the census's stages."""

    def __init__(self, timer: Any, counter: _OpCounter) -> None:  # noqa: ANN401
        self._timer, self._counter = timer, counter

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        with self._timer(phase), self._counter.stage(_PHASE_STAGE.get(phase, "other")):
            yield

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401
        return getattr(self._timer, name)


def census_epoch(trainer: Any, epoch: int, top: int = 12) -> EpochCensus:  # noqa: ANN401
    """Train epoch ``epoch`` of ``trainer`` (a :class:`~distmb.engine.trainer.Trainer` whose
    loader is synchronous: ``prefetch=0``) and count its ops, reads and waits.

    Raises:
        ValueError: the trainer's loader prefetches on a thread (its ops would be missed).
    """
    if not trainer.loader.synchronous:
        raise ValueError("census_epoch: build the trainer with prefetch=0 (ops of the loader's "
                         "thread are not counted)")  # fmt: skip
    counter = _OpCounter()
    undo: list[Callable[[], None]] = []
    _wrap(trainer.loader, "sample_batch", lambda: counter.stage("sample"), undo)
    _wrap(trainer.loader, "gather_batch", lambda: counter.stage("gather"), undo)
    for name in _HALO_CALLS:
        _wrap(trainer.halo, name, lambda: counter.stage("hec"), undo)
    for kernel_class in triton_kernel_classes():
        _wrap(kernel_class, "run", counter.kernel, undo)
    graphed = getattr(trainer, "graphed", None)
    replays_before = 0
    if graphed is not None:  # --cuda-graphs: the captured step (eager on the CPU)
        _wrap(graphed, "_run", lambda: counter.stage("graph", steps=1), undo)
        replays_before = graphed.replays
    sampler_graphs = getattr(trainer.loader.sampler, "graphs", None)
    sampler_before = 0
    if sampler_graphs is not None:  # the device sampler's graphs (a stand-in on the CPU)
        _wrap(sampler_graphs, "_replay", lambda: counter.stage("graph"), undo)
        sampler_before = sampler_graphs.replays
    timer = trainer.timer
    trainer.timer = _StagedTimer(timer, counter)
    reads, waits = HOST_READS.snapshot()
    try:
        with counter:
            record = trainer.train_epoch(epoch)
    finally:
        trainer.timer = timer
        for restore in reversed(undo):
            restore()
    after_reads, after_waits = HOST_READS.snapshot()
    return EpochCensus(
        iterations=int(record["iterations"]),
        aten_ops={stage: counter.ops.get(stage, 0) for stage in STAGES},
        view_ops={stage: counter.views.get(stage, 0) for stage in STAGES},
        syncing_ops={stage: counter.syncing.get(stage, 0) for stage in STAGES},
        host_reads=after_reads - reads,
        device_waits=after_waits - waits,
        top_ops=dict(counter.by_name.most_common(top)),
        triton_launches={stage: counter.triton.get(stage, 0) for stage in STAGES},
        launch_free_ops={stage: counter.launch_free.get(stage, 0) for stage in STAGES},
        # Each step is a replay on a GPU, or a run of the step's ops (eager, a capture).
        graph_steps=counter.entered["graph"] + (graphed.replays - replays_before if graphed else 0),
        sampler_replays=sampler_graphs.replays - sampler_before if sampler_graphs else 0,
    )


def triton_kernel_classes() -> list[type]:
    """The classes whose ``run`` launches a Triton kernel: the compiled kernels' and the
    interpreter's (none when Triton is not installed)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:  # optional dependency
        return []
    return [JITFunction, InterpretedFunction]
