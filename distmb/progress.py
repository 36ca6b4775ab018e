"""Progress lines with elapsed time and peak memory, for long-running steps."""

from __future__ import annotations

import resource
import sys
import time


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (Linux reports KiB)."""
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
