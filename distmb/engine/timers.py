"""Per-epoch phase timers, as the paper reports them: MBC, FWD, BWD, ARed (+ more).

Each phase gets two clocks: its seconds, what the epoch spent in it, and the CPU seconds of
the thread that ran it (``time.thread_time``), what the phase cost that thread whoever else
shared the core. On an oversubscribed machine (more ranks than cores) the wall time of a
phase includes the time slices of the other ranks; the thread's CPU time does not. It counts
the calling thread only: with ``--threads 1`` (PyTorch and the C++ kernels run on the calling
thread) it is the phase's whole compute; with more threads the work of the other OpenMP
threads is not in it.

A phase's seconds are wall-clock seconds (``time.perf_counter``) on the CPU, where ops are
synchronous. On a CUDA device they are GPU time: CUDA timing events are recorded on the
current stream at the phase's start and end (:class:`~distmb.pipeline.streams.EventClock`),
kept, and read once per epoch by :meth:`PhaseTimer.resolve`, the epoch's one wait for the
device; the seconds are those between the phase's two events, the phase's kernels and any
queueing and idle gaps inside it (the stream waiting for the host's launches, or for another
stream), not the host time the launches took. The thread-CPU seconds stay host clocks.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from distmb.engine.device import synchronize
from distmb.pipeline.streams import EventClock, EventSpan

#: Phases of a training iteration, in the order they are reported.
PHASES = ("mbc", "fwd", "bwd", "ared", "opt")
PHASE_LABELS = {
    "mbc": "MBC",
    "fwd": "FWD",
    "bwd": "BWD",
    "ared": "ARed",
    "opt": "OPT",
}
#: Digits kept of the seconds in records.
SECONDS_DIGITS = 4


class PhaseTimer:
    """Accumulates seconds and thread-CPU seconds per phase; ``with timer("fwd"): ...``.

    Args:
        device: the device the timed work runs on (default: the CPU). On CUDA the phases'
            seconds are read from events at :meth:`resolve` (see the module docstring);
            elsewhere they are host clocks, added when each phase ends.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        #: Seconds per phase (or stage added with :meth:`add`); on CUDA complete only after
        #: :meth:`resolve`.
        self.seconds: dict[str, float] = defaultdict(float)
        #: CPU seconds of the calling thread per phase (see the module docstring).
        self.cpu_seconds: dict[str, float] = defaultdict(float)
        self._clock = EventClock(self.device)
        #: Event spans not yet read, by phase, in the order they were timed.
        self._pending: list[tuple[str, EventSpan]] = []

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start, cpu_start = time.perf_counter(), time.thread_time()
        mark = self._clock.mark()
        try:
            yield
        finally:
            span = self._clock.span(mark)
            self.add(phase, time.perf_counter() - start, span)
            self.cpu_seconds[phase] += time.thread_time() - cpu_start

    def add(self, phase: str, host_seconds: float, span: EventSpan | None = None) -> None:
        """Add one stretch of ``phase`` timed elsewhere (the loader's sample and gather
        stages): its device ``span`` when this timer runs on CUDA and there is one (read at
        :meth:`resolve`), else its ``host_seconds``."""
        if span is not None and self._clock.enabled:
            self._pending.append((phase, span))
        else:
            self.seconds[phase] += host_seconds

    def resolve(self) -> None:
        """Once per epoch, after its last phase: wait for the device
        (:func:`~distmb.engine.device.synchronize`: one counted wait on every device, the
        proxy of a GPU run's; a real wait on CUDA only) and add the pending event spans'
        seconds to their phases."""
        synchronize(self.device)
        for phase, span in self._pending:
            self.seconds[phase] += span.seconds()
        self._pending.clear()

    def reset(self) -> None:
        self.seconds.clear()
        self.cpu_seconds.clear()
        self._pending.clear()

    def as_dict(self) -> dict[str, float]:
        """Wall-clock seconds per phase, every phase of :data:`PHASES` present."""
        return {p: round(self.seconds.get(p, 0.0), SECONDS_DIGITS) for p in PHASES}

    def cpu_dict(self) -> dict[str, float]:
        """Thread-CPU seconds per phase timed on this timer's threads, as ``<phase>_cpu``
        (every phase of :data:`PHASES` but ``mbc``, which the loader times itself)."""
        return {
            f"{p}_cpu": round(self.cpu_seconds.get(p, 0.0), SECONDS_DIGITS)
            for p in PHASES
            if p != "mbc"
        }
