"""Per-epoch phase timers, as the paper reports them: MBC, FWD, BWD, ARed (+ more)."""

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


class PhaseTimer:
    """Accumulates wall-clock seconds per phase; ``with timer("fwd"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def reset(self) -> None:
        self.seconds.clear()

    def as_dict(self) -> dict[str, float]:
        """Seconds per phase, every phase of :data:`PHASES` present."""
        return {p: round(self.seconds.get(p, 0.0), 4) for p in PHASES}
