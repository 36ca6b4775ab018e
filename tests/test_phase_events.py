"""Phase times without a host wait per iteration (:mod:`distmb.engine.timers`).

On the CPU the timer keeps host clocks (each phase's seconds lie between an inner and an
outer ``perf_counter`` bracket of the same code) and an epoch makes exactly one counted
device wait, at its end (:meth:`PhaseTimer.resolve`), none inside its iterations; a stray
per-phase synchronize is caught. On a GPU (``cuda``-marked) the phase seconds are read from
CUDA events: positive, within the epoch's wall time, one wait per epoch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from distmb.config.train import TrainConfig
from distmb.core.host_reads import HOST_READS
from distmb.data.datasets import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.device import synchronize
from distmb.engine.timers import PHASES, PhaseTimer

GRAPH = "synthetic:nodes=1200,feat_dim=8,train_fraction=0.3,test_fraction=0.5"
#: Seconds each timed phase sleeps in the host-clock test.
NAP_S = 0.002
#: Slack of a sum of records' seconds (each rounded to 4 digits) against the epoch time.
ROUNDING_S = 1e-3


def _waits() -> int:
    return HOST_READS.snapshot()[1]


# ---- the timer on the CPU ------------------------------------------------------------------


def test_cpu_phase_seconds_are_the_host_clocks_and_make_no_wait():
    timer = PhaseTimer(torch.device("cpu"))
    inner = dict.fromkeys(("fwd", "bwd"), 0.0)
    outer = dict.fromkeys(("fwd", "bwd"), 0.0)
    waits = _waits()
    for _ in range(3):
        for phase in ("fwd", "bwd"):
            before = time.perf_counter()
            with timer(phase):
                start = time.perf_counter()
                time.sleep(NAP_S)
                inner[phase] += time.perf_counter() - start
            outer[phase] += time.perf_counter() - before
    timer.add("sample", 0.25)
    timer.add("sample", 0.5)
    assert _waits() == waits  # no wait inside the phases
    for phase in ("fwd", "bwd"):
        assert inner[phase] <= timer.seconds[phase] <= outer[phase]
    assert timer.seconds["sample"] == 0.75
    seen = dict(timer.seconds)
    timer.resolve()
    assert _waits() == waits + 1  # the epoch's one counted wait, on the CPU too
    assert dict(timer.seconds) == seen  # nothing pending on the CPU


class _TickSpan:
    """A span of a scripted clock: ``seconds()`` is its length, readable once resolved."""

    def __init__(self, clock: _ScriptedClock, start: int, end: int) -> None:
        self.clock, self.start, self.end = clock, start, end

    def seconds(self) -> float:
        assert self.clock.synchronized, "a span was read before the device was waited for"
        return float(self.end - self.start)


class _ScriptedClock:
    """The event clock's interface over a counter (one tick per mark): the CUDA timer's
    bookkeeping, run where no GPU is."""

    enabled = True

    def __init__(self) -> None:
        self.ticks = 0
        self.synchronized = False

    def mark(self) -> int:
        self.ticks += 1
        return self.ticks

    def span(self, start: int) -> _TickSpan:
        return _TickSpan(self, start, self.mark())


def test_event_spans_are_read_once_at_resolve(monkeypatch):
    """With an enabled clock the phases' seconds wait for :meth:`resolve`, which adds every
    span once and waits once; spans given to :meth:`add` replace the host seconds."""
    timer = PhaseTimer(torch.device("cpu"))
    clock = _ScriptedClock()
    monkeypatch.setattr(timer, "_clock", clock)
    synchronized = []

    def wait(device: torch.device) -> None:
        synchronized.append(device)
        clock.synchronized = True

    monkeypatch.setattr("distmb.engine.timers.synchronize", wait)
    with timer("fwd"):  # ticks 1 -> 2
        pass
    clock.mark()  # work outside the phases: tick 3
    with timer("fwd"):  # 4 -> 5
        clock.mark()  # 5; ends at 6
    timer.add("sample", 99.0, clock.span(clock.mark()))  # 7 -> 8
    timer.add("gather", 0.5)  # no span: host seconds
    assert timer.seconds["fwd"] == 0.0 and timer.seconds["sample"] == 0.0
    assert timer.cpu_seconds["fwd"] >= 0.0  # the thread's CPU time stays a host clock
    timer.resolve()
    assert synchronized == [torch.device("cpu")]
    assert timer.seconds["fwd"] == 1.0 + 2.0 and timer.seconds["sample"] == 1.0
    assert timer.seconds["gather"] == 0.5
    timer.resolve()  # nothing pending: the seconds stay
    assert timer.seconds["fwd"] == 3.0
    with timer("bwd"):
        pass
    timer.reset()
    timer.resolve()
    assert timer.seconds["bwd"] == 0.0  # reset dropped the pending span


# ---- an epoch of the device path ------------------------------------------------------------


def _trainer(device: str, prefetch: int) -> Trainer:
    config = TrainConfig(
        layers=2, fanout=(4, 6), hidden=16, batch_size=60, epochs=3, progress=False,
        sampler="device" if device == "cpu" else "auto", kernels="torch", prefetch=prefetch,
        threads=1, device=device,
    )  # fmt: skip
    return Trainer(LocalGraph.from_graph(load_dataset(GRAPH)), config, log=lambda _: None)


def _epoch_waits(trainer: Trainer, epoch: int) -> tuple[int, int, dict]:
    """``(waits inside the loop, waits of the whole epoch, record)`` of one epoch."""
    timer = trainer.timer
    resolve = timer.resolve
    at_resolve: list[int] = []

    def counted_resolve() -> None:
        at_resolve.append(_waits())
        resolve()

    timer.resolve = counted_resolve
    try:
        before = _waits()
        record = trainer.train_epoch(epoch)
        after = _waits()
    finally:
        del timer.resolve
    assert len(at_resolve) == 1, "the epoch resolves its timer once"
    return at_resolve[0] - before, after - before, record


@pytest.fixture(scope="module")
def cpu_trainer() -> Trainer:
    trainer = _trainer("cpu", prefetch=0)
    trainer.train_epoch(0)
    return trainer


def test_a_device_path_epoch_waits_once_at_its_end(cpu_trainer):
    in_loop, total, record = _epoch_waits(cpu_trainer, 1)
    assert record["iterations"] > 1
    assert (in_loop, total) == (0, 1)
    assert record["mbc"] == pytest.approx(record["sample"] + record["gather"], abs=2e-4)
    assert min(record["fwd"], record["bwd"], record["sample"]) > 0


class _SyncingTimer:
    """The breakage: the old loop's synchronize at the end of every phase."""

    def __init__(self, timer: PhaseTimer, device: torch.device) -> None:
        self._timer, self._device = timer, device

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        with self._timer(phase):
            yield
            synchronize(self._device)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._timer, name)


def test_a_stray_per_phase_wait_is_caught(cpu_trainer, monkeypatch):
    syncing = _SyncingTimer(cpu_trainer.timer, cpu_trainer.device)
    monkeypatch.setattr(cpu_trainer, "timer", syncing)
    in_loop, total, record = _epoch_waits(cpu_trainer, 1)
    phases = len(PHASES) - 1  # every phase but mbc is timed in the loop
    assert in_loop == phases * record["iterations"] and total == in_loop + 1


# ---- on a GPU -------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("prefetch", [0, 2])
def test_cuda_phase_seconds_are_gpu_time_within_the_epoch(prefetch):
    trainer = _trainer("cuda", prefetch)
    assert trainer.device.type == "cuda"
    trainer.train_epoch(0)  # warm-up
    for epoch in (1, 2):
        in_loop, total, record = _epoch_waits(trainer, epoch)
        assert (in_loop, total) == (0, 1)
        assert min(record[p] for p in ("fwd", "bwd", "opt", "sample", "gather")) > 0
        training = sum(record[p] for p in ("fwd", "bwd", "ared", "opt"))
        # One stream: the phases' event spans are disjoint and inside the epoch. The loader's
        # spans are on that stream too without prefetch, on its own stream with it.
        assert training + (record["mbc"] if prefetch == 0 else 0.0) <= (
            record["epoch_time"] + ROUNDING_S
        )
        assert record["mbc"] <= record["epoch_time"] + ROUNDING_S
        assert record["mbc"] == pytest.approx(record["sample"] + record["gather"], abs=2e-4)
