"""benchmarks/gpu_profile.py: the counts of a profiled epoch, on hand-built events (no GPU
needed), against a brute-force coverage count; the profiler hook on CPU tensors."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_profile  # noqa: E402  (benchmarks/ is not a package)
from gpu_profile import Interval, summarise, union_us  # noqa: E402


def brute_force_union(spans: list[tuple[int, int]]) -> int:
    """Integer microseconds covered, counted one by one."""
    return len({t for start, end in spans for t in range(start, end)})


def test_union_matches_a_brute_force_count():
    rng = random.Random(0)
    for _ in range(200):
        spans = []
        for _ in range(rng.randrange(0, 12)):
            start = rng.randrange(0, 100)
            spans.append((start, start + rng.randrange(0, 30)))
        assert union_us(spans) == brute_force_union(spans)


def test_summary_counts_launches_syncs_kernels_and_busy():
    events = [
        Interval("cudaLaunchKernel", False, 0, 1),
        Interval("cuLaunchKernel", False, 2, 3),  # a Triton kernel's launch
        Interval("cudaGraphLaunch", False, 4, 5),
        Interval("cudaStreamSynchronize", False, 6, 50),
        Interval("cudaMemcpy", False, 60, 70),
        Interval("cudaMemcpyAsync", False, 71, 72),  # not a wait
        Interval("aten::mm", False, 0, 10),
        Interval("sm90_gemm", True, 10, 30),
        Interval("triton_aggregate", True, 20, 40),  # overlaps: busy counts it once
        Interval("index_kernel", True, 100, 110),
    ]
    summary = summarise(events, wall_s=200e-6, iterations=2)
    assert summary["launches"] == 3 and summary["syncs"] == 2 and summary["kernels"] == 3
    assert summary["launches_per_iteration"] == 1.5 and summary["syncs_per_iteration"] == 1.0
    assert summary["kernel_s"] == pytest.approx(50e-6, abs=1e-4)
    assert summary["gpu_busy"] == pytest.approx(40 / 200)
    assert summary["sync_calls"] == {"cudaMemcpy": 1, "cudaStreamSynchronize": 1}
    assert summary["top_kernels"] == [
        {"name": "sm90_gemm", "count": 1, "ms": 0.02},
        {"name": "triton_aggregate", "count": 1, "ms": 0.02},
        {"name": "index_kernel", "count": 1, "ms": 0.01},
    ]


@pytest.mark.parametrize(("wall_s", "iterations"), [(0.0, 1), (1.0, 0)])
def test_summary_refuses_an_empty_epoch(wall_s, iterations):
    with pytest.raises(ValueError, match="must be positive"):
        summarise([], wall_s, iterations)


def test_profile_epoch_on_cpu_tensors_counts_no_device_work():
    def run_epoch() -> dict:
        a = torch.randn(64, 64)
        for _ in range(3):
            a = a @ a / 64
        return {"iterations": 3}

    summary = gpu_profile.profile_epoch(run_epoch, torch.device("cpu"))
    assert summary["iterations"] == 3 and summary["wall_s"] > 0
    assert summary["launches"] == summary["syncs"] == summary["kernels"] == 0
    assert summary["gpu_busy"] == 0


@pytest.mark.cuda
def test_profile_epoch_on_cuda_sees_every_launch_and_the_sync():
    def run_epoch() -> dict:
        a = torch.randn(256, 256, device="cuda")
        for _ in range(10):
            a = torch.relu(a @ a) / 256
        a.sum().item()  # one host sync
        return {"iterations": 10}

    run_epoch()  # warm-up: cuBLAS handles, caching allocator
    summary = gpu_profile.profile_epoch(run_epoch, torch.device("cuda"))
    assert summary["kernels"] >= 21 and summary["launches"] >= 21
    assert summary["syncs"] >= 1
    assert 0 < summary["gpu_busy"] <= 1


def test_top_ops_name_the_products_by_input_shape():
    """With ``shapes``, the ops by input shape: two matrix products of different shapes are
    two rows with their counts (host time on the CPU; device time 0 there)."""

    def run_epoch() -> dict:
        a, b = torch.randn(64, 32), torch.randn(32, 48)
        for _ in range(3):
            torch.mm(a, b)
        torch.mm(b.t(), a.t())
        return {"iterations": 4}

    summary = gpu_profile.profile_epoch(run_epoch, torch.device("cpu"), shapes=True)
    mm = {row["shapes"]: row for row in summary["top_ops"] if row["op"] == "aten::mm"}
    assert mm["[[64, 32], [32, 48]]"]["count"] == 3
    assert mm["[[48, 32], [32, 64]]"]["count"] == 1
    assert all(row["device_ms"] == 0 and row["host_ms"] >= 0 for row in mm.values())
    assert "top_ops" not in gpu_profile.profile_epoch(run_epoch, torch.device("cpu"))
