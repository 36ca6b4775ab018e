"""Out-of-core features: the ``ooc`` partition layout, its converter, the cached feature
sources (belady, presc, degree, lru, none) against the in-memory table, the superbatch
inspector in the BatchLoader, and training that is bit-identical to ``--features memory``
on 1 and 2 ranks; on the device path (``--sampler device``) too, where the host cache sits
behind the device cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import FAST_FLAGS, SMALL, TIMING_KEYS, random_graph
from test_distributed import train_results

from distmb.cli.partition import main as partition_main
from distmb.config.train import CACHE_POLICIES, TrainConfig, parse_config
from distmb.core.errors import InputError, PartitionError
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.data.store.format import META_FILE, OOC_FEATURE_FILE
from distmb.data.store.rowfile import RowFile, write_row_file
from distmb.data.store.store import PartitionStore
from distmb.engine import Trainer
from distmb.engine.build.adjacency import open_adjacency
from distmb.engine.build.features import open_features
from distmb.partition import partition_graph
from distmb.partition.convert import convert_features
from distmb.pipeline.features.cached import CachedFeatures, cache_rows
from distmb.pipeline.features.memory import ArrayFeatures, PartFeatures
from distmb.pipeline.features.presample import hot_rows, presample_counts, presample_seed
from distmb.pipeline.features.tiered import build_tiered_features
from distmb.pipeline.loader import BatchLoader
from distmb.pipeline.sample.host import NeighborSampler

#: Record keys that depend on where rows came from, not on what was trained.
SOURCE_KEYS = {"feature_cache", "neighbor_cache"}


@pytest.fixture(scope="module")
def small_graph():
    return load_dataset(SMALL)


@pytest.fixture(scope="module")
def parts(small_graph, tmp_path_factory) -> dict[str, object]:
    """The small graph in 1 and 2 parts, npy and ooc layouts, halo features replicated or
    not."""
    root = tmp_path_factory.mktemp("ooc-parts")
    out = {}
    for p in (1, 2):
        for layout in ("npy", "ooc"):
            for rep in (False, True):
                if p == 1 and rep:
                    continue
                key = f"p{p}-{layout}" + ("-rep" if rep else "")
                out[key] = root / key
                partition_graph(
                    small_graph,
                    p,
                    out[key],
                    seed=0,
                    features_layout=layout,
                    replicate_halo_features=rep,
                )
    return out


@pytest.fixture
def table_file(tmp_path):
    rng = np.random.default_rng(3)
    table = rng.standard_normal((500, 7)).astype(np.float32)
    path = tmp_path / "rows.bin"
    info = write_row_file(path, table)
    return table, RowFile(path, 500, 7, info["row_stride"], align=info["align"])


# ---- layout and converter ----------------------------------------------------------------


@pytest.mark.parametrize("key", ["p2-ooc", "p2-ooc-rep", "p1-ooc"])
def test_ooc_partition_holds_the_same_rows(parts, key):
    npy_key = key.replace("ooc", "npy")
    meta = json.loads((parts[key] / META_FILE).read_text())
    assert meta["feature_layout"] == "ooc"
    assert meta["feature_file"]["row_stride"] % 4 == 0
    for p in range(meta["num_parts"]):
        ooc, npy = PartitionStore(parts[key], p), PartitionStore(parts[npy_key], p)
        assert ooc.feature_file is not None and npy.feature_file is None
        assert not (parts[key] / f"part-{p}" / "features.npy").exists()
        np.testing.assert_array_equal(ooc.features, npy.features)
        assert (ooc.halo_features is None) == (npy.halo_features is None)
        if npy.halo_features is not None:
            np.testing.assert_array_equal(ooc.halo_features, npy.halo_features)
        for name in ("indptr", "indices", "orig_ids", "labels", "train_idx", "send_ids"):
            np.testing.assert_array_equal(getattr(ooc, name), getattr(npy, name))


def test_convert_round_trip(parts, tmp_path, small_graph):
    src = tmp_path / "conv"
    partition_graph(small_graph, 2, src, seed=0, replicate_halo_features=True)
    before = json.loads((src / META_FILE).read_text())
    assert partition_main(["--convert", str(src), "--features-layout", "ooc", "--quiet"]) == 0
    mid = json.loads((src / META_FILE).read_text())
    assert mid["feature_layout"] == "ooc"
    assert not list(src.glob("part-*/features.npy"))
    assert not list(src.glob("part-*/halo_features.npy"))
    ref = parts["p2-ooc-rep"]
    for p in range(2):
        assert (src / f"part-{p}" / OOC_FEATURE_FILE).read_bytes() == (
            ref / f"part-{p}" / OOC_FEATURE_FILE
        ).read_bytes()
        assert PartitionStore(src, p).feature_file is not None
    convert_features(src, "npy")
    after = json.loads((src / META_FILE).read_text())
    assert after["files"] == before["files"]  # byte-identical .npy files again
    assert not list(src.glob(f"part-*/{OOC_FEATURE_FILE}"))
    convert_features(src, "npy")  # already there: nothing changes
    assert json.loads((src / META_FILE).read_text()) == after


def test_convert_refuses_a_corrupt_partition(tmp_path, small_graph):
    src = tmp_path / "bad"
    partition_graph(small_graph, 1, src, seed=0)
    feats = src / "part-0" / "features.npy"
    data = bytearray(feats.read_bytes())
    data[-1] ^= 0xFF
    feats.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match="features.npy"):
        convert_features(src, "ooc")
    assert json.loads((src / META_FILE).read_text()).get("feature_layout", "npy") == "npy"


def test_corrupt_or_truncated_feature_file_is_named(parts, tmp_path):
    import shutil

    copy = tmp_path / "p"
    shutil.copytree(parts["p1-ooc"], copy)
    path = copy / "part-0" / OOC_FEATURE_FILE
    data = bytearray(path.read_bytes())
    data[10] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match=OOC_FEATURE_FILE):
        PartitionStore(copy, 0)
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(PartitionError, match=OOC_FEATURE_FILE):
        PartitionStore(copy, 0, verify="never")  # the size is checked even without hashing


def test_feature_file_entry_must_be_sane(parts, tmp_path):
    import shutil

    copy = tmp_path / "p"
    shutil.copytree(parts["p1-ooc"], copy)
    meta = json.loads((copy / META_FILE).read_text())
    meta["feature_file"]["row_stride"] = 4  # narrower than a row
    (copy / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match=OOC_FEATURE_FILE):
        PartitionStore(copy, 0, verify="never")
    del meta["feature_file"]
    (copy / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match="feature_file"):
        PartitionStore(copy, 0, verify="never")


# ---- the cached sources against the table ------------------------------------------------


def _sources(table: np.ndarray, rows: RowFile, capacity: int):
    hot = hot_rows(np.random.default_rng(1).random(table.shape[0]))
    for policy in CACHE_POLICIES:
        static = policy in ("presc", "degree")
        yield policy, CachedFeatures(rows, policy, capacity, hot_ids=hot if static else None)


@pytest.mark.parametrize("capacity", [0, 1, 17, 499, 10_000])
def test_every_policy_counts_hits_among_lookups(table_file, capacity):
    # The rows themselves are checked for every policy in test_feature_source_contract.py.
    table, rows = table_file
    rng = np.random.default_rng(capacity)
    requests = [rng.integers(0, 500, 60), np.arange(500)[::-1].copy(), np.array([499, 0, 499])]
    requests += [rng.permutation(500)[: rng.integers(1, 200)] for _ in range(12)]
    for policy, source in _sources(table, rows, capacity):
        for ids in requests:
            source.gather(ids)
        assert source.hits <= source.lookups, policy
        if policy == "none" or capacity == 0:
            assert source.hits == 0


@pytest.mark.parametrize("capacity", [0, 5, 60, 600])
@pytest.mark.parametrize("superbatch", [1, 3, 8])
def test_belady_plans_and_serves_superbatches(table_file, capacity, superbatch):
    """The executor serves planned gathers (unique ids, any order) exactly; across many
    superbatches the cache carries over; hits + disk rows = rows requested."""
    table, rows = table_file
    source = CachedFeatures(rows, "belady", capacity)
    rng = np.random.default_rng(superbatch)
    weights = 1.0 / np.arange(1, 501) ** 1.1  # skewed: some rows are hot
    weights /= weights.sum()
    total = 0
    for _ in range(4):
        traces = [
            np.unique(rng.choice(500, size=rng.integers(1, 120), p=weights))[
                ::-1
            ].copy()  # unsorted
            for _ in range(superbatch)
        ]
        source.inspect(traces)
        for ids in traces:
            np.testing.assert_array_equal(source.gather(ids).numpy(), table[ids])
            total += ids.size
    assert source.lookups == total == source.hits + source.rows_read
    if capacity >= 500:
        distinct = len(set(np.concatenate(traces)))
        assert source.rows_read >= distinct - 0  # compulsory misses at least
    # A gather that differs from the plan is refused, never served wrongly.
    if capacity:
        source.inspect([np.array([1, 2, 3])])
        with pytest.raises(RuntimeError, match="planned"):
            source.gather(np.array([1, 2, 4]))


def test_unserved_plans_never_serve_stale_rows(table_file):
    """An epoch closed early leaves planned gathers unserved, a gather that differs from its
    plan is refused: either way the cache starts again empty and every row stays exact."""
    table, rows = table_file
    source = CachedFeatures(rows, "belady", 30)
    first = [np.arange(0, 40), np.arange(20, 60), np.arange(40, 80)]
    source.inspect(first)
    np.testing.assert_array_equal(source.gather(first[0]).numpy(), table[first[0]])
    # The other two were never gathered; a new superbatch is planned.
    second = [np.arange(30, 70)[::-1].copy(), np.arange(50, 90)]
    source.inspect(second)
    for ids in second:
        np.testing.assert_array_equal(source.gather(ids).numpy(), table[ids])
    source.inspect([np.array([5, 6, 7])])
    with pytest.raises(RuntimeError, match="planned"):
        source.gather(np.array([5, 6, 8]))
    for ids in (np.arange(60, 100), np.array([61, 3, 99])):
        source.inspect([ids])
        np.testing.assert_array_equal(source.gather(ids).numpy(), table[ids])


def test_unplanned_reads_between_planned_gathers_stay_exact(table_file):
    """A reader that does not follow the plan (evaluation's view, a gather without a plan)
    while planned gathers are pending must not see slots whose rows are not written yet."""
    table, rows = table_file
    source = CachedFeatures(rows, "belady", 50)
    plan = [np.arange(0, 60), np.arange(100, 160), np.arange(0, 60)]
    source.inspect(plan)
    np.testing.assert_array_equal(source.gather(plan[0]).numpy(), table[plan[0]])
    view = source.lookup_only()  # rows 100..159 are planned into slots, not yet read
    np.testing.assert_array_equal(view.gather(np.arange(200)).numpy(), table[:200])
    ids = np.arange(90, 170)
    np.testing.assert_array_equal(source.gather(ids).numpy(), table[ids])


def test_belady_reads_less_than_lru_and_none(table_file):
    table, rows = table_file
    rng = np.random.default_rng(7)
    weights = 1.0 / np.arange(1, 501) ** 1.2
    weights /= weights.sum()
    traces = [np.unique(rng.choice(500, 80, p=weights)) for _ in range(40)]
    read = {}
    for policy in ("belady", "lru", "none"):
        source = CachedFeatures(rows, policy, 50)
        source.inspect(traces)
        for ids in traces:
            source.gather(ids)
        read[policy] = source.rows_read
    assert read["belady"] <= read["lru"] < read["none"]


def test_lookup_view_serves_without_changing_the_cache(table_file):
    table, rows = table_file
    source = CachedFeatures(rows, "lru", 100)
    source.gather(np.arange(100))
    before = source.directory().copy()
    view = source.lookup_only()
    np.testing.assert_array_equal(view.gather(np.arange(500)).numpy(), table)
    np.testing.assert_array_equal(source.directory(), before)
    assert source.lookups == 100


def test_cache_rows_and_bad_arguments(table_file):
    _, rows = table_file
    assert cache_rows(0, 7, 500) == 0
    assert cache_rows(1e6, 7, 500) == 500
    assert cache_rows(28 / 2**20, 7, 500) == 1
    with pytest.raises(ValueError):
        cache_rows(-1, 7, 500)
    with pytest.raises(ValueError, match="policy"):
        CachedFeatures(rows, "fifo", 10)
    with pytest.raises(ValueError, match="hot_ids"):
        CachedFeatures(rows, "presc", 10)


def test_presampling_uses_its_own_stream(parts):
    for seed in (0, 1, 2, 12345, 2**62):
        assert presample_seed(seed) != seed
        assert 0 <= presample_seed(seed) < 2**63
    store = PartitionStore(parts["p1-ooc"], 0)
    local = LocalGraph.from_store(store)
    cfg = TrainConfig(**_fast_cfg(), features="ooc", cache_policy="presc", feature_cache_mb=0.05)
    sources = open_features(local, cfg)
    cache = sources.cache
    assert cache is not None and 0 < cache.capacity < store.n_solid
    seed = presample_seed(cfg.seed)
    sampler = NeighborSampler(
        local.indptr, local.indices, local.n_solid, local.n_local, cfg.fanout, seed
    )
    counts = presample_counts(sampler, local.train_idx, cfg.batch_size, 1, store.n_solid, seed)
    expected = np.sort(hot_rows(counts, np.asarray(store.in_degree))[: cache.capacity])
    np.testing.assert_array_equal(np.flatnonzero(cache.directory() >= 0), expected)


# ---- the loader's superbatch inspector ---------------------------------------------------


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("superbatch", [1, 4, 100])
def test_loader_batches_equal_in_memory_batches(parts, prefetch, superbatch):
    store = PartitionStore(parts["p2-ooc-rep"], 1)
    local = LocalGraph.from_store(store)
    sampler = NeighborSampler(
        local.indptr, local.indices, local.n_solid, local.n_local, [4, 4], seed=5
    )
    memory = PartFeatures(np.array(store.features), np.array(store.halo_features))
    cache = CachedFeatures(store.feature_file, "belady", 40)
    ooc = PartFeatures(cache, n_solid=store.n_solid)
    batches = np.array_split(local.train_idx, 7)
    got = []
    for features in (memory, ooc):
        loader = BatchLoader(
            sampler, features, local.labels, prefetch=prefetch, superbatch=superbatch
        )
        plan = loader.plan(0, batches)
        got.append([(b.index, b.x.clone(), b.x_halo) for b in loader(plan)])
    for (i, x, xh), (j, y, yh) in zip(*got, strict=True):
        assert i == j
        torch.testing.assert_close(x, y, rtol=0, atol=0)
        assert (xh is None) == (yh is None)
        if xh is not None:
            torch.testing.assert_close(xh, yh, rtol=0, atol=0)
    assert cache.hits > 0 and cache.lookups == cache.hits + cache.rows_read


# ---- training ----------------------------------------------------------------------------


def _fast_cfg(**extra) -> dict:
    return {
        "layers": 2,
        "fanout": (4, 4),
        "hidden": 16,
        "batch_size": 100,
        "progress": False,
        "epochs": 2,
        "threads": 1,
        **extra,
    }


def _strip(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS | SOURCE_KEYS} for r in records]


def test_single_rank_training_is_identical_for_every_source(parts):
    runs = {}
    for name, part, extra in [
        ("memory", "p1-npy", {"features": "memory"}),
        ("mmap", "p1-ooc", {"features": "mmap"}),
        *[
            (policy, "p1-ooc", {"cache_policy": policy, "feature_cache_mb": 0.05})
            for policy in CACHE_POLICIES
        ],
        ("belady-0", "p1-ooc", {"feature_cache_mb": 0}),
        ("belady-all", "p1-ooc", {"superbatch": 3, "feature_cache_mb": 100}),
        ("graph-ooc", "p1-ooc", {"graph_layout": "ooc", "neighbor_cache_mb": 0.01}),
        ("graph-ooc-0", "p1-npy", {"graph_layout": "ooc", "neighbor_cache_mb": 0}),
    ]:
        trainer = Trainer(
            LocalGraph.from_store(PartitionStore(parts[part], 0)),
            TrainConfig(**_fast_cfg(**extra)),
            log=lambda _line: None,
        )
        runs[name] = trainer.fit()
    reference = _strip(runs["memory"])
    for name, records in runs.items():
        assert _strip(records) == reference, name
    assert "feature_cache" not in runs["mmap"][-1] and "feature_cache" not in runs["memory"][-1]
    with_cache = (*CACHE_POLICIES, "belady-0", "belady-all", "graph-ooc")
    rates = {n: runs[n][-1]["feature_cache"]["hit_rate"] for n in with_cache}
    assert rates["none"] == 0 and rates["belady-0"] == 0
    assert rates["belady-all"] > rates["belady"] > 0
    fc = runs["belady"][-1]["feature_cache"]
    assert fc["policy"] == "belady" and fc["bytes_read"] > 0 and fc["memory_bytes"] > 0
    assert fc["lookups"] == fc["hits"] + fc["rows_read"]
    nc = runs["graph-ooc"][-1]["neighbor_cache"]
    assert 0 < nc["hits"] < nc["lookups"] and nc["bytes_read"] > 0 and nc["memory_bytes"] > 0
    nc0 = runs["graph-ooc-0"][-1]["neighbor_cache"]
    assert (
        nc0["hits"] == 0 and nc0["rows_read"] > 0 and "feature_cache" not in runs["graph-ooc-0"][-1]
    )
    assert "neighbor_cache" not in runs["belady"][-1]


@pytest.mark.parametrize(
    "policy, extra",
    [
        ("belady", []),
        ("presc", ["--graph-layout", "ooc", "--neighbor-cache-mb", "0.01"]),
        ("lru", []),
    ],
)
def test_two_rank_training_is_identical_to_memory(parts, tmp_path, policy, extra):
    argv = [*FAST_FLAGS, "--threads", "1", "--epochs", "2"]
    memory = train_results(
        2,
        ["--part-dir", str(parts["p2-npy-rep"]), *argv, "--features", "memory"],
        tmp_path / "m.jsonl",
    )
    ooc = train_results(
        2,
        [
            "--part-dir",
            str(parts["p2-ooc-rep"]),
            *argv,
            "--cache-policy",
            policy,
            "--feature-cache-mb",
            "0.05",
            "--superbatch",
            "4",
            *extra,
        ],
        tmp_path / "o.jsonl",
    )
    assert _strip(ooc) == _strip(memory)
    assert all(r["feature_cache"]["lookups"] > 0 for r in ooc)


# ---- the device path: the host cache behind the device cache ---------------------------------


def _device_misses(
    traces: list[np.ndarray], cached: set[int], reuse: bool, previous: set[int]
) -> list[np.ndarray]:
    """Brute force: per gather, the distinct ids outside the device cache (ascending), less
    those of the last gather that missed any (Match, ``reuse``; ``previous``: its misses,
    updated in place); empty reads dropped."""
    loads = []
    for ids in traces:
        missed = sorted(set(ids.tolist()) - cached)
        if not missed:
            continue
        load = [i for i in missed if not (reuse and i in previous)]
        if reuse:
            previous.clear()
            previous.update(missed)
        if load:
            loads.append(np.array(load, dtype=np.int64))
    return loads


@pytest.mark.parametrize("policy", ["belady", "lru", "presc", "none"])
@pytest.mark.parametrize("reuse", [False, True])
def test_host_cache_behind_the_device_cache_counts_like_the_host_path(table_file, policy, reuse):
    """The host cache of the device path serves the device cache's misses: its counters equal
    those of the host path's cache (same policy and capacity) asked for those misses, with
    the same superbatch plans; the rows are the table's."""
    table, rows = table_file
    hot = hot_rows(np.random.default_rng(1).random(500)) if policy == "presc" else None
    host = CachedFeatures(rows, policy, 60, hot_ids=hot)
    tiered = build_tiered_features(
        host, "cpu", cache_mb=40 * 7 * 4 / 2**20, policy="degree",  # 40 rows
        degree=np.random.default_rng(2).integers(0, 50, 500), make_sampler=None,
        train_idx=np.zeros(0, dtype=np.int64), batch_size=1, presample_epochs=1, seed=0,
        reuse_previous=reuse,
    )  # fmt: skip
    assert tiered.wants_trace == (policy == "belady")
    reference = CachedFeatures(
        RowFile(rows.path, 500, 7, rows.row_stride, align=rows.align), policy, 60, hot_ids=hot
    )
    cached = set(tiered.device_cache.cached_ids().tolist())
    assert len(cached) == 40
    rng = np.random.default_rng(4)
    weights = 1.0 / np.arange(1, 501) ** 1.1  # skewed: some rows are hot
    requested, previous = 0, set()
    for _ in range(6):  # superbatches of 3 gathers
        traces = [rng.choice(500, rng.integers(20, 120), p=weights / weights.sum())
                  for _ in range(3)]  # fmt: skip
        loads = _device_misses(traces, cached, reuse, previous)
        tiered.inspect(traces)
        reference.inspect(loads)
        for ids in traces:
            np.testing.assert_array_equal(tiered.gather(ids).numpy(), table[ids])
            requested += ids.size
        for ids in loads:
            reference.gather(ids)
        # The device cache's misses are read from the host cache once per gather.
        assert reference.counters() == tiered.host_cache.counters()
        assert reference.stats()["bytes_read"] == tiered.host_cache.stats()["bytes_read"]
    device = tiered.device_cache.counters()
    assert device["lookups"] == requested and device["rows_loaded"] == reference.lookups
    assert (device["rows_reused"] > 0) == reuse
    assert tiered.counters()["bytes_read"] == reference.counters()["bytes_read"] > 0


def _device_cfg(**extra) -> TrainConfig:
    return TrainConfig(
        **_fast_cfg(
            sampler="device",
            device_cache_mb=0.02,
            superbatch=3,
            match_reorder=True,
            normalize_features="standard",
            **extra,
        )
    )


def test_device_path_training_with_ooc_features_is_identical_to_memory(parts):
    """``--sampler device --features ooc``: the same losses, accuracies and device cache
    counters (Match-Reorder and normalised features included) as ``--features memory`` (the
    same rows, from the disk through the host cache); the host cache reads what the device
    cache misses."""
    runs = {}
    for name, part, extra in [
        ("memory", "p1-npy", {"features": "memory"}),
        ("belady", "p1-ooc", {"feature_cache_mb": 0.05}),
        ("presc", "p1-ooc", {"feature_cache_mb": 0.05, "cache_policy": "presc"}),
    ]:
        local = LocalGraph.from_store(PartitionStore(parts[part], 0))
        runs[name] = Trainer(local, _device_cfg(**extra), log=lambda _line: None).fit()
    assert "feature_cache" not in runs["memory"][-1]
    for name in ("belady", "presc"):
        records = runs[name]
        assert _strip(records) == _strip(runs["memory"]), name
        for r in records:
            host, device = r["feature_cache"], r["device_cache"]
            assert host["lookups"] == device["rows_loaded"] > 0 and device["hits"] > 0
            assert host["lookups"] == host["hits"] + host["rows_read"]
            assert host["bytes_read"] > 0 and host["policy"] == name
    assert runs["belady"][-1]["feature_cache"]["hits"] > 0
    assert runs["belady"][-1]["device_cache"]["rows_reused"] > 0  # Match


@pytest.mark.cuda
def test_cuda_training_with_ooc_features_counts_both_caches(parts):
    """On a GPU: the device cache's misses come from the out-of-core host cache through a
    pinned buffer; the losses are the in-memory run's (up to the GPU's summation order)."""
    runs = {}
    for name, part, extra in [
        ("memory", "p1-npy", {"features": "memory"}),
        ("ooc", "p1-ooc", {"feature_cache_mb": 0.05}),
    ]:
        local = LocalGraph.from_store(PartitionStore(parts[part], 0))
        runs[name] = Trainer(local, _device_cfg(device="cuda", **extra), log=lambda _: None).fit()
    for ooc, memory in zip(runs["ooc"], runs["memory"], strict=True):
        assert ooc["loss"] == pytest.approx(memory["loss"], rel=1e-4)
        host, device = ooc["feature_cache"], ooc["device_cache"]
        assert host["lookups"] == device["rows_loaded"] > 0
        assert device["bytes_h2d"] == device["rows_loaded"] * 16 * 4 and host["bytes_read"] > 0


def test_two_rank_device_path_with_ooc_features_is_identical_to_memory(parts, tmp_path):
    argv = [*FAST_FLAGS, "--threads", "1", "--epochs", "2", "--sampler", "device",
            "--device-cache-mb", "0.02", "--superbatch", "4"]  # fmt: skip
    memory = train_results(
        2, ["--part-dir", str(parts["p2-npy-rep"]), *argv, "--features", "memory"],
        tmp_path / "m.jsonl",
    )  # fmt: skip
    ooc = train_results(
        2, ["--part-dir", str(parts["p2-ooc-rep"]), *argv, "--feature-cache-mb", "0.05"],
        tmp_path / "o.jsonl",
    )  # fmt: skip
    assert _strip(ooc) == _strip(memory)
    for r in ooc:
        assert r["feature_cache"]["lookups"] == r["device_cache"]["rows_loaded"] > 0


def test_feature_flags_are_checked(parts):
    with pytest.raises(InputError, match="--superbatch"):
        parse_config(["--superbatch", "0"])
    with pytest.raises(InputError, match="--feature-cache-mb"):
        parse_config(["--feature-cache-mb", "-1"])
    with pytest.raises(InputError, match="only to --features ooc"):
        parse_config(["--features", "mmap", "--cache-policy", "lru"])
    local = LocalGraph.from_store(PartitionStore(parts["p1-npy"], 0))
    with pytest.raises(InputError, match="--features-layout ooc"):
        open_features(local, TrainConfig(**_fast_cfg(), features="ooc"))
    graph = LocalGraph.from_graph(random_graph())
    with pytest.raises(InputError, match="ooc layout"):
        open_features(graph, TrainConfig(**_fast_cfg(), features="ooc"))
    with pytest.raises(InputError, match="--part-dir"):
        open_adjacency(graph, TrainConfig(**_fast_cfg(), graph_layout="ooc"))
    with pytest.raises(InputError, match="only to --graph-layout ooc"):
        parse_config(["--neighbor-cache-mb", "3"])


def test_caches_larger_than_memory_are_refused_by_flag(parts, monkeypatch):
    """A cache that cannot fit in the machine's memory is a one-line error naming its flag,
    not an allocator traceback (the table and the lists are clamped first)."""
    import distmb.core.machine as machine

    local = LocalGraph.from_store(PartitionStore(parts["p1-ooc"], 0))
    monkeypatch.setattr(machine, "physical_memory_bytes", lambda: 4096)
    with pytest.raises(InputError, match=r"--feature-cache-mb 1024: .* GiB of memory"):
        open_features(local, TrainConfig(**_fast_cfg(), features="ooc"))
    with pytest.raises(InputError, match=r"--neighbor-cache-mb 256: .* GiB of memory"):
        open_adjacency(local, TrainConfig(**_fast_cfg(), graph_layout="ooc"))
    open_features(local, TrainConfig(**_fast_cfg(), features="ooc", cache_policy="none"))
    monkeypatch.setattr(machine, "physical_memory_bytes", lambda: None)  # unknown: no check
    open_features(local, TrainConfig(**_fast_cfg(), features="ooc"))


def test_array_source_and_part_features_with_one_table():
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    part = PartFeatures(ArrayFeatures(table), n_solid=6)
    assert part.has_halo and part.n_solid == 6 and part.num_rows == 10
    np.testing.assert_array_equal(part.gather(np.array([9, 0, 6])).numpy(), table[[9, 0, 6]])
    with pytest.raises(ValueError, match="n_solid"):
        PartFeatures(ArrayFeatures(table), n_solid=11)
