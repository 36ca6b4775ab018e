"""Per-epoch phase timers, as the paper reports them: MBC, FWD, BWD, ARed (+ more).

Each phase gets two clocks: wall-clock seconds (``time.perf_counter``), what the epoch took,
and the CPU seconds of the thread that ran it (``time.thread_time``), what the phase cost
that thread whoever else shared the core. On an oversubscribed machine (more ranks than
cores) the wall time of a phase includes the time slices of the other ranks; the thread's
CPU time does not. It counts the calling thread only: with ``--threads 1`` (PyTorch and the
C++ kernels run on the calling thread) it is the phase's whole compute; with more threads
the work of the other OpenMP threads is not in it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

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
    """Accumulates wall-clock and thread-CPU seconds per phase; ``with timer("fwd"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        #: CPU seconds of the calling thread per phase (see the module docstring).
        self.cpu_seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start
            self.cpu_seconds[phase] += time.thread_time() - cpu_start

    def reset(self) -> None:
        self.seconds.clear()
        self.cpu_seconds.clear()

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
