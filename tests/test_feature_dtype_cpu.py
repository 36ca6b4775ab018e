"""``--feature-dtype`` on the CPU path: the rank's feature table held in float16 or bfloat16,
against independent references (torch's own cast of the table, a float32 run on a table
rounded beforehand, the table's shape for the bytes).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import FAST_FLAGS, TIMING_KEYS, random_graph, run_train_cli
from test_distributed import launch_runs

from distmb.config.train import TrainConfig
from distmb.core.errors import InputError
from distmb.data.local import LocalGraph
from distmb.data.store.store import PartitionStore
from distmb.engine import Trainer
from distmb.engine.budget import GraphShape, estimate_memory
from distmb.engine.build.features import open_features, stored_rows
from distmb.nn.kernels.cpu_aggregate import aggregate_forward
from distmb.partition import partition_graph
from distmb.pipeline.features import ArrayFeatures, FeatureNormalization, storage
from distmb.pipeline.features.storage import (
    STORAGE_DTYPES,
    StorageRangeError,
    file_backed,
    stored_table,
)
from distmb.pipeline.rows import IndexedRows
from distmb.pipeline.sample import Block, NeighborSampler

HALF = ["float16", "bfloat16"]
FAST = dict(layers=2, fanout=(4, 4), hidden=16, batch_size=100, epochs=2, progress=False)


def rounded(table: np.ndarray, name: str) -> np.ndarray:
    """The reference: torch's cast of the whole table, back in float32."""
    return (
        torch.from_numpy(np.asarray(table, dtype=np.float32))
        .to(STORAGE_DTYPES[name])
        .float()
        .numpy()
    )


# ---- conversion --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", HALF)
def test_stored_table_converts_chunk_by_chunk_and_normalises_first(monkeypatch, tmp_path, name):
    monkeypatch.setattr(storage, "CONVERT_CHUNK_ROWS", 6)  # 40 rows: 7 chunks, one short
    table = np.random.default_rng(0).random((40, 7)).astype(np.float32) * 5
    np.save(tmp_path / "t.npy", table)
    mapped = np.load(tmp_path / "t.npy", mmap_mode="r")
    got = stored_table(mapped, STORAGE_DTYPES[name])
    assert got.dtype == STORAGE_DTYPES[name] and got.is_contiguous()
    np.testing.assert_array_equal(got.float().numpy(), rounded(table, name))
    # Row normalisation in float32, then one rounding (not a rounding of the raw rows first).
    norm = FeatureNormalization("row")
    got = stored_table(mapped, STORAGE_DTYPES[name], norm.apply_)
    expected = rounded(table / table.sum(axis=1, keepdims=True), name)
    np.testing.assert_array_equal(got.float().numpy(), expected)
    np.testing.assert_array_equal(np.load(tmp_path / "t.npy"), table)  # the file unchanged


def test_a_value_beyond_float16_names_its_row_id_and_the_flags():
    table = np.ones((30, 4), dtype=np.float32)
    table[12, 3] = 7.0e4
    with pytest.raises(StorageRangeError, match=r"row 112 holds 70000 \(column 3\)"):
        stored_table(table, torch.float16, first_row=100)
    with pytest.raises(InputError, match=r"--feature-dtype float16: feature table row 112") as err:
        stored_rows(table, "float16", first_row=100)
    assert "--feature-dtype bfloat16" in str(err.value) and "--normalize-features" in str(err.value)
    assert stored_rows(table, "bfloat16").dtype == torch.bfloat16  # float32's range


@pytest.mark.parametrize("name", HALF)
def test_stacked_tables_convert_into_one_table(monkeypatch, name):
    """A part's solid and halo tables go into one stored table (the GPU path's host rows)
    without a float32 concatenation: the rows of the concatenation, rounded, and a row of the
    second table named by its place in the whole."""
    monkeypatch.setattr(storage, "CONVERT_CHUNK_ROWS", 4)
    rng = np.random.default_rng(1)
    solid, halo = rng.random((11, 5)).astype(np.float32), rng.random((6, 5)).astype(np.float32)
    norm = FeatureNormalization("row")
    got = stored_rows([solid, torch.from_numpy(halo)], name, norm)
    whole = np.concatenate([solid, halo])
    expected = rounded(whole / whole.sum(axis=1, keepdims=True), name)
    np.testing.assert_array_equal(got.float().numpy(), expected)
    halo[2, 1] = 1.0e5
    with pytest.raises(InputError, match=r"row 113 holds 100000 \(column 1\)"):
        stored_rows((solid, halo), "float16", first_row=100)
    with pytest.raises(ValueError, match="one width"):
        storage.stacked_table([solid, halo[:, :4]], torch.bfloat16)


def test_two_byte_rows_count_two_bytes_a_value():
    table = stored_table(np.ones((10, 6), dtype=np.float32), torch.bfloat16)
    source = ArrayFeatures(table)
    assert source.gather(np.array([1, 2, 2])).dtype == torch.float32
    assert source.bytes_read == 3 * 6 * 2
    rows = source.rows_in_place(np.array([1, 3]))  # the fused layer reads them in place
    assert rows is not None and rows.table is table and rows.dtype == torch.float32
    assert source.bytes_read == 5 * 6 * 2


# ---- rows read in place -------------------------------------------------------------------------
def every_value(name: str) -> torch.Tensor:
    """A [4096, 16] table of ``name`` holding each of the 65,536 bit patterns once (zeros of
    both signs, subnormals, infinities, NaNs included)."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    return bits.view(STORAGE_DTYPES[name]).reshape(4096, 16)


@pytest.mark.parametrize("name", HALF)
def test_the_aggregation_widens_every_two_byte_value_exactly(name):
    """Each destination sums one source row: the kernel's widening equals torch's cast for
    every bit pattern (subnormals, infinities; NaNs stay NaNs)."""
    table = every_value(name)
    ids = torch.randperm(4096, generator=torch.Generator().manual_seed(0))
    block = Block(n_dst=4096, n_src=4096, n_halo=0, indptr=torch.arange(4097),
                  indices=torch.arange(4096), src_ids=ids)  # fmt: skip
    got = aggregate_forward(block, IndexedRows(table, ids), "sum")
    expected = table.float()[ids]
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    number = ~torch.isnan(expected)
    assert torch.equal(got[number], expected[number])  # -0.0 == 0.0: a sum from +0 is +0
    # Bit for bit (NaN payloads, the zeros' signs) what the float32 kernel gives on torch's
    # widening of the same table.
    reference = aggregate_forward(block, IndexedRows(table.float(), ids), "sum")
    assert torch.equal(got.view(torch.int32), reference.view(torch.int32))


@pytest.mark.parametrize("kind", ["mean", "sum"])
@pytest.mark.parametrize("name", HALF)
def test_in_place_two_byte_rows_aggregate_as_the_rounded_float32_table(name, kind):
    """Over a random block, reading a two-byte table in place gives, bit for bit, what the
    same kernel gives over the float32 table rounded to that dtype (the same sums in the
    same order), and what the gathered rows give."""
    rng = np.random.default_rng(1)
    table = stored_table(rng.standard_normal((300, 37)).astype(np.float32) * 4,
                         STORAGE_DTYPES[name])  # fmt: skip
    graph = random_graph(n=300, m=2500, feat_dim=4, classes=2, seed=1)
    sampler = NeighborSampler(graph.indptr, graph.indices, 300, 300, [6], seed=0)
    (block,) = sampler.sample(np.arange(0, 300, 3), 0, 0)
    ids = torch.as_tensor(block.src_ids, dtype=torch.int64)
    got = aggregate_forward(block, IndexedRows(table, ids), kind)
    assert torch.equal(got, aggregate_forward(block, IndexedRows(table.float(), ids), kind))
    assert torch.equal(got, aggregate_forward(block, table.float()[ids].contiguous(), kind))


# ---- the rank's sources --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def replicated_part(tmp_path_factory) -> tuple[PartitionStore, np.ndarray]:
    """Part 0 of 2 with replicated halo rows, and the whole graph's float32 features."""
    graph = random_graph(n=400, m=3000, feat_dim=6, classes=3, seed=3)
    out = tmp_path_factory.mktemp("parts") / "p2"
    partition_graph(graph, 2, out, seed=0, replicate_halo_features=True)
    return PartitionStore(out, 0), np.asarray(graph.features, dtype=np.float32)


@pytest.mark.parametrize("kind", ["mmap", "memory"])
@pytest.mark.parametrize("name", HALF)
def test_the_rank_holds_solid_and_halo_rows_in_two_bytes(replicated_part, kind, name):
    store, features = replicated_part
    local = LocalGraph.from_store(store)
    assert local.n_local > local.n_solid  # the part has halo rows
    config = TrainConfig(**FAST, features=kind, feature_dtype=name)
    sources = open_features(local, config)
    train = sources.train
    held = [train.head.table, train.tail.table]
    assert all(t.dtype == STORAGE_DTYPES[name] for t in held)
    assert sum(t.nbytes for t in held) == local.n_local * local.feat_dim * 2
    assert f"in memory as {name}" in sources.note
    ids = np.arange(local.n_local)
    vid_o = np.asarray(store.orig_ids)  # VID_p -> VID_o: the rows the part holds
    np.testing.assert_array_equal(train.gather(ids).numpy(), rounded(features[vid_o], name))
    assert sources.evaluation() is train  # evaluation reads the same two-byte table


def test_the_stored_rows_are_normalised_before_they_are_rounded(replicated_part):
    store, features = replicated_part
    local = LocalGraph.from_store(store)
    norm = FeatureNormalization("row")
    config = TrainConfig(**FAST, feature_dtype="bfloat16", normalize_features="row")
    sources = open_features(local, config, normalization=norm)
    table = features[np.asarray(store.orig_ids)]
    expected = rounded(table / table.sum(axis=1, keepdims=True), "bfloat16")
    got = sources.train.gather(np.arange(local.n_local)).numpy()
    np.testing.assert_array_equal(got, expected)  # normalised once, as stored


def test_float32_keeps_the_partition_table_as_it_is(replicated_part):
    local = LocalGraph.from_store(replicated_part[0])
    train = open_features(local, TrainConfig(**FAST)).train
    assert isinstance(train.head.table, np.memmap)  # mmap: nothing converted, nothing held


def test_features_memory_reads_a_memory_mapped_table_into_this_process(replicated_part):
    """``--features memory`` copies the part's memory-mapped float32 rows into RAM (a
    contiguous map is not returned as it is)."""
    store, features = replicated_part
    local = LocalGraph.from_store(store)
    assert file_backed(np.asarray(local.features))
    train = open_features(local, TrainConfig(**FAST, features="memory")).train
    for part in (train.head, train.tail):
        assert not file_backed(part.table) and part.table.flags.c_contiguous
    ids = np.arange(local.n_local)
    np.testing.assert_array_equal(train.gather(ids).numpy(), features[np.asarray(store.orig_ids)])


def test_the_budget_counts_the_stored_table():
    shape = GraphShape(n_solid=1000, n_local=1500, n_train=500, feat_dim=16, num_classes=4,
                       max_in_degree=50)  # fmt: skip

    def table_items(**options) -> dict[str, int]:
        items = estimate_memory(TrainConfig(**FAST, **options), shape, 1)
        return {i.what: i.nbytes for i in items if "feature table" in i.what}

    assert table_items() == {}  # mmap: the page cache's, not the rank's
    assert table_items(features="memory") == {"the feature table loaded into memory": 1500 * 16 * 4}
    for kind in ("mmap", "memory"):
        assert table_items(features=kind, feature_dtype="bfloat16") == {
            "the feature table stored as bfloat16 in memory": 1500 * 16 * 2
        }


# ---- training ---------------------------------------------------------------------------------
def _run(graph, **options) -> tuple[list[float], dict[str, float]]:
    trainer = Trainer(LocalGraph.from_graph(graph), TrainConfig(**FAST, **options),
                      log=lambda _: None)  # fmt: skip
    losses = [r["loss"] for r in trainer.fit()]
    accuracies = {k: v for k, v in trainer.evaluate().items() if k.endswith("_acc")}
    return losses, accuracies


@pytest.mark.parametrize("name", HALF)
def test_a_run_trains_and_evaluates_as_on_the_table_rounded_beforehand(name):
    """The C++ path with the table stored in ``name`` is a float32 run on the rounded table:
    the same losses and accuracies, bit for bit (training and evaluation read the stored
    rows; the float32 run reads its rows in place, the stored one gathers them)."""
    graph = random_graph(n=600, m=4000, feat_dim=8, classes=3, seed=4)
    pre_rounded = dataclasses.replace(graph, features=rounded(graph.features, name))
    stored = _run(graph, feature_dtype=name)
    assert stored == _run(pre_rounded)
    assert stored[0] != _run(graph)[0]  # the rounding is seen


def test_the_cli_runs_the_cpu_path_with_a_two_byte_table(capsys):
    argv = ["--dataset", "synthetic:nodes=800,avg_degree=6,feat_dim=8,classes=3", *FAST_FLAGS,
            "--epochs", "1", "--feature-dtype", "bfloat16"]  # fmt: skip
    code, out, err = run_train_cli(argv, capsys)
    assert code == 0, err
    assert "features: in memory as bfloat16" in out + err


# ---- out of core ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ooc_part(tmp_path_factory):
    graph = random_graph(n=700, m=5000, feat_dim=8, classes=3, seed=8)
    graph = dataclasses.replace(graph, features=np.abs(graph.features) + 0.1)
    out = tmp_path_factory.mktemp("ooc") / "p1"
    partition_graph(graph, 1, out, seed=0, features_layout="ooc")
    return out


def _store_run(part_dir, **options) -> tuple[list[float], dict[str, float]]:
    local = LocalGraph.from_store(PartitionStore(part_dir, 0))
    trainer = Trainer(local, TrainConfig(**FAST, **options), log=lambda _: None)
    losses = [r["loss"] for r in trainer.fit()]
    accuracies = {k: v for k, v in trainer.evaluate().items() if k.endswith("_acc")}
    return losses, accuracies


@pytest.mark.parametrize(
    ("policy", "normalize"),
    [("belady", "none"), ("lru", "none"), ("presc", "none"), ("none", "none"), ("lru", "row")],
)
def test_the_out_of_core_cache_in_bfloat16_trains_as_the_table_in_memory(
    ooc_part, policy, normalize
):
    """--features ooc with the cache holding bfloat16 rows: training and evaluation equal
    --features memory with the same dtype, loss for loss (hits and misses serve the same
    rounded rows, normalised first), whatever the policy."""
    common = dict(feature_dtype="bfloat16", normalize_features=normalize)
    cached = _store_run(
        ooc_part, features="ooc", cache_policy=policy, feature_cache_mb=0.004, **common
    )
    assert cached == _store_run(ooc_part, features="memory", **common)


@pytest.mark.parametrize(
    ("policy", "normalize", "match"),
    [("belady", "none", False), ("presc", "row", True), ("none", "row", False)],
)
def test_the_gpu_path_over_a_bfloat16_out_of_core_cache_trains_as_the_table_in_memory(
    ooc_part, policy, normalize, match
):
    """The GPU path (on CPU tensors) with --features ooc and bfloat16: its device cache takes
    the host cache's two-byte rows (rounded, normalised once, as read from disk) and trains
    and evaluates as over the table stored in memory in bfloat16, loss for loss."""
    common = dict(feature_dtype="bfloat16", normalize_features=normalize, sampler="device",
                  device_cache_mb=0.003, match_reorder=match)  # fmt: skip
    cached = _store_run(
        ooc_part, features="ooc", cache_policy=policy, feature_cache_mb=0.004, **common
    )
    assert cached == _store_run(ooc_part, features="memory", **common)


def test_the_device_cache_reads_two_byte_rows_from_a_bfloat16_host_cache(ooc_part):
    local = LocalGraph.from_store(PartitionStore(ooc_part, 0))
    config = TrainConfig(**FAST, features="ooc", feature_cache_mb=0.004, cache_policy="lru",
                         feature_dtype="bfloat16", sampler="device", device_cache_mb=0.003,
                         normalize_features="row")  # fmt: skip
    trainer = Trainer(local, config, log=lambda _: None)
    tiered = trainer.loader.features
    reader = tiered.device_cache.host
    assert reader.dtype == torch.bfloat16 and reader.row_bytes == 8 * 2
    assert reader.normalization is None  # the host cache normalises before it rounds
    rows = reader.gather(torch.arange(20))
    assert rows.dtype == torch.bfloat16
    raw = torch.from_numpy(np.asarray(local.features[:20], dtype=np.float32))
    want = (raw / raw.sum(dim=1, keepdim=True)).to(torch.bfloat16)
    assert torch.equal(rows, want)
    assert "rows stored as bfloat16" in trainer.parts.notes[-1]


def test_a_bfloat16_cache_holds_twice_the_rows_of_the_same_mib(ooc_part):
    local = LocalGraph.from_store(PartitionStore(ooc_part, 0))
    caches = {}
    for name in ("float32", "bfloat16"):
        config = TrainConfig(**FAST, features="ooc", feature_cache_mb=0.004, cache_policy="lru",
                             feature_dtype=name)  # fmt: skip
        caches[name] = open_features(local, config)
    full, half = caches["float32"].cache, caches["bfloat16"].cache
    assert full.capacity == int(0.004 * 2**20) // (8 * 4) and half.capacity == 2 * full.capacity
    assert half.table.dtype == torch.bfloat16 and "as bfloat16" in caches["bfloat16"].note
    assert half.memory_bytes - full.memory_bytes == full.capacity * 24  # the slots' directory


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--feature-dtype", "float16"], "--feature-dtype float16 with --features ooc: rows"),
        (["--feature-dtype", "float16", "--sampler", "device"],
         "--feature-dtype float16 with --features ooc: rows"),
    ],
)  # fmt: skip
def test_the_out_of_core_cache_refuses_what_it_cannot_store(ooc_part, capsys, flags, message):
    argv = ["--part-dir", str(ooc_part), *FAST_FLAGS, "--epochs", "1", *flags]  # ooc: default
    code, _, err = run_train_cli(argv, capsys)
    assert code == 2, err
    assert message in err and "Traceback" not in err


# ---- several ranks ---------------------------------------------------------------------------
#: The two-rank runs: the C++ path (HEC), the device path on CPU tensors, the exact baseline.
PATHS = {"cpp": [], "device": ["--sampler", "device"], "cpp-exact-remote": ["--exact-remote"]}


def test_two_ranks_train_as_on_a_partition_rounded_beforehand(tmp_path):
    """Two ranks under mpiexec, halo rows replicated (layer 0 reads them from the part's
    table, later layers through the HEC, or every halo row fetched from its owner with
    --exact-remote): with --feature-dtype bfloat16 every record equals that of a float32 run
    on a partition of the table rounded beforehand (the C++ path and the device path on CPU
    tensors). All six runs in one launch."""
    graph = random_graph(n=1200, m=9000, feat_dim=8, classes=3, seed=6)
    pre_rounded = dataclasses.replace(graph, features=rounded(graph.features, "bfloat16"))
    parts = {}
    for name, g in (("stored", graph), ("rounded", pre_rounded)):
        parts[name] = tmp_path / name
        partition_graph(g, 2, parts[name], seed=0, replicate_halo_features=True)
    runs, results = {}, {}
    for path, flags in PATHS.items():
        common = [*FAST_FLAGS, "--threads", "1", "--epochs", "2", *flags]
        for name in parts:
            key = f"{path}-{name}"
            results[key] = tmp_path / f"{key}.jsonl"
            dtype = ["--feature-dtype", "bfloat16"] if name == "stored" else []
            runs[key] = ["--part-dir", str(parts[name]), *common, *dtype,
                         "--results", str(results[key])]  # fmt: skip
    launch_runs(2, runs, tmp_path)

    def records(key: str) -> list[dict]:
        identity = TIMING_KEYS | {"args", "part_dir", "dataset", "graph"}
        lines = results[key].read_text().splitlines()
        return [{k: v for k, v in json.loads(s).items() if k not in identity} for s in lines]

    for path, flags in PATHS.items():
        stored, reference = records(f"{path}-stored"), records(f"{path}-rounded")
        if "--sampler" in flags:  # the device cache holds the same rows in half the bytes
            for a, b in zip(stored, reference, strict=True):
                ours = a["device_cache"].pop("memory_bytes")
                assert ours < b["device_cache"].pop("memory_bytes")
        assert len(stored) == 2 and stored == reference, path
