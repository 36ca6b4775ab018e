"""The data path's seams: FeatureSource implementations, MiniBatch, the staged and
prefetching BatchLoader, and the package layout (no cycle between runtime and partitioner)."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_graph

from distmb.config.train import TrainConfig
from distmb.data.local import LocalGraph
from distmb.engine.evaluate import HaloExchange
from distmb.halo import DropHalo, HaloScheme
from distmb.pipeline import BatchLoader, MiniBatch
from distmb.pipeline.features import ArrayFeatures, ConcatFeatures, PartFeatures
from distmb.pipeline.sample import Block, NeighborSampler

ROOT = Path(__file__).resolve().parents[1]


# ---- FeatureSource -----------------------------------------------------------------------


def _table(n: int = 50, dim: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_array_features_gather_equals_indexing(as_tensor):
    table = _table()
    source = ArrayFeatures(torch.from_numpy(table) if as_tensor else table)
    ids = np.array([3, 3, 49, 0, 17], dtype=np.int64)
    out = source.gather(ids)
    assert out.dtype == torch.float32 and tuple(out.shape) == (5, 6)
    np.testing.assert_array_equal(out.numpy(), table[ids])
    buf = torch.full((5, 6), -1.0)
    assert source.gather_into(torch.from_numpy(ids), buf) is buf
    np.testing.assert_array_equal(buf.numpy(), table[ids])
    assert source.rows_served == 10
    assert source.counters()["bytes_read"] == 10 * 6 * 4
    source.reset_counters()
    assert source.counters() == {"rows_served": 0, "bytes_read": 0}
    assert tuple(source.gather(np.empty(0, dtype=np.int64)).shape) == (0, 6)


def test_array_features_reads_a_read_only_memory_map(tmp_path):
    table = _table()
    np.save(tmp_path / "f.npy", table)
    mapped = np.load(tmp_path / "f.npy", mmap_mode="r")
    ids = np.array([7, 1, 7], dtype=np.int64)
    np.testing.assert_array_equal(ArrayFeatures(mapped).gather(ids).numpy(), table[ids])


def test_part_features_solid_then_halo():
    solid, halo = _table(10), _table(4, seed=1)
    source = PartFeatures(solid, halo)
    assert source.has_halo and source.num_rows == 14 and source.n_solid == 10
    ids = np.array([12, 0, 9, 10, 13, 2], dtype=np.int64)
    expected = np.concatenate([solid, halo])[ids]
    np.testing.assert_array_equal(source.gather(ids).numpy(), expected)
    no_halo = PartFeatures(solid)
    assert not no_halo.has_halo
    with pytest.raises(IndexError, match=r"ids must be in \[0, 10\)"):
        no_halo.gather(np.array([10]))


@pytest.mark.parametrize(
    "ids",
    [[0, 9, 9, 3, 10, 13, 10], [11, 12], [4, 2], [1, 10, 2], []],
    ids=["head-then-tail", "tail-only", "head-only", "interleaved", "empty"],
)
def test_part_features_every_order_of_solid_and_halo_ids(ids):
    # Head ids before tail ids (a block's order: halo leaves last) read straight into the
    # output's slices; any other order scatters: both equal plain indexing.
    solid, halo = _table(10), _table(4, seed=1)
    ids = np.array(ids, dtype=np.int64)
    expected = np.concatenate([solid, halo])[ids]
    np.testing.assert_array_equal(PartFeatures(solid, halo).gather(ids).numpy(), expected)


def test_concat_features_of_sources():
    a, b = ArrayFeatures(_table(3)), ArrayFeatures(_table(5, seed=2))
    both = ConcatFeatures(a, b)
    ids = np.array([7, 2, 3, 0], dtype=np.int64)
    expected = np.concatenate([a.table, b.table])[ids]
    np.testing.assert_array_equal(both.gather(ids).numpy(), expected)
    with pytest.raises(ValueError, match="widths differ"):
        ConcatFeatures(a, ArrayFeatures(_table(3, dim=2)))


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        (np.array([-1]), IndexError, "must be in"),
        (np.array([50]), IndexError, "must be in"),
        (np.array([[1, 2]]), ValueError, "1-D integer"),
        (np.array([1.5]), ValueError, "1-D integer"),
    ],
)
def test_feature_source_rejects_bad_ids(ids, error, match):
    with pytest.raises(error, match=match):
        ArrayFeatures(_table()).gather(ids)


def test_gather_into_checks_the_buffer():
    with pytest.raises(ValueError, match=r"float32\[2, 6\]"):
        ArrayFeatures(_table()).gather_into(np.array([1, 2]), torch.empty(2, 5))


# ---- BatchLoader -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local() -> LocalGraph:
    return LocalGraph.from_graph(random_graph(n=600, m=4000, feat_dim=7, classes=3, seed=4))


def _loader(local: LocalGraph, prefetch: int, **kwargs) -> BatchLoader:
    sampler = NeighborSampler(
        local.indptr, local.indices, local.n_solid, local.n_local, [3, 4], seed=11
    )
    return BatchLoader(
        sampler, PartFeatures(local.features), local.labels, prefetch=prefetch, **kwargs
    )


def _batches(local: LocalGraph, num: int = 9) -> list[np.ndarray]:
    order = np.random.default_rng(0).permutation(local.train_idx)
    return np.array_split(order, num)


def _same_batch(a: MiniBatch, b: MiniBatch) -> None:
    assert (a.epoch, a.index) == (b.epoch, b.index)
    np.testing.assert_array_equal(a.seeds, b.seeds)
    assert torch.equal(a.labels, b.labels)
    assert torch.equal(a.x, b.x)
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert (x.n_dst, x.n_src, x.n_halo) == (y.n_dst, y.n_src, y.n_halo)
        for name in ("indptr", "indices", "src_ids"):
            assert torch.equal(getattr(x, name), getattr(y, name))


@pytest.mark.parametrize("prefetch", [1, 2, 5])
def test_prefetch_yields_the_synchronous_batches(local, prefetch):
    batches = _batches(local)
    sync = _loader(local, 0)
    ahead = _loader(local, prefetch)
    assert sync.synchronous and not ahead.synchronous
    for epoch in (0, 3):
        want = list(sync(sync.plan(epoch, batches)))
        got = list(ahead(ahead.plan(epoch, batches)))
        assert [b.index for b in got] == list(range(len(batches)))
        for a, b in zip(want, got, strict=True):
            _same_batch(a, b)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_recycled_buffers_hold_each_batch_while_it_is_current(local, prefetch):
    """With ``reuse_buffers`` a consumer that holds one batch at a time sees the same rows as
    with fresh tensors, and the gather stage stops allocating after a few batches."""
    batches = _batches(local, 12)
    fresh = _loader(local, 0)
    want = [b.x.clone() for b in fresh(fresh.plan(0, batches))]
    reused = _loader(local, prefetch, reuse_buffers=True)
    for epoch in range(3):
        got = [b.x.clone() for b in reused(reused.plan(0, batches))]
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True)), epoch
    assert fresh.buffers_allocated == 12
    assert reused.buffers_allocated <= prefetch + 4, reused.buffers_allocated


def test_a_recycled_batch_lets_go_of_its_rows(local):
    loader = _loader(local, 2, reuse_buffers=True)
    it = loader(loader.plan(0, _batches(local)))
    first = next(it)
    assert first.x is not None
    next(it)
    assert first.x is None and first.buffer is None  # kept too long: fails loudly
    it.close()


def test_loader_refuses_zero_threads(local):
    with pytest.raises(ValueError, match="threads must be >= 1"):
        _loader(local, 2, threads=0)


def test_producer_failing_at_start_raises_instead_of_hanging(local, monkeypatch):
    import distmb.pipeline.loader as loader_module

    class BrokenC:
        @staticmethod
        def set_num_threads(n):
            raise RuntimeError("injected: OpenMP refused")

        get_num_threads = staticmethod(loader_module._C.get_num_threads)

    loader = _loader(local, 2)
    monkeypatch.setattr(loader_module, "_C", BrokenC)
    with pytest.raises(RuntimeError, match="injected: OpenMP refused"):
        list(loader(loader.plan(0, _batches(local))))


def test_minibatch_contents_match_sampler_and_table(local):
    loader = _loader(local, 2)
    seeds = _batches(local)[0]
    (batch,) = loader(loader.plan(5, [seeds]))
    blocks = NeighborSampler(
        local.indptr, local.indices, local.n_solid, local.n_local, [3, 4], seed=11
    ).sample(seeds, 5, 0)
    assert torch.equal(batch.blocks[-1].dst_ids, torch.from_numpy(seeds))
    assert torch.equal(batch.blocks[0].src_ids, blocks[0].src_ids)
    np.testing.assert_array_equal(batch.x.numpy(), local.features[blocks[0].src_ids.numpy()])
    np.testing.assert_array_equal(batch.labels.numpy(), local.labels[seeds])
    assert batch.size == seeds.size and batch.x_halo is None
    assert torch.equal(batch.solid_ids(0), blocks[0].src_ids)
    assert batch.halo_ids(0).numel() == 0
    assert batch.sample_s >= 0 and batch.gather_s >= 0


def test_reordering_a_superbatch_keeps_every_batch(local):
    """The production order may permute a superbatch; batch ``i`` stays batch ``i``."""
    batches = _batches(local, 10)

    def reverse(epoch, indices, _batches):
        return indices[::-1]

    plain = _loader(local, 0)
    reordered = _loader(local, 2, superbatch=4, reorder=reverse)
    plan = reordered.plan(1, batches)
    assert plan.order == [3, 2, 1, 0, 7, 6, 5, 4, 9, 8]
    assert plan.superbatches() == [[3, 2, 1, 0], [7, 6, 5, 4], [9, 8]]
    want = {b.index: b for b in plain(plain.plan(1, batches))}
    got = list(reordered(plan))
    assert [b.index for b in got] == plan.order
    for b in got:
        _same_batch(want[b.index], b)


def test_reorder_must_return_a_permutation(local):
    loader = _loader(local, 0, superbatch=2, reorder=lambda e, idx, b: [idx[0], idx[0]])
    with pytest.raises(ValueError, match="not a permutation"):
        loader.plan(0, _batches(local, 4))


class _FailingSampler:
    uses_collectives = False

    def __init__(self, inner, fail_at: int) -> None:
        self.inner, self.fail_at = inner, fail_at

    def sample(self, seeds, epoch, iteration):
        if iteration == self.fail_at:
            raise RuntimeError(f"injected failure at batch {iteration}")
        return self.inner.sample(seeds, epoch, iteration)


def test_producer_error_reaches_the_consumer(local):
    loader = _loader(local, 2)
    loader.sampler = _FailingSampler(loader.sampler, fail_at=3)
    seen = []
    with pytest.raises(RuntimeError, match="injected failure at batch 3"):
        for batch in loader(loader.plan(0, _batches(local))):
            seen.append(batch.index)
    assert seen == [0, 1, 2]


def test_closing_early_stops_the_producer(local):
    before = threading.active_count()
    loader = _loader(local, 3)
    it = loader(loader.plan(0, _batches(local)))
    next(it)
    it.close()
    assert threading.active_count() == before
    assert not any(t.name == "distmb-batch-loader" for t in threading.enumerate())


def test_collective_stages_run_synchronously(local):
    loader = _loader(local, 2)

    class Collective:
        uses_collectives = True

        def sample(self, seeds, epoch, iteration):
            assert threading.current_thread() is threading.main_thread()
            return loader_sampler.sample(seeds, epoch, iteration)

    loader_sampler = loader.sampler
    loader.sampler = Collective()
    assert loader.synchronous
    assert len(list(loader(loader.plan(0, _batches(local, 3))))) == 3


def test_load_wait_is_counted(local):
    loader = _loader(local, 0)
    list(loader(loader.plan(0, _batches(local))))
    assert loader.load_wait > 0


def test_negative_prefetch_is_refused(local):
    with pytest.raises(ValueError, match="prefetch must be >= 0"):
        _loader(local, -1)


# ---- halo schemes on one rank ------------------------------------------------------------


def _block(n_dst: int, n_src: int, n_halo: int, edges: list[tuple[int, int]]) -> Block:
    dst = np.array([d for d, _ in edges], dtype=np.int64)
    src = np.array([s for _, s in edges], dtype=np.int64)
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n_dst), out=indptr[1:])
    return Block(
        n_dst,
        n_src,
        n_halo,
        torch.from_numpy(indptr),
        torch.from_numpy(src[order]),
        torch.arange(n_src, dtype=torch.int64),
    )


def _halo_batch(x_halo: torch.Tensor | None) -> MiniBatch:
    # block 0: 2 dst, 4 sources of which the last 1 is halo; block 1: 1 dst, 2 sources + 1 halo
    b0 = _block(2, 4, 1, [(0, 2), (0, 3), (1, 0), (1, 3)])
    b1 = _block(1, 3, 1, [(0, 1), (0, 2)])
    return MiniBatch(
        epoch=0,
        index=0,
        seeds=np.array([0]),
        blocks=[b0, b1],
        labels=torch.zeros(1, dtype=torch.int64),
        x=torch.ones(3, 5),
        x_halo=x_halo,
    )


def test_drop_scheme_uses_replicated_features_and_drops_the_rest():
    scheme = DropHalo()
    scheme.setup([5, 8])
    batch = _halo_batch(torch.full((1, 5), 7.0))
    scheme.after_sample(batch, 0, 1)
    assert torch.equal(batch.halo_rows[0], torch.full((1, 5), 7.0))
    assert batch.blocks[0].num_edges == 4  # layer 0 keeps its halo edges
    assert batch.blocks[1].num_edges == 1  # the edge from the halo leaf (source 2) is gone
    assert batch.blocks[1].indices.tolist() == [1]
    x = scheme.layer_input(batch, 0, batch.x, 0, 1)
    assert tuple(x.shape) == (4, 5) and torch.equal(x[3], torch.full((5,), 7.0))
    assert scheme.stats()["bytes_needed"].tolist() == [1 * (8 + 4 * 5), 1 * (8 + 4 * 8)]


def test_local_scheme_refuses_halo_leaves_it_cannot_fill():
    scheme = HaloScheme()
    scheme.setup([5, 8])
    with pytest.raises(RuntimeError, match="no source for their rows"):
        scheme.after_sample(_halo_batch(None), 0, 1)


class _RecordingComm:
    size = 2

    def __init__(self) -> None:
        self.calls: list[str] = []

    def halo_exchange(self, send_rows, send_ptr, halo_owner):
        self.calls.append("halo_exchange")
        return np.zeros((len(halo_owner), send_rows.shape[1]), dtype=np.float32)


@pytest.mark.parametrize("replicated", [True, False])
def test_evaluation_exchange_is_decided_by_the_partition_not_the_part(replicated):
    """A part without halo vertices in a partition that replicates halo features must skip
    the layer-0 exchange like every other rank (else the ranks' collectives go out of
    step); every later layer exchanges on every rank."""
    solid = _table(6, dim=3)
    features = PartFeatures(solid, np.empty((0, 3), np.float32) if replicated else None)
    comm = _RecordingComm()
    exchange = HaloExchange(
        comm,
        send_ptr=np.array([0, 0, 2]),
        send_ids=np.array([1, 4]),
        halo_owner=np.empty(0, dtype=np.int32),
        features=features,
        replicated=replicated,
    )
    table = exchange(0, features)
    assert comm.calls == ([] if replicated else ["halo_exchange"])
    assert table.num_rows == 6
    exchange(1, ArrayFeatures(solid))
    assert comm.calls[-1] == "halo_exchange"


def test_config_holds_plain_python_values():
    """numpy scalars passed in Python become Python values: the checkpoint's args load with
    ``weights_only=True`` and the JSON record serialises."""
    cfg = TrainConfig(seed=np.int64(3), layers=2, fanout=(np.int64(4), 4), lr=np.float32(0.5))
    values = cfg.as_dict()
    assert type(values["seed"]) is int and values["fanout"] == [4, 4]
    assert all(type(v) is int for v in values["fanout"]) and type(values["lr"]) is float


# ---- layout ------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_runtime_does_not_import_the_partitioner():
    """Only the commands that partition (``distmb.cli.partition`` and ``distmb.cli.launch``, above
    both) may import ``distmb.partition``; the partitioner imports no part of the training
    runtime."""
    runtime_users = []
    for path in (ROOT / "distmb").rglob("*.py"):
        rel = path.relative_to(ROOT / "distmb")
        mods = _imports(path)
        if rel.parts[0] == "partition":
            bad = {
                m
                for m in mods
                if m.split(".")[:2]
                in (["distmb", p] for p in ("engine", "halo", "loader", "train", "launch", "nn"))
            }
            assert not bad, (rel, bad)
        elif any(m == "distmb.partition" or m.startswith("distmb.partition.") for m in mods):
            runtime_users.append(str(rel))
    # The commands, and the public facade distmb/__init__.py (names imported on first use).
    assert sorted(runtime_users) == ["__init__.py", "cli/launch.py", "cli/partition.py"]
    assert not (ROOT / "partition").exists(), "the partitioner lives in distmb/partition"
