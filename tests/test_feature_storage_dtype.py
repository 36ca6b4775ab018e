"""``--feature-dtype``: the GPU path's feature table stored in float16 or bfloat16 (host rows
read over PCIe, the device cache), against independent references: torch's own cast of the
table, brute-force byte counts, and a run on a table rounded beforehand.

Every test runs on CPU tensors in CI (the sync-free gather under Triton's interpreter) and
the ``cuda``-marked ones on a GPU. The C++ path's table in two bytes:
``tests/test_feature_dtype_cpu.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import FAST_FLAGS, random_graph, run_train_cli

from distmb.config.train import TrainConfig
from distmb.core.errors import InputError
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.partition import partition_graph
from distmb.pipeline.features import storage
from distmb.pipeline.features.device import build_device_features
from distmb.pipeline.features.normalize import FeatureNormalization
from distmb.pipeline.features.storage import STORAGE_DTYPES, StorageRangeError
from distmb.pipeline.features.zero_copy import ROW_ALIGN_BYTES, HostRows
from distmb.pipeline.sample import NeighborSampler

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
HALF = [torch.float16, torch.bfloat16]


def _table(rows: int = 37, dim: int = 9, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, dim)) * 3).astype(np.float32)


def _stored(table: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The reference: torch's cast of the whole table, back in float32."""
    return torch.from_numpy(table).to(dtype).float().numpy()


# ---- host rows --------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("align", [True, False])
def test_host_rows_store_the_table_in_another_dtype(monkeypatch, device, dtype, align):
    monkeypatch.setattr(storage, "CONVERT_CHUNK_ROWS", 5)  # 37 rows: 8 chunks, one short
    table = _table()
    rows = HostRows(table, device, align_rows=align, dtype=dtype)
    assert rows.dtype == dtype and rows.view.dtype == dtype
    assert rows.row_bytes == 9 * 2
    if align:
        assert rows.width * 2 % ROW_ALIGN_BYTES == 0
    ids = torch.tensor([0, 4, 5, 30, 36], device=device)
    got = rows.gather(ids)
    assert got.dtype == dtype and got.device.type == device
    expected = _stored(table, dtype)[[0, 4, 5, 30, 36]]
    np.testing.assert_array_equal(got.float().cpu().numpy(), expected)
    rows.close()


def test_a_memory_mapped_table_is_converted_chunk_by_chunk(monkeypatch, tmp_path):
    """A partition's features come memory-mapped (read only): converted as read, a chunk at
    a time, the file unchanged."""
    monkeypatch.setattr(storage, "CONVERT_CHUNK_ROWS", 4)
    np.save(tmp_path / "features.npy", _table())
    mapped = np.load(tmp_path / "features.npy", mmap_mode="r")
    rows = HostRows(mapped, "cpu", dtype=torch.bfloat16)
    got = rows.gather(torch.arange(37)).float().numpy()
    np.testing.assert_array_equal(got, _stored(_table(), torch.bfloat16))
    np.testing.assert_array_equal(np.load(tmp_path / "features.npy"), _table())


@pytest.mark.parametrize("device", DEVICES)
def test_a_bfloat16_tensor_is_a_host_table(device):
    table = torch.from_numpy(_table()).to(torch.bfloat16)
    rows = HostRows(table, device)
    assert rows.dtype == torch.bfloat16
    got = rows.gather(torch.arange(37, device=device)).cpu()
    assert torch.equal(got, table)
    rows.close()


def test_float16_refuses_values_beyond_its_range(monkeypatch):
    monkeypatch.setattr(storage, "CONVERT_CHUNK_ROWS", 5)
    table = _table()
    table[23, 4] = 1.0e5
    message = r"row 23 holds 100000 \(column 4\), beyond float16"
    with pytest.raises(StorageRangeError, match=message):
        HostRows(table, "cpu", dtype=torch.float16)
    # bfloat16 has float32's exponent range; values already not finite stay as they are.
    HostRows(table, "cpu", dtype=torch.bfloat16)
    table[23, 4], table[2, 0] = np.inf, np.nan
    rows = HostRows(table, "cpu", dtype=torch.float16)
    stored = rows.gather(torch.tensor([2, 23])).float().numpy()
    assert np.isnan(stored[0, 0]) and stored[1, 4] == np.inf


def test_host_rows_refuse_a_dtype_they_cannot_store():
    with pytest.raises(ValueError, match="host rows dtype"):
        HostRows(_table(), "cpu", dtype=torch.int32)


# ---- the device cache --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def local() -> LocalGraph:
    return LocalGraph.from_graph(random_graph(n=500, m=3000, feat_dim=9, classes=3, seed=2))


def _source(local: LocalGraph, device: str, cache_mb: float, dtype, backend: str):
    def make_sampler(seed: int) -> NeighborSampler:
        indptr, indices = local.indptr, local.indices
        return NeighborSampler(indptr, indices, local.n_solid, local.n_local, [3, 4], seed)

    table = np.asarray(local.features, dtype=np.float32)
    source = build_device_features(
        table, device, cache_mb, "degree", degree=np.diff(local.indptr), make_sampler=make_sampler,
        train_idx=local.train_idx, batch_size=40, presample_epochs=1, seed=5, backend=backend,
        dtype=dtype,
    )  # fmt: skip
    return table, source


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gathers_return_the_stored_rows_and_count_half_the_bytes(local, device, dtype, backend):
    cache_mb = 100 * 9 * 4 / 2**20  # 100 float32 rows' worth
    table, source = _source(local, device, cache_mb, dtype, backend)
    assert source.capacity == 200  # two-byte rows: twice the rows in the same MiB
    assert source.cache.dtype == dtype
    ids = np.random.default_rng(3).integers(0, 500, size=300)
    rows, _ = source.gather_batch_rows(torch.from_numpy(ids).to(device), None)
    assert rows.dtype == torch.float32
    np.testing.assert_array_equal(rows.cpu().numpy(), _stored(table, dtype)[ids])
    cached = set(source.cached_ids().tolist())
    distinct_misses = len(set(ids.tolist()) - cached)
    counters = source.counters()
    assert counters["rows_loaded"] == distinct_misses
    assert counters["bytes_h2d"] == distinct_misses * 9 * 2


# ---- the run ----------------------------------------------------------------------------------
FAST = dict(
    layers=2, fanout=(4, 4), hidden=16, batch_size=100, epochs=2, prefetch=0, progress=False
)


def _losses(local: LocalGraph, **options) -> list[float]:
    config = TrainConfig(**FAST, sampler="device", **options)
    trainer = Trainer(local, config, log=lambda _: None)
    return [r["loss"] for r in trainer.fit()]


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_a_run_trains_as_on_the_table_rounded_beforehand(name):
    """Storing the table in ``name`` is training on its rounded values: the losses equal
    those of a float32 run whose table was rounded before training, bit for bit."""
    graph = random_graph(n=600, m=4000, feat_dim=8, classes=3, seed=4)
    rounded = dataclasses.replace(
        graph, features=_stored(np.asarray(graph.features, dtype=np.float32), STORAGE_DTYPES[name])
    )
    stored = _losses(LocalGraph.from_graph(graph), feature_dtype=name, device_cache_mb=0.005)
    reference = _losses(LocalGraph.from_graph(rounded), device_cache_mb=0.005)
    assert stored == reference
    assert stored != _losses(LocalGraph.from_graph(graph), device_cache_mb=0.005)


def _run(graph, **options) -> tuple[Trainer, list[float], dict[str, float]]:
    config = TrainConfig(**FAST, sampler="device", **options)
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    losses = [r["loss"] for r in trainer.fit()]
    accuracies = {k: v for k, v in trainer.evaluate().items() if k.endswith("_acc")}
    return trainer, losses, accuracies


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_evaluation_reads_the_host_rows_the_gpu_reads(name):
    """One table in host memory: evaluation gathers from the device cache's host rows (the
    same memory), normalised once and rounded as training reads them; the run, evaluation
    included, equals a float32 run on that table prepared beforehand."""
    graph = random_graph(n=600, m=4000, feat_dim=8, classes=3, seed=4)
    features = np.abs(np.asarray(graph.features, dtype=np.float32)) + 0.1
    graph = dataclasses.replace(graph, features=features)
    trainer, losses, accuracies = _run(graph, feature_dtype=name, normalize_features="row",
                                       device_cache_mb=0.005)  # fmt: skip
    host = trainer.parts.device_stages.device_cache.host.host
    table = trainer.feature_sources.evaluation().head.table
    assert table.data_ptr() == host.data_ptr() and table.dtype == STORAGE_DTYPES[name]
    normalised = FeatureNormalization("row").apply_(torch.from_numpy(features.copy()))
    prepared = dataclasses.replace(
        graph, features=_stored(normalised.numpy(), STORAGE_DTYPES[name])
    )
    _, reference_losses, reference_accuracies = _run(prepared, device_cache_mb=0.005)
    assert (losses, accuracies) == (reference_losses, reference_accuracies)


def test_the_run_header_names_the_stored_dtype(capsys):
    argv = ["--dataset", "synthetic:nodes=800,avg_degree=6,feat_dim=8,classes=3", *FAST_FLAGS,
            "--epochs", "1", "--sampler", "device", "--feature-dtype", "bfloat16"]  # fmt: skip
    code, out, err = run_train_cli(argv, capsys)
    assert code == 0, err
    assert "rows stored as bfloat16" in out + err


def test_float16_with_a_table_beyond_its_range_names_the_flag():
    graph = random_graph(n=300, m=2000, feat_dim=8, classes=3, seed=4)
    features = np.asarray(graph.features, dtype=np.float32).copy()
    features[7, 2] = -7.0e4
    local = LocalGraph.from_graph(dataclasses.replace(graph, features=features))
    message = r"--feature-dtype float16: feature table row 7 holds -70000"
    with pytest.raises(InputError, match=message) as error:
        _losses(local, feature_dtype="float16")
    assert "--feature-dtype bfloat16" in str(error.value)
    assert "--normalize-features" in str(error.value)


def test_the_out_of_core_cache_refuses_another_dtype(tmp_path, capsys):
    graph = random_graph(n=300, m=2000, feat_dim=8, classes=3, seed=4)
    partition_graph(graph, 1, tmp_path / "p", seed=0, features_layout="ooc")
    argv = ["--part-dir", str(tmp_path / "p"), *FAST_FLAGS, "--epochs", "1",
            "--sampler", "device", "--features", "ooc", "--feature-cache-mb", "1",
            "--feature-dtype", "float16"]  # fmt: skip
    code, _, err = run_train_cli(argv, capsys)
    assert code == 2, err
    assert "--feature-dtype float16 with --features ooc" in err and "Traceback" not in err
