"""distmb.core.host_reads.to_device: a batch's host values uploaded without a host
synchronisation (on CUDA: staged in page-locked memory, copied with ``non_blocking``); on the
CPU the values themselves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distmb.core.host_reads import to_device

CPU = torch.device("cpu")


def test_on_the_cpu_the_values_themselves():
    ids = np.array([5, 0, 3, 3], dtype=np.int64)
    tensor = to_device(ids, CPU)
    assert tensor.dtype == torch.int64 and tensor.tolist() == [5, 0, 3, 3]
    assert tensor.data_ptr() == ids.ctypes.data  # no copy
    labels = torch.tensor([1, 2], dtype=torch.int32)
    assert to_device(labels, CPU) is labels
    cast = to_device(labels, CPU, torch.int64)
    assert cast.dtype == torch.int64 and cast.tolist() == [1, 2]


@pytest.mark.cuda
def test_on_a_gpu_the_upload_does_not_synchronise():
    """Under CUDA's sync debug mode "error" a pageable copy raises (the mode sees the
    synchronisation); :func:`to_device` does not, and delivers the values, also when the
    staging buffer is freed and reused at once."""
    cuda = torch.device("cuda")
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 1 << 30, size) for size in (1, 1000, 100_000)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            torch.from_numpy(arrays[0]).to(cuda)
        uploaded = [to_device(a, cuda) for a in arrays for _ in range(3)]
        uploaded.append(to_device(torch.from_numpy(arrays[1]), cuda, torch.int32))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = [a for a in arrays for _ in range(3)] + [arrays[1].astype(np.int32)]
    for got, want in zip(uploaded, expected, strict=True):
        assert got.device.type == "cuda"
        np.testing.assert_array_equal(got.cpu().numpy(), want)
