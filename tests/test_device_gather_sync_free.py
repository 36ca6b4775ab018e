"""The device feature cache's sync-free gather (``DeviceFeatures(backend="triton")``, the
Triton kernel of distmb.pipeline.features.gather_triton, under the interpreter on CPU):
rows against numpy indexing, counters against the torch back end on the same gathers, no
host read and no sync-prone op in the BatchLoader's gather, and the deferred range check.

Every test runs on CPU tensors in CI (``TRITON_INTERPRET=1``); the cuda-marked ones run on a
GPU with a pinned host table under ``pytest -m cuda``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from conftest import compile_triton_in_subprocess, random_graph
from torch.utils._python_dispatch import TorchDispatchMode

from distmb.core.host_reads import HOST_READS
from distmb.data.local import LocalGraph
from distmb.engine.op_census import SYNCING_OPS
from distmb.pipeline import BatchLoader
from distmb.pipeline.features import gather_triton
from distmb.pipeline.features.device import DeviceFeatures, resolve_gather_backend
from distmb.pipeline.features.presample import hot_rows
from distmb.pipeline.sample import NeighborSampler, idmap_triton

NUM_ROWS, DIM = 70, 9
DTYPES = [np.float16, np.float32, np.float64]


def table_of(dtype: type, dim: int = DIM, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((NUM_ROWS, dim)).astype(dtype)


def hot_ids(seed: int = 1) -> np.ndarray:
    """Cache priority by random scores (not the first ids)."""
    return hot_rows(np.random.default_rng(seed).random(NUM_ROWS))


def make(
    table: np.ndarray, capacity: int, backend: str, device: str = "cpu", align: bool = True
) -> DeviceFeatures:
    return DeviceFeatures(
        table,
        device,
        capacity,
        hot_ids=hot_ids() if capacity else None,
        align_rows=align,
        backend=backend,  # type: ignore[arg-type]
    )


def requests(source: DeviceFeatures, seed: int = 3) -> list[np.ndarray]:
    """Random ids with repeats, all hits, all misses (repeated), none, one, a reversed
    permutation."""
    rng = np.random.default_rng(seed)
    cached = source.cached_ids()
    uncached = np.setdiff1d(np.arange(NUM_ROWS), cached)
    return [
        rng.integers(0, NUM_ROWS, 3 * NUM_ROWS),
        rng.permutation(np.repeat(cached, 2)),
        rng.permutation(np.repeat(uncached, 3)),
        np.zeros(0, dtype=np.int64),
        np.array([NUM_ROWS - 1]),
        np.arange(NUM_ROWS)[::-1].copy(),
    ]


def take_buffer(numel: int) -> torch.Tensor:
    raise AssertionError("a device source takes no host buffer")


# ---- rows -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("align", [True, False])
@pytest.mark.parametrize("capacity", [0, 13, NUM_ROWS])
def test_rows_equal_numpy_indexing(dtype, align, capacity):
    table = table_of(dtype)
    source = make(table, capacity, "triton", align=align)
    assert source.backend == "triton"
    itemsize = np.dtype(dtype).itemsize
    if align:  # rows padded to 128 bytes: the kernel reads them at the padded stride
        assert source.host.width > DIM and source.host.width * itemsize % 128 == 0
    else:
        assert source.host.width == DIM
    assert source.host.view.stride(0) == source.host.width
    for ids in requests(source):
        want = table[ids].astype(np.float32)
        for got in (
            source.gather_device(torch.from_numpy(ids)),
            source.gather_batch_rows(torch.from_numpy(ids), take_buffer)[0],
            source.gather(ids),  # FeatureSource's host output, through the same kernel
        ):
            assert got.dtype == torch.float32 and tuple(got.shape) == (ids.size, DIM)
            np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("capacity", [0, 13])
def test_hits_come_from_the_cache_and_misses_from_host_memory(capacity):
    """Host rows changed after the cache was filled: a hit must show the cached (old) row, a
    miss the host (new) one, so a kernel reading every row from host memory fails here."""
    table = table_of(np.float32)
    source = make(table, capacity, "triton")
    source.host.host[:, :DIM] += 1000.0  # the host buffer the device reads (padded copy)
    cached = np.zeros(NUM_ROWS, dtype=bool)
    cached[source.cached_ids()] = True
    ids = requests(source)[0]
    want = np.where(cached[ids][:, None], table[ids], table[ids] + 1000.0)
    rows, _ = source.gather_batch_rows(torch.from_numpy(ids), take_buffer)
    np.testing.assert_array_equal(rows.numpy(), want)


@pytest.mark.parametrize("dim", [1, 300])
def test_rows_narrow_and_wider_than_one_column_block(dim):
    assert gather_triton.block_shape(300)[1] < 300  # two column blocks per row
    table = table_of(np.float32, dim=dim)
    source = make(table, 11, "triton")
    ids = np.random.default_rng(4).integers(0, NUM_ROWS, 50)
    np.testing.assert_array_equal(source.gather_device(ids).numpy(), table[ids])
    reference = make(table, 11, "torch")
    reference.gather_device(ids)
    assert source.counters() == reference.counters()


@pytest.mark.parametrize("programs", [1, 3])
def test_capped_programs_loop_over_every_row_block(programs, monkeypatch):
    """With ``gather_programs`` each program loops over row blocks (pid, pid + programs,
    ...): the rows and the counters equal the torch back end's, over requests of many row
    blocks (a short last one included) and of fewer blocks than programs."""
    monkeypatch.setattr(gather_triton, "VALUES_PER_PROGRAM", 64)  # 4 rows a block: many blocks
    launched = []
    real = gather_triton.launch

    def spy(*args, **kwargs):
        launched.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(gather_triton, "launch", spy)
    table = table_of(np.float32)
    source = make(table, 13, "triton")
    source.gather_programs = programs
    reference = make(table, 13, "torch")
    for ids in requests(source):
        got = source.gather_batch_rows(torch.from_numpy(ids), take_buffer)[0]
        np.testing.assert_array_equal(got.numpy(), table[ids])
        reference.gather_device(ids)
    assert source.counters() == reference.counters()
    assert set(launched) == {programs}


def test_a_wrong_unpermute_is_caught(monkeypatch):
    """The comparison above fails for a kernel writing rows in sorted order (perm ignored)."""
    table = table_of(np.float32)
    source = make(table, 13, "triton")
    ids = requests(source)[0]
    real = gather_triton.launch

    def sorted_order(sorted_ids, perm, *args):  # noqa: ANN001, ANN002
        real(sorted_ids, torch.arange(perm.numel()), *args)

    monkeypatch.setattr(gather_triton, "launch", sorted_order)
    got = source.gather_device(ids).numpy()
    assert not np.array_equal(got, table[ids])
    np.testing.assert_array_equal(got, table[np.sort(ids)])


# ---- counters ---------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [0, 13, NUM_ROWS])
def test_counters_equal_the_torch_back_end(capacity):
    table = table_of(np.float16)
    sync_free, reference = make(table, capacity, "triton"), make(table, capacity, "torch")
    gathers = requests(sync_free, seed=5) + requests(sync_free, seed=6)
    for step, ids in enumerate(gathers):
        for source in (sync_free, reference):
            if step % 3 == 0:
                source.gather(ids)
            elif step % 3 == 1:
                source.gather_device(torch.from_numpy(ids))
            else:
                source.gather_batch_rows(torch.from_numpy(ids), take_buffer)
        if step % 4 == 3:  # read now and then: the device counters fold into the host ones
            assert sync_free.counters() == reference.counters()
    want = reference.counters()
    assert (want["rows_loaded"] > 0) == (capacity < NUM_ROWS)
    assert (want["hits"] > 0) == (capacity > 0)
    assert sync_free.counters() == want
    assert sync_free.bytes_read == reference.bytes_read == want["bytes_h2d"]
    sync_free.reset_counters()
    reference.reset_counters()
    assert sync_free.counters() == reference.counters()
    assert set(sync_free.counters().values()) == {0}
    for ids in gathers[:3]:  # after a reset: counts from there on
        sync_free.gather_batch_rows(torch.from_numpy(ids), take_buffer)
        reference.gather_batch_rows(torch.from_numpy(ids), take_buffer)
    assert sync_free.counters() == reference.counters()


# ---- no host synchronisation in the BatchLoader's gather --------------------------------------
class _SyncCounter(TorchDispatchMode):
    """Counts dispatched ATen ops by name outside the kernel launches (the interpreter copies
    tensors while it runs a kernel: that is not the gather's own work); a launch counts as one
    ``launch``."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if not self.paused:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def syncing(self) -> int:
        return sum(v for k, v in self.ops.items() if k in SYNCING_OPS)


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[_SyncCounter]:
    counter = _SyncCounter()
    real = gather_triton.launch

    def launch(*args, **kwargs):  # noqa: ANN002, ANN003
        counter.ops["launch"] += 1
        counter.paused = True
        try:
            real(*args, **kwargs)
        finally:
            counter.paused = False

    with monkeypatch.context() as patch:
        patch.setattr(gather_triton, "launch", launch)
        with counter:
            yield counter


@pytest.fixture(scope="module")
def local() -> LocalGraph:
    return LocalGraph.from_graph(random_graph(n=300, m=1800, feat_dim=6, classes=3, seed=4))


@pytest.mark.parametrize("capacity", [0, 40])
def test_the_loader_gather_makes_no_host_read_and_no_syncing_op(local, monkeypatch, capacity):
    table = np.asarray(local.features[: local.n_solid], dtype=np.float32)
    hot = hot_rows(np.random.default_rng(0).random(table.shape[0]))
    source = DeviceFeatures(table, "cpu", capacity, hot_ids=hot, backend="triton")
    reference = DeviceFeatures(table, "cpu", capacity, hot_ids=hot, backend="torch")
    sampler = NeighborSampler(local.indptr, local.indices, local.n_solid, local.n_local, [3, 3], 7)
    loader = BatchLoader(sampler, source, local.labels, prefetch=0)
    batches = np.array_split(np.asarray(local.train_idx), 3)
    counters: list[_SyncCounter] = []
    real_gather = source.gather_batch_rows

    def counted_gather(ids, take):  # noqa: ANN001
        before = HOST_READS.snapshot()
        with counting(monkeypatch) as counter:
            rows = real_gather(ids, take)
        assert HOST_READS.snapshot() == before  # no explicit host read
        counters.append(counter)
        reference.gather_batch_rows(ids, take)
        return rows

    monkeypatch.setattr(source, "gather_batch_rows", counted_gather)
    for batch in loader(loader.plan(0, batches)):
        ids = batch.blocks[0].src_ids[: batch.blocks[0].n_computed].numpy()
        np.testing.assert_array_equal(batch.x.numpy(), table[ids])
    assert len(counters) == len(batches)
    for counter in counters:
        assert counter.ops["launch"] == 1
        assert counter.syncing == 0, counter.ops
    before = HOST_READS.snapshot()[0]
    assert source.counters() == reference.counters()  # one read for the whole epoch
    assert source.counters() == reference.counters()  # nothing pending: no read
    assert HOST_READS.snapshot()[0] == before + 1


def test_the_torch_back_end_is_counted_syncing(monkeypatch):
    """The counter sees the syncs the sync-free back end removes (non-vacuity)."""
    table = table_of(np.float32)
    source = make(table, 13, "torch")
    before = HOST_READS.snapshot()[0]
    with counting(monkeypatch) as counter:
        source.gather_batch_rows(torch.from_numpy(requests(source)[0]), take_buffer)
    assert counter.syncing >= 3 and counter.ops["launch"] == 0
    assert HOST_READS.snapshot()[0] == before + 1  # the range check


# ---- the deferred range check -----------------------------------------------------------------
FAR = 10**12  # rows away from the table: a read there would fault, not return a number


def test_out_of_range_ids_raise_at_the_check_point_and_read_nothing():
    table = table_of(np.float32)
    source = make(table, 13, "triton")
    reference = make(table, 13, "torch")
    good = requests(source)[0]
    bad = np.array([3, NUM_ROWS, -2, FAR, -FAR, 5, 3])
    source.gather_batch_rows(torch.from_numpy(good), take_buffer)
    rows, _ = source.gather_batch_rows(torch.from_numpy(bad), take_buffer)  # no error yet
    inside = (bad >= 0) & (bad < NUM_ROWS)
    np.testing.assert_array_equal(rows.numpy()[inside], table[bad[inside]])
    assert torch.isnan(rows[torch.from_numpy(~inside)]).all()
    with pytest.raises(IndexError) as raised:
        source.counters()
    message = str(raised.value)
    assert f"DeviceFeatures: ids must be in [0, {NUM_ROWS}), got [{-FAR}, {FAR}]" in message
    assert "4 ids outside it" in message
    # The error is raised once; the in-range ids were counted as the torch back end counts.
    source.check()
    reference.gather_device(good)
    reference.gather_device(bad[inside])
    assert source.counters()["hits"] == reference.counters()["hits"]
    assert source.rows_loaded == reference.rows_loaded
    # A reset is a check point too: it does not drop a pending error.
    source.gather_batch_rows(torch.tensor([NUM_ROWS]), take_buffer)
    with pytest.raises(IndexError, match=rf"got \[{NUM_ROWS}, {NUM_ROWS}\]"):
        source.reset_counters()


def test_the_public_gather_checks_at_once():
    source = make(table_of(np.float32), 13, "triton")
    before = HOST_READS.snapshot()[0]
    with pytest.raises(
        IndexError, match=rf"ids must be in \[0, {NUM_ROWS}\), got \[0, {NUM_ROWS}\]"
    ):
        source.gather_device(torch.tensor([0, NUM_ROWS]))
    with pytest.raises(ValueError, match="1-D integer"):
        source.gather_batch_rows(torch.tensor([0.5]), take_buffer)
    assert HOST_READS.snapshot()[0] == before + 1
    source.check()  # nothing was gathered: nothing pending


# ---- back end choice --------------------------------------------------------------------------
def test_backend_choice(monkeypatch):
    cpu, table = torch.device("cpu"), table_of(np.float32)
    choose = resolve_gather_backend
    assert choose("auto", cpu, reuse_previous=False, host_reader=False) == "torch"  # CPU runs
    assert make(table, 5, "auto").backend == "torch"
    assert choose("auto", torch.device("cuda"), reuse_previous=True, host_reader=False) == "torch"
    with pytest.raises(ValueError, match="Match"):
        DeviceFeatures(table, "cpu", 0, reuse_previous=True, backend="triton")
    with pytest.raises(ValueError, match="expected one of"):
        choose("cub", cpu, reuse_previous=False, host_reader=False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="'triton' cannot run on cpu"):
        choose("triton", cpu, reuse_previous=False, host_reader=False)
    monkeypatch.setattr(idmap_triton, "triton", None)
    assert choose("auto", torch.device("cuda"), reuse_previous=False, host_reader=False) == (
        "torch"
    )


def test_kernel_compiles_for_hopper():
    """The interpreter accepts Python the compiler rejects: compile the kernel for sm_90 (no
    GPU needed) for every host dtype, with and without a cache, one row block a program and
    looped (a capped grid)."""
    code = """
import itertools
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from distmb.pipeline.features.gather_triton import _gather_kernel, _gather_kernel_looped
from distmb.pipeline.features.gather_triton import block_shape
rows, cols = block_shape(300)
dtypes = ("fp16", "bf16", "fp32", "fp64")
for dtype, has_cache, looped in itertools.product(dtypes, (True, False), (False, True)):
    sig = dict(sorted_ids_ptr="*i64", perm_ptr="*i64", n="i64", slot_of_ptr="*i32",
               cache_ptr="*" + dtype, host_ptr="*" + dtype, host_stride="i64",
               out_ptr="*fp32", dim="i64", num_rows="i64", stats_ptr="*i64",
               **({"row_blocks": "i64"} if looped else {}), HAS_CACHE="constexpr",
               BLOCK_ROWS="constexpr", BLOCK_COLS="constexpr")
    constexprs = {"HAS_CACHE": has_cache, "BLOCK_ROWS": rows, "BLOCK_COLS": cols}
    fn = _gather_kernel_looped if looped else _gather_kernel
    kernel = triton.compile(ASTSource(fn, sig, constexprs=constexprs),
                            target=GPUTarget("cuda", 90, 32))
    ptx = kernel.asm["ptx"]
    assert ptx.count("atom.global") == 5 and "max.s64" in ptx, ptx
    assert len(kernel.asm["cubin"]) > 0
"""
    compile_triton_in_subprocess(code)


# ---- on a GPU ---------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("capacity", [0, 13])
def test_on_a_gpu_with_a_pinned_host_table(dtype, capacity):
    table = table_of(dtype)
    source = make(table, capacity, "auto", device="cuda")
    reference = make(table, capacity, "torch", device="cuda")
    assert source.backend == "triton"  # auto: Triton on CUDA
    assert source.host.host.is_pinned() and source.host.view.device.type == "cuda"
    for ids in requests(source):
        ids_t = torch.from_numpy(ids).cuda()
        torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
        try:
            rows, _ = source.gather_batch_rows(ids_t, take_buffer)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert rows.device.type == "cuda"
        np.testing.assert_array_equal(rows.cpu().numpy(), table[ids].astype(np.float32))
        reference.gather_batch_rows(ids_t, take_buffer)
    assert source.counters() == reference.counters()
    # The range names the ids gathered since construction (no error before this one).
    low = min([1, *(int(ids.min()) for ids in requests(source) if ids.size)])
    source.gather_batch_rows(torch.tensor([NUM_ROWS, 1], device="cuda"), take_buffer)
    with pytest.raises(IndexError, match=rf"got \[{low}, {NUM_ROWS}\]"):
        source.check()


def test_the_trainer_names_a_deferred_bad_id_before_the_loss_it_spoiled(monkeypatch):
    """An epoch whose gathers deferred a range error raises that error, not the non-finite
    loss its NaN rows made: the trainer checks the feature source before judging the loss."""
    from distmb.config.train import TrainConfig
    from distmb.data.datasets import load_dataset
    from distmb.engine import Trainer, TrainingDiverged

    config = TrainConfig(
        layers=2, fanout=(3, 3), hidden=8, batch_size=200, epochs=1, progress=False,
        sampler="device", kernels="torch", prefetch=0, threads=1, device_cache_mb=0.01,
    )  # fmt: skip
    graph = load_dataset("synthetic:nodes=600,feat_dim=4,train_fraction=0.5,test_fraction=0.4")
    trainer = Trainer(
        LocalGraph.from_graph(graph), config, log=lambda _: None, device=torch.device("cpu")
    )
    features = trainer.loader.features
    assert isinstance(features, DeviceFeatures)
    forward = trainer.forward
    monkeypatch.setattr(trainer, "forward", lambda *a: forward(*a) * float("nan"))
    with pytest.raises(TrainingDiverged):
        trainer.train_epoch(0)  # without a deferred error: the loss is named

    gathered = []
    gather = features.gather_batch_rows

    def gather_a_bad_id(ids, take_buffer):  # noqa: ANN001, ANN202 - as DeviceFeatures'
        gathered.append(len(ids))
        return gather(ids, take_buffer)

    def deferred() -> None:  # the check point of a gather that met a bad id
        if gathered:
            raise IndexError("DeviceFeatures: ids must be in [0, 600), got [0, 600]")

    monkeypatch.setattr(features, "gather_batch_rows", gather_a_bad_id)
    monkeypatch.setattr(features, "check", deferred)
    with pytest.raises(IndexError, match="ids must be in"):
        trainer.train_epoch(1)
