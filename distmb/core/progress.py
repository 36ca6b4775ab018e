"""Progress reporting, in one place: timestamped step lines (:class:`Progress`) and the
progress of long loops (:func:`meter`): training iterations, evaluation layers, CSV parsing,
partition writing.

A loop's progress is shown one of three ways, chosen by :func:`meter`:

- stderr is a terminal: a single updating line (tqdm);
- stderr is not a terminal (mpirun/srun logs, notebooks, redirected output): a plain line
  every :attr:`ProgressSettings.every` seconds, e.g.
  ``progress: epoch 3: 12/40 iterations (30.0%), 1234.5 samples/s, elapsed 0:07, ETA 0:23``
  (:data:`LINE_PATTERN` parses it);
- disabled (``--no-progress``, ``--progress-every 0`` without a terminal, ranks other than
  0): nothing.

Loaders deep in the data path take the process-wide :func:`settings` (set once by the
command-line tools with :func:`configure`); the trainer passes its own.
"""

from __future__ import annotations

import re
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Protocol

#: Default seconds between two plain progress lines (``--progress-every``).
DEFAULT_PROGRESS_EVERY = 10.0

#: A plain progress line: label, done, total, unit, percent, rate, rate unit, elapsed, ETA
#: (``?`` before the first step), then optional ``, key value`` extras.
LINE_PATTERN = re.compile(
    r"^progress: (?P<label>.+?): (?P<done>[\d.]+)/(?P<total>[\d.]+) (?P<unit>\S+) "
    r"\((?P<percent>[\d.]+)%\), (?P<rate>[\d.]+) (?P<rate_unit>\S+)/s, "
    r"elapsed (?P<elapsed>[\d:]+), ETA (?P<eta>[\d:]+|\?)(?P<extra>(, .+)?)$"
)

#: Seconds -> float; :func:`time.perf_counter` unless a test passes a fake clock.
Clock = Callable[[], float]


#: Where Linux reports this process' resident-set high-water mark (``VmHWM``, KiB).
_PROC_STATUS = "/proc/self/status"


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes.

    Linux: ``VmHWM`` of ``/proc/self/status``, the high-water mark of this program's own
    memory. Not ``ru_maxrss``: the kernel carries the launching process' peak over ``exec``
    into it, so a partitioner started from a large parent (a benchmark holding a graph)
    would report the parent's peak. Elsewhere ``ru_maxrss`` (KiB on Linux and BSD).
    """
    try:
        with open(_PROC_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class Progress:
    """Prints ``[  12.3s] message`` lines to stderr (or nothing when ``quiet``)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since construction."""
        return time.perf_counter() - self.start

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[{self.elapsed():7.1f}s] {message}", file=sys.stderr, flush=True)


def format_duration(seconds: float) -> str:
    """``m:ss`` below an hour, ``h:mm:ss`` above (whole seconds, rounded down)."""
    s = max(int(seconds), 0)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Meter(Protocol):
    """The progress of one loop of known length (what :func:`meter` returns)."""

    def update(self, steps: float = 1, items: float | None = None, **extra: object) -> None:
        """``steps`` more of the total done, ``items`` more of what the rate counts (default:
        ``steps``); ``extra`` values are shown after the rate (``loss="0.1234"``), formatted
        with ``str()`` only when a line prints."""

    def close(self) -> None:
        """The loop ended (a terminal bar disappears; a plain meter prints nothing more)."""


class RateMeter:
    """Plain progress lines for a loop of ``total`` steps: at most one per ``every`` seconds,
    with the rate of ``items`` per second and the ETA of the remaining steps.

    Args:
        label: what runs (``"epoch 3"``, ``"evaluation layer 2/3"``).
        total: steps in the loop (iterations, vertices, MiB, ...), > 0.
        unit: the steps' unit, plural (``"iterations"``).
        rate_unit: what the rate counts (``"samples"``); default ``unit``.
        every: seconds between lines, > 0.
        write: prints one line (default: to stderr).
        clock: seconds, monotonic (default :func:`time.perf_counter`).
        decimals: decimals of ``done``/``total`` in the line (1 for MiB).
    """

    def __init__(
        self,
        label: str,
        total: float,
        unit: str,
        *,
        rate_unit: str | None = None,
        every: float = DEFAULT_PROGRESS_EVERY,
        write: Callable[[str], None] | None = None,
        clock: Clock = time.perf_counter,
        decimals: int = 0,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.rate_unit = rate_unit or unit
        self.every = every
        self.write = write or _write_stderr
        self.clock = clock
        self.decimals = decimals
        self.start = clock()
        self.last_line = self.start
        self.done = 0.0
        self.items = 0.0
        self.extra: dict[str, object] = {}

    def elapsed(self) -> float:
        """Seconds since the meter started."""
        return self.clock() - self.start

    def rate(self) -> float:
        """Items per second so far (0 before any time has passed)."""
        elapsed = self.elapsed()
        return self.items / elapsed if elapsed > 0 else 0.0

    def eta(self) -> float | None:
        """Seconds left at the mean pace of the steps so far; ``None`` before the first."""
        if self.done <= 0:
            return None
        return self.elapsed() / self.done * max(self.total - self.done, 0.0)

    def line(self) -> str:
        """The progress line now (parsed by :data:`LINE_PATTERN`)."""
        eta = self.eta()
        percent = 100.0 * self.done / self.total if self.total else 100.0
        extra = "".join(f", {k} {v}" for k, v in self.extra.items())
        d = self.decimals
        return (
            f"progress: {self.label}: {self.done:.{d}f}/{self.total:.{d}f} {self.unit} "
            f"({percent:.1f}%), {self.rate():.1f} {self.rate_unit}/s, "
            f"elapsed {format_duration(self.elapsed())}, "
            f"ETA {'?' if eta is None else format_duration(eta)}{extra}"
        )

    def update(self, steps: float = 1, items: float | None = None, **extra: object) -> None:
        self.done += steps
        self.items += steps if items is None else items
        self.extra.update(extra)
        now = self.clock()
        if now - self.last_line >= self.every:
            self.last_line = now
            self.write(self.line())

    def close(self) -> None:
        pass


class _BarMeter:
    """A single updating terminal line (tqdm) with the same interface as :class:`RateMeter`."""

    def __init__(self, label: str, total: float, unit: str, stream: IO[str]) -> None:
        from tqdm import tqdm  # only on a terminal

        self.bar = tqdm(total=total, desc=label, unit=unit, leave=False, file=stream)

    def update(self, steps: float = 1, items: float | None = None, **extra: object) -> None:
        self.bar.update(steps)
        if extra:
            self.bar.set_postfix(extra, refresh=False)

    def close(self) -> None:
        self.bar.close()


class _NoMeter:
    def update(self, steps: float = 1, items: float | None = None, **extra: object) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ProgressSettings:
    """How loops report progress.

    Args:
        enabled: any progress at all (``--no-progress`` turns it off; ranks other than 0
            always have it off).
        every: seconds between plain lines when stderr is not a terminal; 0 = none there.
    """

    enabled: bool = True
    every: float = DEFAULT_PROGRESS_EVERY


_settings = ProgressSettings()


def configure(enabled: bool = True, every: float = DEFAULT_PROGRESS_EVERY) -> None:
    """Set the process-wide :func:`settings` (the command-line tools call it once, from
    their flags; rank 0 with ``enabled``, the other ranks without)."""
    global _settings
    _settings = ProgressSettings(enabled=enabled, every=every)


def settings() -> ProgressSettings:
    """The process-wide settings (:func:`configure`)."""
    return _settings


def meter(
    label: str,
    total: float,
    unit: str,
    *,
    rate_unit: str | None = None,
    decimals: int = 0,
    options: ProgressSettings | None = None,
    stream: IO[str] | None = None,
    clock: Clock = time.perf_counter,
) -> Meter:
    """The progress of a loop of ``total`` steps, as the settings and the stream ask: a tqdm
    bar on a terminal, a :class:`RateMeter` otherwise, nothing when disabled.

    Args:
        label, total, unit, rate_unit, decimals: see :class:`RateMeter`.
        options: default :func:`settings`.
        stream: default ``sys.stderr`` (looked up at the call, so pytest's capture works).
        clock: the :class:`RateMeter`'s clock.
    """
    options = options or _settings
    stream = stream if stream is not None else sys.stderr
    if not options.enabled or total <= 0:
        return _NoMeter()
    if _isatty(stream):
        return _BarMeter(label, total, unit, stream)
    if options.every <= 0:
        return _NoMeter()

    def write(line: str) -> None:
        print(line, file=stream, flush=True)

    return RateMeter(
        label,
        total,
        unit,
        rate_unit=rate_unit,
        every=options.every,
        write=write,
        clock=clock,
        decimals=decimals,
    )


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or a stand-in without isatty
        return False


def _write_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
