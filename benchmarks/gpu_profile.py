"""What the GPU did during one training epoch, from torch.profiler: kernel launches and host
synchronisations per iteration, kernel time, and how busy the GPU was.

- **launches**: host-side launch calls (:data:`LAUNCH_CALLS`: the CUDA runtime's and driver's
  kernel launches, which Triton kernels use too, and CUDA graph replays, one each);
- **syncs**: host calls that wait for the device (:data:`SYNC_CALLS`): stream, event and
  device synchronisations and the blocking ``cudaMemcpy`` (``.item()``, ``.cpu()``,
  ``nonzero`` and friends end in one of them);
- **kernel time**: the sum of the device's kernel durations (overlapping kernels of several
  streams counted each);
- **GPU busy**: the union of the kernels' intervals over the epoch's wall time, the fraction
  of the epoch in which at least one kernel ran (what the goal "GPU busy >= 80 %" means);
- **where**: the synchronising calls by name (``"sync_calls"``), the kernels that took the
  most device time, with their counts (``"top_kernels"``), and with ``shapes`` the ATen ops
  that did, per input shapes (``"top_ops"``: which matrix product runs which slow kernel;
  ops replayed from a CUDA graph are not seen, so ask it of an eager epoch).

The counting works on plain :class:`Interval` records, so it is tested on hand-built ones
on a machine without a GPU (``tests/test_gpu_profile.py``); :func:`profile_epoch` turns a
profiler's events into them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

#: Host calls that launch device work, one launch each.
LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaGraphLaunch",
    }
)
#: Host calls that block until the device (or a stream, or an event) is done.
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
    }
)
#: Microseconds per second (the profiler's times are microseconds).
US_PER_S = 1e6
#: Kernels listed in ``"top_kernels"`` (by their summed time over the epoch, in ms).
TOP_KERNELS = 15
#: Characters kept of a kernel's name (C++ template names run to hundreds).
KERNEL_NAME_CHARS = 120


@dataclass(frozen=True)
class Interval:
    """One profiler event: ``name``, whether it is a kernel on the device, and its start and
    end in microseconds (any common origin)."""

    name: str
    on_device: bool
    start_us: float
    end_us: float


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Microseconds covered by at least one of the ``(start, end)`` intervals."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        covered += end - max(start, reach)
        reach = end
    return covered


def summarise(events: Iterable[Interval], wall_s: float, iterations: int) -> dict[str, Any]:
    """The epoch's counts: totals, per iteration, kernel seconds and GPU busy.

    Args:
        events: the epoch's profiler events.
        wall_s: the epoch's wall-clock seconds (> 0).
        iterations: training iterations in it (> 0).
    """
    if wall_s <= 0 or iterations <= 0:
        raise ValueError(f"wall_s and iterations must be positive (got {wall_s}, {iterations})")
    launches = syncs = kernels = 0
    kernel_us = 0.0
    spans: list[tuple[float, float]] = []
    by_kernel: dict[str, list[float]] = {}  # name -> [count, microseconds]
    sync_calls: dict[str, int] = {}
    for event in events:
        if event.on_device:
            kernels += 1
            kernel_us += event.end_us - event.start_us
            spans.append((event.start_us, event.end_us))
            entry = by_kernel.setdefault(event.name, [0, 0.0])
            entry[0] += 1
            entry[1] += event.end_us - event.start_us
        elif event.name in LAUNCH_CALLS:
            launches += 1
        elif event.name in SYNC_CALLS:
            syncs += 1
            sync_calls[event.name] = sync_calls.get(event.name, 0) + 1
    busy_s = union_us(spans) / US_PER_S
    top = sorted(by_kernel.items(), key=lambda item: -item[1][1])[:TOP_KERNELS]
    return {
        "iterations": iterations,
        "wall_s": round(wall_s, 4),
        "launches": launches,
        "syncs": syncs,
        "kernels": kernels,
        "launches_per_iteration": round(launches / iterations, 2),
        "syncs_per_iteration": round(syncs / iterations, 2),
        "kernel_s": round(kernel_us / US_PER_S, 4),
        "gpu_busy": round(min(busy_s / wall_s, 1.0), 4),
        "sync_calls": dict(sorted(sync_calls.items())),
        "top_kernels": [
            {"name": name[:KERNEL_NAME_CHARS], "count": int(count), "ms": round(us / 1e3, 3)}
            for name, (count, us) in top
        ],
    }


def top_ops(averages: Iterable[Any], limit: int = TOP_KERNELS) -> list[dict[str, Any]]:
    """The ``limit`` ATen ops (torch.profiler's ``key_averages(group_by_input_shape=True)``
    entries) of most device time of their own, each with its input shapes, count and
    milliseconds (of device time, and of host time)."""
    rows = []
    for entry in averages:
        device_us = float(getattr(entry, "self_device_time_total", 0.0) or 0.0)
        rows.append(
            {
                "op": entry.key,
                "shapes": str(entry.input_shapes)[:KERNEL_NAME_CHARS],
                "count": int(entry.count),
                "device_ms": round(device_us / 1e3, 3),
                "host_ms": round(float(entry.self_cpu_time_total) / 1e3, 3),
            }
        )
    rows.sort(key=lambda row: (-row["device_ms"], -row["host_ms"]))
    return rows[:limit]


def intervals(profiler_events: Iterable[Any]) -> list[Interval]:
    """:class:`Interval` records of torch.profiler's ``FunctionEvent`` list (``prof.events()``):
    device kernels by their device type, host calls by name."""
    out = []
    for event in profiler_events:
        on_device = event.device_type == torch.autograd.DeviceType.CUDA
        out.append(Interval(event.name, on_device, event.time_range.start, event.time_range.end))
    return out


def profile_epoch(
    run_epoch: Callable[[], dict[str, Any]], device: torch.device, shapes: bool = False
) -> dict[str, Any]:
    """Run one epoch (``run_epoch`` returns the trainer's epoch record, with
    ``"iterations"``) under torch.profiler and :func:`summarise` it; with ``shapes`` the
    ops' input shapes are recorded too, and :func:`top_ops` added (``"top_ops"``; recording
    them slows the host further). The profiler slows the host side, so ``wall_s`` is longer
    than an unprofiled epoch: the training runs give the epoch time, this the counts. On a
    CPU device only host calls are recorded: the counts are 0 and say nothing about a GPU."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=shapes) as prof:
        start = time.perf_counter()
        record = run_epoch()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall_s = time.perf_counter() - start
    out = summarise(intervals(prof.events()), wall_s, int(record["iterations"]))
    if shapes:
        out["top_ops"] = top_ops(prof.key_averages(group_by_input_shape=True))
    return out
