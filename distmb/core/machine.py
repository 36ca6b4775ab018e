"""Facts about the machine a process runs on, read in one place."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from distmb.core.errors import InputError

#: Most threads ``--threads`` / ``--loader-threads`` accept (OpenMP crashes far beyond it;
#: more threads than cores is allowed, with a warning).
MAX_THREADS = 4096

#: Where Linux names the CPU model.
_CPUINFO = Path("/proc/cpuinfo")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``), else what
    :mod:`platform` says (``"x86_64"`` at worst); for the machine facts of benchmarks."""
    try:
        for line in _CPUINFO.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def physical_memory_bytes() -> int | None:
    """Bytes of physical memory, or None where the OS does not say (not POSIX)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(flag: str, value_mb: float, need: int) -> None:
    """Refuse, naming ``flag`` (given as ``value_mb`` MiB), a buffer of ``need`` bytes that
    exceeds this machine's physical memory: a one-line error instead of an allocator failure
    from deep inside PyTorch or C++. Nothing is checked where the memory size is unknown."""
    have = physical_memory_bytes()
    if have is not None and need > have:
        raise InputError(
            f"{flag} {value_mb:g}: the cache would hold {need / 2**30:.1f} GiB and this "
            f"machine has {have / 2**30:.1f} GiB of memory; give a smaller {flag}"
        )


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (``kill(pid, 0)``; one owned by
    another user counts). For the temporaries a killed writer left: named after its pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
