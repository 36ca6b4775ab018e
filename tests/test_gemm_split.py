"""benchmarks/gemm_split.py: the split weight-gradient product equals the plain one (float64
reference), remainders included, and the CPU smoke run writes a consistent record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def gemm_split(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gemm_split

    return gemm_split


@pytest.mark.parametrize(("rows", "chunks"), [(64, 4), (67, 4), (3, 8), (1, 1)])
def test_split_product_equals_the_plain_product(gemm_split, rows, chunks):
    gen = torch.Generator().manual_seed(rows)
    dy, x = torch.randn(rows, 5, generator=gen), torch.randn(rows, 3, generator=gen)
    got = gemm_split.split_product(dy, x, chunks)
    want = dy.double().t() @ x.double()
    assert got.shape == (5, 3)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_cpu_smoke_run_writes_every_variant(gemm_split, tmp_path):
    out = tmp_path / "gemm_split.json"
    assert gemm_split.main(["--device", "cpu", "--scale", "0.001", "--repeats", "2",
                            "--chunks", "4", "--out", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    records = result["records"]
    assert len(records) == 2 * len(gemm_split.SHAPES)  # mm and one split per shape; fp32 only
    assert {r["chunks"] for r in records} == {1, 4} and {r["precision"] for r in records} == {
        "fp32"
    }
    assert all(r["max_abs_error"] < 1e-3 and r["median_ms"] >= 0 for r in records)
    assert result["machine"]["device"] == "cpu"
