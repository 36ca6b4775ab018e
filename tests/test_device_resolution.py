"""A bare ``cuda`` device names one GPU (``cuda:<current index>``) where CUDA is available, in
every reader of host rows: :func:`~distmb.pipeline.features.zero_copy.resolve_device`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distmb.data.store.rowfile import RowFile, write_row_file
from distmb.pipeline.features.cached import CachedFeatures
from distmb.pipeline.features.tiered import HostCacheRows
from distmb.pipeline.features.zero_copy import resolve_device

#: The index the patched ``torch.cuda.current_device`` returns (not 0, the default).
CURRENT = 3


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA "available" with ``CURRENT`` as the current device (nothing is allocated on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: CURRENT)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("cuda", f"cuda:{CURRENT}"),
        (torch.device("cuda"), f"cuda:{CURRENT}"),
        ("cuda:1", "cuda:1"),
        ("cuda:0", "cuda:0"),
        ("cpu", "cpu"),
        (torch.device("cpu"), "cpu"),
    ],
)
def test_bare_cuda_becomes_the_current_gpu(fake_cuda, given, expected):
    assert resolve_device(given) == torch.device(expected)


def test_without_cuda_nothing_is_resolved(monkeypatch):
    def no_device() -> int:
        raise AssertionError("current_device asked without CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", no_device)
    for given in ("cuda", "cuda:1", "cpu"):
        assert resolve_device(given) == torch.device(given)


def test_the_host_cache_reader_resolves_its_device(fake_cuda, tmp_path):
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    info = write_row_file(tmp_path / "rows.bin", table)
    rows = RowFile(tmp_path / "rows.bin", 4, 3, info["row_stride"], align=info["align"])
    reader = HostCacheRows(CachedFeatures(rows, "none", 0), "cuda")
    assert reader.device == torch.device("cuda", CURRENT)
