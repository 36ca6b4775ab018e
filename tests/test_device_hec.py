"""DeviceHistoricalCache (distmb.halo.hec.device): what only it promises (its pieces against
brute force, no synchronisation on the hot path, inputs from other devices, the halo scheme
with device caches). Its contract, shared with the C++ cache, is tested in
tests/test_hec_contract.py, on a GPU too under ``pytest -m cuda``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import SMALL
from test_distributed import SCRIPTS, mpirun
from torch.utils._python_dispatch import TorchDispatchMode

from distmb.data import load_dataset
from distmb.halo.hec.device import DeviceHistoricalCache, _first_reaching
from distmb.partition import partition_graph


def host(t: torch.Tensor) -> np.ndarray:
    return t.cpu().numpy()


# -- pieces ---------------------------------------------------------------------------------------
def test_first_reaching_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 33, 100):
        never = n
        prev = rng.integers(-1, n + 1, n)
        prev[rng.random(n) < 0.2] = never
        target = rng.integers(0, n + 2, n)
        got = _first_reaching(torch.from_numpy(prev), torch.from_numpy(target), never).numpy()
        for a in range(n):
            counts = np.cumsum(prev <= a)
            reached = np.flatnonzero(counts >= target[a])
            if reached.size:
                assert got[a] == reached[0], (n, a)
            else:
                assert got[a] >= n, (n, a)


@pytest.mark.cuda
def test_hot_path_never_synchronises_on_cuda() -> None:
    """With checked=False, search, lookup_into, store and advance queue device work only."""
    dev = DeviceHistoricalCache(1000, 8, 2, device="cuda", checked=False)
    tags = torch.randint(0, 3000, (2000,), device="cuda")
    rows = torch.randn(2000, 8, device="cuda")
    out = torch.empty(2000, 8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            dev.store(tags, rows)
            dev.search(tags)
            dev.lookup_into(tags, out)
            dev.advance()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert dev.counters()["lookups"] == 3 * 2 * 2000


#: ATen ops that wait for the device on CUDA: a value read back (``.item()``, ``bool()``,
#: ``int()``), a result whose size depends on the data, a comparison returning a Python bool.
SYNCING_OPS = {
    "aten._local_scalar_dense.default",
    "aten.is_nonzero.default",
    "aten.equal.default",
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten._unique2.default",
    "aten.unique_dim.default",
    "aten.unique_consecutive.default",
}


class SyncProneOps(TorchDispatchMode):
    """Records the ops of a block of code that synchronise on CUDA, seen on CPU tensors: those
    of :data:`SYNCING_OPS`, boolean-mask indexing (its size is the mask's count), and tensors
    made from a Python value (``lift_fresh``: ``t[idx] = True`` on a CUDA ``t`` copies a CPU
    scalar to the device, which waits for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = str(func)
        indices = args[1] if name.startswith(("aten.index.", "aten.index_put")) else []
        bool_index = any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or []
        )
        if name in SYNCING_OPS or name.startswith("aten.lift_fresh") or bool_index:
            self.found.append(name)
        return func(*args, **(kwargs or {}))


def test_hot_path_has_no_op_that_synchronises_on_cuda() -> None:
    """The CPU twin of the cuda test above: with checked=False, search, lookup_into, store
    (with evictions and repeated tags) and advance run no op that would make a GPU wait."""
    dev = DeviceHistoricalCache(100, 8, 2, device="cpu", checked=False)
    gen = torch.Generator().manual_seed(0)
    with SyncProneOps() as ops:
        for _ in range(3):
            tags = torch.randint(0, 300, (200,), generator=gen)
            dev.store(tags, torch.randn(200, 8, generator=gen))
            dev.search(tags)
            dev.lookup_into(tags, torch.empty(200, 8))
            dev.advance()
    assert ops.found == []
    with SyncProneOps() as ops:  # the probe sees what it must
        torch.zeros(3, dtype=torch.bool)[torch.tensor([1])] = True
        int(torch.ones(2).sum())
    assert "aten._local_scalar_dense.default" in ops.found
    assert any(op.startswith("aten.lift_fresh") for op in ops.found)


@pytest.mark.cuda
def test_inputs_on_the_host_are_moved_to_the_device() -> None:
    """A cache on ``cuda`` takes numpy and CPU-tensor inputs and answers on its device (with
    its index: ``cuda:0``, where callers' tensors live)."""
    dev = DeviceHistoricalCache(8, 2, 1, device="cuda")
    assert dev.device == torch.empty(0, device="cuda").device
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    dev.store(torch.tensor([4, 5, 6]), torch.from_numpy(rows))
    hit, got = dev.lookup(np.array([6, 7, 4]))
    assert hit.device == got.device == dev.device
    assert host(hit).tolist() == [True, False, True]
    np.testing.assert_array_equal(host(got), rows[[2, 0]])
    assert dev.search([5]).device == dev.device


# -- the halo scheme -----------------------------------------------------------------------------
def test_halo_scheme_with_device_cache_trains_identically(tmp_path) -> None:
    """2 ranks under mpiexec: HistoricalEmbeddingScheme(cache_device="cpu") and the C++ caches
    give the same records, halo loads and cache states (tests/mpi_scripts/device_hec_twin.py)."""
    parts = tmp_path / "p2"
    partition_graph(load_dataset(SMALL), 2, parts, seed=0)
    proc = mpirun(2, [str(SCRIPTS / "device_hec_twin.py"), str(parts), "2", "cpu"], 240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loads equal" in proc.stdout


def test_incremental_index_equals_a_fresh_sort() -> None:
    """After every store, the merged ``tag -> slot`` index is the index sorted from scratch."""
    rng = np.random.default_rng(4)
    for cap, universe in [(1, 4), (6, 20), (50, 60), (50, 400)]:
        dev = DeviceHistoricalCache(cap, 1, 1)
        for _ in range(40):
            tags = rng.integers(0, universe, int(rng.integers(0, 2 * cap + 3)))
            dev.store(tags, np.zeros((tags.size, 1), np.float32))
            keys, slots = dev._sorted_index()
            np.testing.assert_array_equal(host(dev._keys), host(keys))
            np.testing.assert_array_equal(host(dev._slots), host(slots))
            if rng.random() < 0.1:
                dev.clear()
