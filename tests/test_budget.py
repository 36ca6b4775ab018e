"""The memory estimate of a run (distmb/engine/budget.py): its sampling bounds hold on real
sampled blocks of a power-law graph, and flags that ask for more memory than the machine has
are one-line errors naming them."""

from __future__ import annotations

import numpy as np
import pytest

import distmb.core.machine as machine
from distmb.config.train import TrainConfig
from distmb.core.errors import InputError
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.budget import GraphShape, check_memory, estimate_memory, sampled_sizes
from distmb.pipeline.sample.host import NeighborSampler

#: Hubs: a small exponent makes a few vertices of very high degree.
POWER_LAW = "synthetic:nodes=3000,avg_degree=12,feat_dim=16,classes=4,power_law_exponent=2.1"


@pytest.fixture(scope="module")
def local() -> LocalGraph:
    return LocalGraph.from_graph(load_dataset(POWER_LAW))


@pytest.mark.parametrize("fanout", [(3, 5), (10, 25), (-1, 4), (2, 2, 2)])
@pytest.mark.parametrize("batch", [1, 64, 5000])
def test_sampled_sizes_bound_real_blocks(local, fanout, batch):
    shape = GraphShape.of(local)
    assert shape.max_in_degree == int(np.diff(local.indptr).max())
    sampler = NeighborSampler(local.indptr, local.indices, local.n_solid, local.n_local, fanout, 0)
    train = np.asarray(local.train_idx)
    bound = sampled_sizes(min(batch, train.size), fanout, local.n_local, shape.max_in_degree)
    for it in range(3):
        seeds = np.random.default_rng(it).permutation(train)[:batch]
        blocks = sampler.sample(seeds, 0, it)
        for block, (n_dst, edges, n_src) in zip(blocks, bound, strict=True):
            assert block.n_dst <= n_dst and block.num_edges <= edges and block.n_src <= n_src


def test_estimate_grows_with_each_flag(local):
    shape = GraphShape.of(local)
    base = TrainConfig(layers=2, fanout=(4, 4), hidden=16, batch_size=10, prefetch=1)

    def total(**changes):
        cfg = TrainConfig(**{**base.as_dict(), **changes})
        return sum(item.nbytes for item in estimate_memory(cfg, shape, 1))

    assert total(prefetch=8) > total()
    assert total(hidden=64) > total()
    assert total(batch_size=100) > total()
    assert total(features="memory") > total()
    # more batches ahead than an epoch has are never made
    steps = -(-shape.n_train // 10)
    assert total(prefetch=steps) == total(prefetch=10 * steps)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"prefetch": 500, "batch_size": 1}, "--prefetch 500"),
        ({"hidden": 4096}, "--hidden 4096"),
        ({"batch_size": 10**9, "fanout": (-1, -1)}, "--batch-size 1000000000 --fanout -1,-1"),
    ],
)
def test_a_run_too_large_names_its_flags(local, monkeypatch, changes, named):
    cfg = TrainConfig(**{**TrainConfig(layers=2, fanout=(4, 4)).as_dict(), **changes})
    shape = GraphShape.of(local)
    items = estimate_memory(cfg, shape, 1)
    need = sum(item.nbytes for item in items)
    largest = max(items, key=lambda item: item.nbytes)
    monkeypatch.setattr(machine, "physical_memory_bytes", lambda: need - 1)
    with pytest.raises(InputError, match="this run needs about") as info:
        check_memory(cfg, shape, 1)
    message = str(info.value)
    assert named in message and largest.what in message and "\n" not in message
    monkeypatch.setattr(machine, "physical_memory_bytes", lambda: need)
    check_memory(cfg, shape, 1)  # fits exactly
    monkeypatch.setattr(machine, "physical_memory_bytes", lambda: None)
    check_memory(cfg, shape, 1)  # unknown size: no check


def test_trainer_refuses_before_allocating(local, monkeypatch):
    monkeypatch.setattr(machine, "physical_memory_bytes", lambda: 10**6)
    cfg = TrainConfig(layers=2, fanout=(4, 4), hidden=16, progress=False)
    with pytest.raises(InputError, match="this run needs about"):
        Trainer(local, cfg, log=lambda _: None)


def test_hec_items_on_several_ranks(local):
    shape = GraphShape(
        n_solid=1000, n_local=1500, n_train=500, feat_dim=16, num_classes=4,
        max_in_degree=50, n_send=300,
    )  # fmt: skip
    cfg = TrainConfig(layers=3, fanout=(2, 2, 2), hidden=8, hec_delay=10**9, hec_size=10**12)
    items = {item.flags: item for item in estimate_memory(cfg, shape, 4)}
    cache = items[("--hec-size",)]
    assert cache.nbytes == 500 * (8 + 8) * 4  # clamped to the 500 halo vertices, layers 1, 2
    pushes = items[("--hec-nc", "--hec-delay")]
    steps = 1  # 500 training vertices, batch 1000
    assert pushes.nbytes == 2 * (steps + 1) * 300 * (10 + 10) * 4
