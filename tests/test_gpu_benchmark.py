"""benchmarks/gpu.py end to end in its quick CPU mode (a smoke test: no GPU figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def test_quick_cpu_run_writes_a_consistent_record(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--quick", "--device", "cpu",
         "--threads", "2", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["figures"].startswith("cpu smoke test")
    assert result["graph"]["classes"] == 47 and result["graph"]["nodes"] == 10_000
    (train,) = result["training"]
    assert train["iterations"] > 0 and train["epoch_s"] > 0
    assert min(train["sample_s"], train["feature_movement_s"], train["compute_s"]) > 0
    assert 0 <= train["device_cache_hit_rate"] <= 1 and train["h2d_bytes"] > 0
    by_name = {r["sampler"]: r for r in result["sampling"]}
    assert set(by_name) == {"cpp", "device/cpu/torch/device"}
    assert by_name["cpp"]["speedup_vs_cpp"] == 1.0
    runs = result["cache"]["runs"]
    assert {(r["policy"], r["cache_percent"]) for r in runs} == {
        (p, c) for p in ("presc", "degree", "none", "oracle") for c in (5, 10, 20)
    }
    for r in runs:
        # Reuse never moves more rows; without a cache nothing hits.
        assert r["h2d_bytes_match"] <= r["h2d_bytes_plain"]
        assert (r["hit_rate"] == 0) == (r["policy"] == "none")
    assert "skipped" in result["bandwidth"]
    assert result["goals"] == {"note": "CPU smoke test: no goal applies"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--device", "cuda"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and "--device cuda" in proc.stderr
    assert "sees no GPU" in proc.stderr and "Traceback" not in proc.stderr
