"""The device path's per-iteration budgets of ATen ops and host synchronisations, on CPU
tensors (the CI proxies of a GPU run's kernel launches and syncs; docs/cuda.md, "Launches and
host synchronisations").

One tiny run (``--sampler device --kernels torch --prefetch 0``, 3 layers, one rank): epoch
0 warms up, epoch 1 is counted by :func:`distmb.engine.op_census.census_epoch`. The budgets
are the counts measured when they were set, plus a small margin; a change that adds a host
read or a handful of ops per iteration fails here, and either pays for itself (then raise the
budget, with the reason, here and in docs/cuda.md) or goes.

Measured per iteration (2,000 vertices, fan-out 5,10,15, batch 100, 6 iterations): 3 host
reads of the sampler (one per layer), 1 of the feature cache's id check, 1 per epoch for the
loss and accuracy (1/6 per iteration); 1 wait per epoch (0.17 per iteration: the phase
timers read their CUDA events once, at the epoch's end); 6 sync-prone ops (``torch.unique``
of the CPU Fused-Map back end, 3; the feature cache's hit/miss split and miss dedup, 3); 718
ATen ops, 513 of them in the sampler (Floyd's 3 ops per step and layer: 4 + 9 + 14 steps),
430.5 not views, 408.3 that launch (neither views nor allocations). Before the cuts: 10 host
reads (2 per layer in the sampler, 2 in the feature cache, 2 in the loop: loss and
accuracy), 751 ATen ops and 3 waits per iteration (a synchronize at the end of the forward,
backward and optimizer phases), and 7 more sync-prone ops hidden in the aggregation (the
mean's ``repeat_interleave`` without ``output_size`` per layer, the backward's ``bincount``
and ``repeat_interleave`` per layer with a gradient: reads on a GPU, none on the CPU).

The GPU configuration, counted the same way on CPU tensors with the Triton back ends forced
on under the interpreter (the sampler's layer kernel and Fused-Map, the sync-free feature
gather, ``--kernels triton``; Triton launches counted one each, the interpreter's own ops
not): 200 vertices, batch 30, 2 iterations. Measured per iteration: 1 host read (the
sampler's: one per mini-batch, every layer sized by its bound) + 2 per epoch (the loss and
accuracy; the feature gather's deferred counters and range check), 0 sync-prone ops, 1 wait
per epoch, and 71 launches: 47 ATen ops that launch (neither views nor allocations:
gather 1, forward 17, backward 23, optimizer 2, the loop's loss bookkeeping 4) + 24 Triton
launches (sampler 16: 5 a layer and the tables' fill; gather 1, forward 3, backward 4).
Before the Triton relabel (five launches a sampler layer) and the layers' glue moved into
the kernels and one autograd node per layer: 231.5 (sampler 136, forward 41, backward 43);
before the one-read sampler 3 host reads per iteration. With ``--cuda-graphs`` (the step
run eagerly on the CPU and counted in its own stage, and the sampler's batches replayed
from graphs, its stand-in counted there too): 13 launches outside the graphs, replays
included (``GRAPHED_LAUNCHES_BUDGET``); 45.5 before the refill of the static buffers took
Triton kernels (L + 1 launches instead of 6 L + 1 ops), 30.5 before the step's loss and
correct count were computed in the graph, 25 before the sampler's graphs.
"""

from __future__ import annotations

import pytest
import torch

from distmb.config.train import TrainConfig
from distmb.core.host_reads import HOST_READS, host_scalar, host_values, to_host
from distmb.data.datasets import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.op_census import EpochCensus, census_epoch

GRAPH = "synthetic:nodes=2000,feat_dim=8,train_fraction=0.3,test_fraction=0.5"
FANOUT = (5, 10, 15)

#: Per-iteration budgets (measured + margin; see the module docstring).
HOST_READS_BUDGET = 4.5  # measured 4.17
DEVICE_WAITS_BUDGET = 0.2  # measured 0.17: 1 per epoch of 6 iterations (the phase timers)
SYNCING_OPS_BUDGET = 6.0  # measured 6
ATEN_OPS_BUDGET = 745.0  # measured 718
NON_VIEW_OPS_BUDGET = 450.0  # measured 430.5
#: The GPU configuration's (see the module docstring): measured + margin.
GPU_CONFIG_BUDGETS = {
    "host_reads": 2.0,  # measured 2.0: 1 per iteration + 2 per epoch of 2 iterations
    "syncing_ops": 0.0,  # measured 0
    "device_waits": 0.5,  # measured 0.5: 1 per epoch
    "launches": 80.0,  # measured 71: 47 ATen ops that launch + 24 Triton launches
}
#: ``--cuda-graphs``' launches outside the graphs, plus the replays, per iteration: measured
#: 13 (sampler 4: the seeds' and keys' copies, its replay, the blocks' copy out; gather 2,
#: the static buffers' refill 4 and the loss weight's fill 1, the copy of the step's loss
#: and correct count 1, the step's replay 1) + margin.
GRAPHED_LAUNCHES_BUDGET = 16.0


def device_path_trainer(graph: str, **config) -> Trainer:  # noqa: ANN003 - TrainConfig's
    """A one-rank Trainer of the device path on CPU tensors, its loader synchronous (the
    census needs it): 3 layers of ``FANOUT``, hidden 16, 2 epochs, ``--kernels torch``, but
    for ``config``."""
    base = dict(
        layers=len(FANOUT), fanout=FANOUT, hidden=16, epochs=2, progress=False,
        sampler="device", kernels="torch", prefetch=0, threads=1,
    )  # fmt: skip
    local = LocalGraph.from_graph(load_dataset(graph))
    return Trainer(
        local, TrainConfig(**{**base, **config}), log=lambda _: None, device=torch.device("cpu")
    )


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    trainer = device_path_trainer(GRAPH, batch_size=100, device_cache_mb=0.05)
    trainer.train_epoch(0)  # warm-up: caches filled, buffers sized
    return trainer


@pytest.fixture(scope="module")
def census(trainer: Trainer) -> EpochCensus:
    return census_epoch(trainer, 1)


def over_budget(per_iteration: dict) -> list[str]:
    """The counts above their budgets, as ``name value > budget``."""
    budgets = {
        "host_reads": HOST_READS_BUDGET,
        "device_waits": DEVICE_WAITS_BUDGET,
        "syncing_ops": SYNCING_OPS_BUDGET,
        "aten_ops": ATEN_OPS_BUDGET,
        "non_view_ops": NON_VIEW_OPS_BUDGET,
    }
    return [
        f"{name} {per_iteration[name]} > {budget}"
        for name, budget in budgets.items()
        if per_iteration[name] > budget
    ]


def test_device_path_iteration_stays_within_its_budgets(census):
    per_iteration = census.per_iteration()
    assert census.iterations == 6
    assert not over_budget(per_iteration), per_iteration
    assert census.aten_ops["sample"] > 0 and census.aten_ops["forward"] > 0
    assert census.aten_ops["backward"] > 0 and census.aten_ops["optimizer"] > 0


def test_an_extra_read_per_iteration_is_caught(trainer, monkeypatch):
    """A ``.item()`` per forward (hidden in the model) shows as a sync-prone op and pushes the
    count over its budget: the census sees what the budgets guard."""
    forward = trainer.forward

    def forward_with_a_read(batch, step, num_steps):  # noqa: ANN001, ANN202
        logits = forward(batch, step, num_steps)
        logits.sum().item()
        return logits

    monkeypatch.setattr(trainer, "forward", forward_with_a_read)
    census = census_epoch(trainer, 1)
    per_iteration = census.per_iteration()
    assert census.syncing_ops["forward"] == census.iterations
    assert "syncing_ops" in " ".join(over_budget(per_iteration))


def test_the_sampler_reads_the_host_once_per_layer(trainer):
    """An independent count: one mini-batch sampled directly, the counter's difference."""
    sampler = trainer.parts.device_stages.sampler
    seeds = trainer.local.train_idx[:50]
    before, _ = HOST_READS.snapshot()
    blocks = sampler.sample(seeds, epoch=3, iteration=1)
    after, _ = HOST_READS.snapshot()
    assert len(blocks) == len(FANOUT)
    assert after - before == len(FANOUT)


def test_every_helper_counts_one_read():
    t = torch.arange(4)
    before, waits = HOST_READS.snapshot()
    assert to_host(t) is t  # a CPU tensor is not copied
    assert host_values(t) == [0, 1, 2, 3]
    assert host_scalar(t[2]) == 2
    assert HOST_READS.snapshot() == (before + 3, waits)


#: The GPU configuration's graph: two batches of 30 an epoch. Small, because the padded
#: blocks of ``--cuda-graphs`` reach its vertex count and the interpreter pays for every row
#: (the counts are those of a graph twice its size).
GPU_GRAPH = "synthetic:nodes=200,feat_dim=4,train_fraction=0.3,test_fraction=0.4"


def gpu_config(graph: str = GPU_GRAPH, **config) -> Trainer:  # noqa: ANN003 - TrainConfig's
    """The GPU configuration's Trainer on ``graph``, on CPU tensors (the Triton back ends
    forced on under the interpreter), ``config`` added, after its warm-up epoch."""
    from distmb.engine.build import device_stages
    from distmb.pipeline.sample import idmap_triton

    if not idmap_triton.usable(torch.device("cpu"))[0]:
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1, set by conftest)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(device_stages, "kernel_backend", lambda device: "triton")
        trainer = device_path_trainer(
            graph, batch_size=30, kernels="triton", device_cache_mb=0.002, **config
        )
    stages = trainer.parts.device_stages
    assert stages.sampler.choose == "triton" and stages.features.backend == "triton"
    trainer.train_epoch(0)
    return trainer


@pytest.fixture(scope="module")
def gpu_config_trainer() -> Trainer:
    return gpu_config()


@pytest.fixture(scope="module")
def gpu_config_census(gpu_config_trainer: Trainer) -> EpochCensus:
    return census_epoch(gpu_config_trainer, 1)


def test_the_gpu_configuration_stays_within_its_budgets(gpu_config_census):
    each = gpu_config_census.per_iteration()
    assert gpu_config_census.iterations == 2
    measured = {
        "host_reads": each["host_reads"],
        "syncing_ops": each["syncing_ops"],
        "device_waits": each["device_waits"],
        "launches": each["launches"],
    }
    over = {k: v for k, v in measured.items() if v > GPU_CONFIG_BUDGETS[k]}
    assert not over, (over, each)
    # Every stage that has a Triton kernel launched it: the back ends really were on.
    launches = each["triton_launches_by_stage"]
    # 5 a layer (layer kernel, insert, count, scan, relabel) + 1 a batch (the tables' fill).
    assert launches["sample"] == 5 * len(FANOUT) + 1
    assert launches["gather"] == 1 and launches["forward"] >= len(FANOUT)


def test_the_gpu_configuration_samples_a_batch_with_one_read(gpu_config_trainer):
    """An independent count: one mini-batch of all its layers, one host read."""
    sampler = gpu_config_trainer.parts.device_stages.sampler
    seeds = torch.as_tensor(gpu_config_trainer.local.train_idx[:30])
    assert sampler.reads_once(sampler.fanouts, len(seeds))
    before, _ = HOST_READS.snapshot()
    blocks = sampler.sample(seeds, epoch=3, iteration=1)
    assert HOST_READS.snapshot()[0] - before == 1
    assert len(blocks) == len(FANOUT) and blocks[-1].n_dst == len(seeds)


@pytest.mark.parametrize("model", ["sage", "gcn", "gat", "gin"])
def test_forward_and_backward_make_no_hidden_sync(model):
    """No op of a model's forward or backward on the device path would read a size back on a
    GPU (``bincount``, ``repeat_interleave`` without ``output_size``, a boolean mask ...),
    even where the CPU runs it without a wait."""
    graph = "synthetic:nodes=500,feat_dim=4,train_fraction=0.3,test_fraction=0.5"
    trainer = device_path_trainer(
        graph, layers=2, fanout=(4, 6), hidden=8, batch_size=60, epochs=1, model=model
    )
    census = census_epoch(trainer, 0)
    assert census.aten_ops["forward"] > 0 and census.aten_ops["backward"] > 0
    assert census.syncing_ops["forward"] == census.syncing_ops["backward"] == 0, census


@pytest.mark.parametrize(
    ("call", "syncs"),
    [
        (lambda t: torch.repeat_interleave(t, t), True),
        (lambda t: torch.repeat_interleave(t, t, output_size=6), False),
        (lambda t: torch.bincount(t), True),
        (lambda t: t[t > 1], True),
        (lambda t: t[torch.tensor([0, 2])], False),
        (lambda t: t.sum(), False),
        (lambda t: t.sum().item(), True),
    ],
)
def test_the_census_flags_what_would_sync_on_a_gpu(call, syncs):
    """Hand-picked calls: those that read a size or a value back on a GPU are sync-prone,
    whatever the CPU does with them."""
    from distmb.engine.op_census import _OpCounter

    counter = _OpCounter()
    with counter:
        call(torch.tensor([1, 2, 3]))
    assert (sum(counter.syncing.values()) > 0) == syncs, dict(counter.by_name)


def test_allocations_and_views_are_not_launches():
    """The launch proxy's rule on hand-picked calls: an allocation without a fill and a view
    launch nothing on a GPU; a fill, a copy and arithmetic launch one kernel each."""
    from distmb.engine.op_census import LAUNCH_FREE_OPS, _OpCounter

    counter = _OpCounter()
    with counter:
        a = torch.empty(4)
        b = torch.empty_like(a)
        a.view(2, 2)
        torch.zeros(4)
        b.copy_(a.fill_(1.0))
        a + b
    free, views = sum(counter.launch_free.values()), sum(counter.views.values())
    launching = sum(counter.ops.values()) - free - views
    assert (free, views, launching) == (2, 1, 4), dict(counter.by_name)
    assert "aten.empty" in LAUNCH_FREE_OPS and "aten.zeros" not in LAUNCH_FREE_OPS


def test_the_graphed_configuration_launches_little_outside_its_graph():
    """``--cuda-graphs`` (run eagerly on the CPU, its step counted in the ``graph`` stage):
    what a GPU launches per iteration is the sampler, the gather, the static buffers' refill,
    the bookkeeping and one replay; nothing runs in the backward or optimizer phases, and the
    reads stay those of the eager configuration."""
    census = census_epoch(gpu_config(cuda_graphs=True), 1)
    each = census.per_iteration()
    assert census.graph_steps == census.iterations == 2
    assert census.sampler_replays == 2  # every batch of epoch 1 (its shape seen in epoch 0)
    assert each["launches_graphed"] <= GRAPHED_LAUNCHES_BUDGET, each
    assert each["launches_graphed"] < each["launches"] - 20  # the graph holds the model's
    by_stage = each["launch_ops_by_stage"]
    assert by_stage["graph"] > 0 and by_stage["backward"] == by_stage["optimizer"] == 0
    assert each["syncing_ops"] == 0 and each["host_reads"] == GPU_CONFIG_BUDGETS["host_reads"]
