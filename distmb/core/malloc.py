"""``--malloc``: how the C allocator hands memory back to the OS between mini-batches.

A training step allocates the same large buffers every mini-batch: the gathered features
(float32[n_src, in_dim], ~60 MB on an ogbn-products-shaped batch), each layer's output and
its gradient (float32[n_dst, hidden], ~77 MB for the first layer), the aggregations. glibc
serves requests above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and returns
them with ``munmap`` when freed, so every batch the kernel maps and zeroes those pages again,
one page fault per 4 KiB: measured on this project's 2-core machine, writing a fresh 100 MB
tensor takes ~23 ms against ~4 ms for a reused one, and the faults were ~17 % of a SAGE epoch
(results/README.md, "Single-socket speed").

- ``retain`` (default): glibc keeps freed memory for reuse. Large requests come from the heap
  (``mallopt(M_MMAP_MAX, 0)``) and the heap's free top is not returned to the OS
  (``mallopt(M_TRIM_THRESHOLD, INT_MAX)``), so a batch's buffers reuse the pages of the
  previous batch's. The process's resident memory then stays near its peak instead of
  dropping between batches (what jemalloc / tcmalloc, which Intel recommends preloading for
  PyTorch on CPUs, also do), and heap fragmentation adds to that peak: 1.07 GB against
  0.88 GB on the run above, flat over 30 epochs. Threads other than the main one still get
  large blocks from ``mmap`` (glibc falls back to it there), so this changes speed, never
  whether an allocation succeeds.
- ``system``: the C library's own defaults: nothing is changed, unless ``retain`` was applied
  earlier in this process; then its two settings go back to glibc's default values
  (:data:`GLIBC_DEFAULTS`; glibc's adaptive mmap threshold stays off).

Only glibc has these settings; with another C library (musl, macOS) ``retain`` does nothing
and :func:`configure_malloc` says so. The settings are process-wide and apply to allocations
made after the call. The trainer applies ``TrainConfig.malloc`` when it is constructed, so
loading and partitioning (which free large arrays to lower their peak) run before it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

#: ``--malloc`` choices.
MALLOC_POLICIES: tuple[str, ...] = ("retain", "system")

#: ``--malloc``'s default (distmb.train, distmb.predict).
DEFAULT_MALLOC_POLICY = "retain"

#: glibc's ``mallopt`` parameter numbers (``<malloc.h>``).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

#: The largest value ``mallopt`` takes (its value argument is a C ``int``).
C_INT_MAX = 2**31 - 1

#: glibc's default values of the settings ``retain`` changes (``mallopt(3)``).
GLIBC_DEFAULTS: dict[int, int] = {M_TRIM_THRESHOLD: 128 * 1024, M_MMAP_MAX: 65536}

#: Whether ``retain`` is in effect in this process.
_retained = False


def _glibc_mallopt():
    """glibc's ``mallopt``, or None with another C library."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
    return mallopt


def configure_malloc(policy: str) -> str | None:
    """Apply a ``--malloc`` policy to this process.

    Args:
        policy: one of :data:`MALLOC_POLICIES`.

    Returns:
        None, or a one-line note when ``retain`` cannot be applied (not glibc, or glibc
        refused a setting).

    Raises:
        ValueError: an unknown policy.
    """
    global _retained
    if policy not in MALLOC_POLICIES:
        raise ValueError(f"--malloc must be one of {MALLOC_POLICIES}, got {policy!r}")
    if policy == "system":
        if _retained:
            mallopt = _glibc_mallopt()
            for param, value in GLIBC_DEFAULTS.items():
                mallopt(param, value)
            _retained = False
        return None
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return (
            f"--malloc retain: not applied ({platform.system()}, "
            f"C library {platform.libc_ver()[0] or 'unknown'}; it needs glibc)"
        )
    # mallopt returns 1 on success, 0 on an invalid value.
    if not (mallopt(M_TRIM_THRESHOLD, C_INT_MAX) and mallopt(M_MMAP_MAX, 0)):
        for param, value in GLIBC_DEFAULTS.items():
            mallopt(param, value)
        return "--malloc retain: glibc's mallopt refused a setting; the defaults stay in place"
    _retained = True
    return None
