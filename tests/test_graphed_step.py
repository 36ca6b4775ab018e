"""``--cuda-graphs``: the graphed training step (distmb.engine.graphed_step).

On the CPU the static padded step runs eagerly: it trains like the normal path (the same
blocks, the same losses up to float reassociation without dropout), deterministically, with
no host read of its own. The capture itself, the replay count and the absence of host syncs
in steady-state steps need a GPU (``@pytest.mark.cuda``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import held_elsewhere
from test_device_path_budget import device_path_trainer

from distmb.config.train import TrainConfig, cuda_graphs_problem
from distmb.core.errors import InputError
from distmb.core.graph_lock import GRAPH_LOCK
from distmb.engine import Trainer, graphed_step
from distmb.engine.graphed_step import WARMUP_STEPS, GraphedStep
from distmb.engine.op_census import census_epoch
from distmb.engine.precision import MixedPrecision
from distmb.pipeline.sample import padded

#: 160 training vertices in batches of 30: 6 iterations, 4 of 27 seeds and 2 of 26 (two
#: sizes).
GRAPH = "synthetic:nodes=400,feat_dim=8,classes=3,train_fraction=0.4,test_fraction=0.3"
SMALL_RUN = dict(
    layers=2, fanout=(4, 3), hidden=16, batch_size=30, lr=0.01, device_cache_mb=0.002
)  # fmt: skip


def losses_of(trainer: Trainer, epochs: int) -> list[dict]:
    return [trainer.train_epoch(epoch) for epoch in range(epochs)]


@pytest.mark.parametrize("model", ["sage", "gcn", "gin", "gat"])
def test_the_static_path_trains_like_the_normal_path(model):
    """Without dropout both paths see the same blocks and compute the same step: the epoch
    losses agree to float reassociation (the padded matrix products have more rows), over
    several Adam steps."""
    eager = device_path_trainer(GRAPH, **SMALL_RUN, dropout=0.0, model=model)
    static = device_path_trainer(GRAPH, **SMALL_RUN, dropout=0.0, model=model, cuda_graphs=True)
    assert static.graphed is not None and not static.graphed.graphs  # eager on the CPU
    got, expected = losses_of(static, 3), losses_of(eager, 3)
    for g, e in zip(got, expected, strict=True):
        assert g["iterations"] == e["iterations"] == 6
        assert math.isclose(g["loss"], e["loss"], rel_tol=1e-4), (g["loss"], e["loss"])
        assert abs(g["train_acc"] - e["train_acc"]) <= 2 / 160
    layouts = static.graphed.layouts()
    assert sorted(layouts) == [26, 27]  # static buffers per batch size
    # Each size's layout fitted to its first batch, which its other batches fit too.
    assert all(len(fitted) == 1 for fitted in layouts.values()), layouts
    assert static.graphed.replays == static.graphed.captures == 0
    for (name, p), q in zip(static.model.named_parameters(), eager.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-5, msg=name)


def test_batches_beyond_a_fitted_layout_get_another_then_the_bounds(monkeypatch):
    """Without headroom a fitted layout holds its own batch and those no bigger in any
    layer. With one fitted layout allowed, each batch size gets it, then the bounds' layout
    for the first batch beyond it, which every later batch fits (these seeds make one such
    batch of each size in two epochs); the losses stay the eager path's."""
    monkeypatch.setattr(padded, "FIT_HEADROOM", 0.0)
    monkeypatch.setattr(padded, "FIT_SPREADS", 0.0)
    monkeypatch.setattr(graphed_step, "MAX_FITTED_LAYOUTS", 1)
    static = device_path_trainer(GRAPH, **SMALL_RUN, dropout=0.0, cuda_graphs=True)
    eager = device_path_trainer(GRAPH, **SMALL_RUN, dropout=0.0)
    got, expected = losses_of(static, 2), losses_of(eager, 2)
    for g, e in zip(got, expected, strict=True):
        assert math.isclose(g["loss"], e["loss"], rel_tol=1e-4), (g["loss"], e["loss"])
    assert static.graphed is not None
    for n_seeds, layouts in static.graphed.layouts().items():
        bounds = padded.padded_layout(n_seeds, SMALL_RUN["fanout"], static.local.n_solid)
        assert len(layouts) == 2 and layouts[-1] == bounds, (n_seeds, layouts)
        assert all(sum(f.edges) <= sum(bounds.edges) for f in layouts[:-1])
        assert all(f.input_rows < bounds.input_rows for f in layouts[:-1])


def test_with_dropout_it_learns_and_is_deterministic():
    """With dropout the masks differ (padded rows draw too): the losses are close, not equal;
    two static runs are identical."""
    first, second = (
        losses_of(device_path_trainer(GRAPH, **SMALL_RUN, dropout=0.5, cuda_graphs=True), 4)
        for _ in range(2)
    )  # each built, then trained: torch's generator is the process's
    eager = losses_of(device_path_trainer(GRAPH, **SMALL_RUN, dropout=0.5), 4)
    assert [r["loss"] for r in first] == [r["loss"] for r in second]
    assert [r["train_acc"] for r in first] == [r["train_acc"] for r in second]
    assert first[-1]["loss"] < first[0]["loss"] - 0.05  # it learns
    for g, e in zip(first, eager, strict=True):
        assert math.isclose(g["loss"], e["loss"], rel_tol=0.1), (g["loss"], e["loss"])
        assert abs(g["train_acc"] - e["train_acc"]) < 0.15
    # The record keeps its fields: the whole step is the forward phase.
    assert first[0]["fwd"] > 0 and first[0]["bwd"] == first[0]["opt"] == 0


def test_the_static_step_reads_nothing_back():
    """The census of a static epoch: no sync-prone op in the step (the padding is sized by
    host ints), the same host reads per epoch as the normal path, and outside the graph the
    refill's launches as ``PaddedBatch.launches`` counts them, and after the step only the
    copy of its row of loss and correct count (the count is taken in the step)."""
    static = device_path_trainer(GRAPH, **SMALL_RUN, cuda_graphs=True)
    eager = device_path_trainer(GRAPH, **SMALL_RUN)
    static.train_epoch(0)
    eager.train_epoch(0)
    got, expected = census_epoch(static, 1), census_epoch(eager, 1)
    assert got.syncing_ops["forward"] == 0
    assert got.host_reads == expected.host_reads
    assert got.device_waits == expected.device_waits
    assert got.aten_ops["backward"] == got.aten_ops["optimizer"] == 0  # all in the replay
    # Outside the step's graph (the census's forward stage): the refill and the loss weight.
    assert static.graphed is not None
    (refill,) = {
        size.padded.launches() for sizes in static.graphed._sizes.values() for size in sizes
    }
    forward = got.launch_ops()["forward"] + got.triton_launches.get("forward", 0)
    assert forward == (refill + 1) * got.iterations
    assert got.launch_ops()["other"] == got.iterations  # no launch for the epoch's end


def test_the_step_counts_its_loss_and_correct_predictions():
    """The step's row (loss and correct count, computed in the step) equals what torch ops
    make of its logits and the batch's labels, bit for bit: the graphed records are the
    records the eager loop would write from the same logits."""
    trainer = device_path_trainer(GRAPH, **SMALL_RUN, cuda_graphs=True)
    assert_rows_match_the_logits(trainer, epoch=0)


def assert_rows_match_the_logits(trainer: Trainer, epoch: int) -> None:
    """Every step of ``trainer``'s epoch ``epoch``, run by its graphed step: the step's row
    equals the cross-entropy and the correct count of its returned logits."""
    from distmb.engine.epoch_loss import CORRECT, LOSS

    assert trainer.graphed is not None
    plan = trainer.loader.plan(epoch, trainer.epoch_batches(epoch))
    for index, batch in enumerate(trainer.loader(plan)):
        out = trainer.graphed.step(batch, index, len(plan), 0.01)
        assert out.values.dtype == torch.float64 and out.values.shape == (2,)
        loss = F.cross_entropy(out.logits, batch.labels, reduction="sum")
        assert out.values[LOSS].item() == loss.item()
        correct = int((out.logits.argmax(1) == batch.labels).sum())
        assert out.values[CORRECT].item() == correct


def test_the_optimizer_state_survives_a_resume(tmp_path):
    """A checkpoint of the static path resumes into it (the optimizer's state is loaded
    before any step) and continues as the uninterrupted run."""
    run = dict(SMALL_RUN, dropout=0.0, cuda_graphs=True, checkpoint_dir=str(tmp_path))
    whole = device_path_trainer(GRAPH, **run, epochs=3, overwrite_checkpoint=True)
    expected = [r["loss"] for r in whole.fit()]
    first = device_path_trainer(GRAPH, **run, epochs=1, overwrite_checkpoint=True)
    first.fit()
    resumed = device_path_trainer(GRAPH, **run, epochs=3, resume=True)
    assert resumed.start_epoch == 1
    got = [r["loss"] for r in resumed.fit()]
    assert got == expected[1:]


def test_a_resume_takes_this_runs_capturable(tmp_path):
    """The optimizer's ``capturable`` is this run's (True with --cuda-graphs on a GPU), not the
    checkpoint's: here a graphed GPU run's checkpoint resumed by a plain run (the other way,
    a graph capture would refuse the checkpoint's False)."""
    from distmb.engine.checkpoint import CHECKPOINT_FILE, save_checkpoint

    run = dict(SMALL_RUN, checkpoint_dir=str(tmp_path))
    device_path_trainer(GRAPH, **run, epochs=1, overwrite_checkpoint=True).fit()
    path = tmp_path / CHECKPOINT_FILE
    state = torch.load(path, weights_only=True)
    for group in state["optimizer"]["param_groups"]:
        group["capturable"] = True  # as a graphed GPU run saves it
    save_checkpoint(tmp_path, state)
    resumed = device_path_trainer(GRAPH, **run, epochs=2, resume=True)
    assert not any(group["capturable"] for group in resumed.optimizer.param_groups)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(cuda_graphs=True), "--cuda-graphs applies only to the GPU path"),
        (dict(cuda_graphs=True, sampler="device", model="gcn", layers=2, fanout=(-1, 4)),
         "a layer of all neighbours"),
        (dict(cuda_graphs=True, device="cuda", sampler="cpp"), "not cpp"),
        (dict(cuda_graphs=True, device="cuda", precision="fp16"), "gradient scaler"),
        (dict(cuda_graphs=True, sampler="device", model="my.models:Net"), "built-in models"),
    ],
)  # fmt: skip
def test_the_flag_refuses_what_it_cannot_run(config, message):
    with pytest.raises(InputError, match=message):
        TrainConfig(**config)


def built_step(config: TrainConfig, **kwargs) -> GraphedStep:  # noqa: ANN003 - GraphedStep's
    """A GraphedStep over a stand-in model on the CPU, with ``config``'s options."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    precision = MixedPrecision("fp32", "torch", torch.device("cpu"))
    cpu = torch.device("cpu")
    return GraphedStep(optimizer, lambda *_: None, precision, cpu, config, 10, **kwargs)


def test_the_step_refuses_several_ranks_and_user_models():
    config = TrainConfig(layers=2, fanout=(2, 2))
    built_step(config)
    with pytest.raises(InputError, match="--cuda-graphs: one rank only, this run has 2"):
        built_step(config, num_ranks=2)
    with pytest.raises(InputError, match="--cuda-graphs: the built-in models only"):
        built_step(config, built_in=False)
    with pytest.raises(InputError, match="--cuda-graphs: needs the device path"):
        built_step(config, device_path=False)


@pytest.mark.parametrize(
    "options",
    [
        dict(device="cuda", precision="fp16"),
        dict(device="cuda", sampler="cpp"),
        dict(sampler="device", layers=2, fanout=(-1, 4)),
        dict(sampler="device", model="my.models:Net"),
    ],
)
def test_the_step_refuses_the_options_the_flag_refuses_alike(options):
    """One set of rules for the options (``cuda_graphs_problem``): a config valid without
    the flag (a Trainer's, built in code) is refused by the step with the message the flag
    gets."""
    config = TrainConfig(**options)
    with pytest.raises(InputError) as flag:
        TrainConfig(**options, cuda_graphs=True)
    with pytest.raises(InputError) as step:
        built_step(config)
    assert str(step.value) == str(flag.value) == cuda_graphs_problem(config)
    assert str(flag.value).startswith("--cuda-graphs")


def test_a_trainer_refuses_a_user_model_with_the_flag():
    """A user's model (here a subclass of a built-in, whose forward may differ) is refused;
    a built-in's instance passed by the caller is taken."""
    from distmb.data.datasets import load_dataset
    from distmb.data.local import LocalGraph
    from distmb.nn.models import GraphSAGE

    class MySage(GraphSAGE):
        pass

    local = LocalGraph.from_graph(load_dataset(GRAPH))
    config = TrainConfig(
        **SMALL_RUN, sampler="device", prefetch=0, progress=False, cuda_graphs=True
    )
    cpu = torch.device("cpu")
    with pytest.raises(InputError, match="the built-in models only"):
        Trainer(local, config, model=MySage(8, 16, 3, 2), log=lambda _: None, device=cpu)
    trainer = Trainer(local, config, model=GraphSAGE(8, 16, 3, 2), log=lambda _: None, device=cpu)
    assert trainer.graphed is not None


# -- on a GPU --------------------------------------------------------------------------------
def gpu_trainer(**config) -> Trainer:  # noqa: ANN003 - TrainConfig's
    from distmb.data.datasets import load_dataset
    from distmb.data.local import LocalGraph

    base = dict(
        SMALL_RUN, epochs=8, progress=False, sampler="device", kernels="triton", prefetch=0,
        device="cuda", dropout=0.0,
    )  # fmt: skip
    local = LocalGraph.from_graph(load_dataset(GRAPH))
    return Trainer(local, TrainConfig(**{**base, **config}), log=lambda _: None)


@pytest.mark.cuda
@pytest.mark.parametrize("kernels", ["triton", "torch"])  # torch: cuSPARSE's CSR product
def test_cuda_graphs_train_like_the_eager_path_with_one_replay_per_step(monkeypatch, kernels):
    """On a GPU: the losses of the graphed run are close to the eager run's; after the
    warm-up every step is one replay, one capture per batch size; the steady-state steps make
    no host synchronisation (``torch.cuda.set_sync_debug_mode("error")``)."""
    eager = gpu_trainer(kernels=kernels)
    graphed = gpu_trainer(kernels=kernels, cuda_graphs=True)
    step = graphed.graphed
    assert step is not None and step.graphs
    assert all(g["capturable"] for g in graphed.optimizer.param_groups)
    original = GraphedStep.step

    def checked(self, batch, *args):  # noqa: ANN001, ANN202
        sizes = self._sizes.get(batch.blocks[-1].n_dst, [])
        fits = [size for size in sizes if size.padded.layout.fits(batch.blocks)]
        steady = bool(fits) and fits[0].graph is not None
        if steady:
            torch.cuda.set_sync_debug_mode("error")
        try:
            return original(self, batch, *args)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(GraphedStep, "step", checked)
    expected = [r["loss"] for r in losses_of(eager, 6)]
    got, replays = [], []
    for epoch in range(6):
        before = step.replays
        got.append(graphed.train_epoch(epoch)["loss"])
        replays.append(step.replays - before)
    # Two sizes (4 batches of 27, 2 of 26 an epoch): WARMUP_STEPS eager steps each, then
    # every step replays (the first of each size after its capture).
    assert step.captures == 2
    assert sum(replays) == 6 * 6 - 2 * WARMUP_STEPS
    assert replays[-1] == 6  # one replay per step
    for g, e in zip(got, expected, strict=True):
        assert math.isclose(g, e, rel_tol=1e-3), (got, expected)


@pytest.mark.cuda
def test_a_new_learning_rate_recaptures():
    """``--lr-schedule step`` changes the lr, baked into the graphs, every epoch: every graph
    is recaptured at its next step, and the run follows the eager one (a stale lr, 10 times
    the new one, would not)."""
    schedule = dict(lr_schedule="step", lr_step_size=1, lr_gamma=0.1, epochs=4)
    expected = [r["loss"] for r in gpu_trainer(**schedule).fit()]
    graphed = gpu_trainer(**schedule, cuda_graphs=True)
    got = [r["loss"] for r in graphed.fit()]
    assert graphed.graphed is not None
    # Epoch 0: size 27 captured at its 4th batch; then both sizes at every new lr (size 26
    # after its third eager step in epoch 1).
    assert graphed.graphed.captures == 1 + 2 + 2 + 2
    for g, e in zip(got, expected, strict=True):
        assert math.isclose(g, e, rel_tol=1e-3), (got, expected)


@pytest.mark.cuda
def test_replays_draw_fresh_dropout_masks():
    """The same batch replayed twice from the same parameters and optimizer state: with
    dropout the logits differ (the generator advanced), without they agree."""
    spread = {}
    for dropout in (0.0, 0.5):
        trainer = gpu_trainer(cuda_graphs=True, dropout=dropout)
        for epoch in range(2):  # 8 batches of 27 seeds, 4 of 26: warmed up and captured
            trainer.train_epoch(epoch)
        step = trainer.graphed
        assert step is not None and step.captures == 2
        plan = trainer.loader.plan(2, trainer.epoch_batches(2))
        batch = next(iter(trainer.loader(plan)))
        saved = _state_tensors(trainer)
        copies = [t.clone() for t in saved]
        first = step.step(batch, 0, 1, 0.01).logits.clone()
        with torch.no_grad():
            for t, c in zip(saved, copies, strict=True):
                t.copy_(c)
        second = step.step(batch, 0, 1, 0.01).logits.clone()
        spread[dropout] = (first - second).abs().max().item()
    assert spread[0.0] < 1e-5 and spread[0.5] > 1e-3, spread


@pytest.mark.cuda
def test_a_replay_counts_its_loss_and_correct_predictions():
    """On a GPU, from replays: the row the graph writes (loss and correct count) equals what
    torch ops make of the logits it wrote."""
    trainer = gpu_trainer(cuda_graphs=True)
    for epoch in range(2):  # 8 batches of 27 seeds, 4 of 26: warmed up and captured
        trainer.train_epoch(epoch)
    step = trainer.graphed
    assert step is not None and step.captures == 2
    before = step.replays
    assert_rows_match_the_logits(trainer, epoch=2)
    assert step.replays - before == 6  # every step a replay


def _state_tensors(trainer: Trainer) -> list[torch.Tensor]:
    """The parameters and every optimizer state tensor (what a step changes)."""
    state = [t for s in trainer.optimizer.state.values() for t in s.values()]
    return [*trainer.model.parameters(), *(t for t in state if isinstance(t, torch.Tensor))]


def test_the_step_holds_the_graph_lock(monkeypatch):
    """The step (its eager runs, captures and replays, which use the CUDA generator) holds
    ``GRAPH_LOCK``, so the loader thread's sampler captures and replays never overlap it;
    the refill of the static buffers does not need it."""
    trainer = device_path_trainer(GRAPH, **SMALL_RUN, cuda_graphs=True)
    assert trainer.graphed is not None
    held: list[bool] = []

    step = trainer.graphed._step
    monkeypatch.setattr(
        trainer.graphed, "_step", lambda *a: held.append(held_elsewhere(GRAPH_LOCK)) or step(*a)
    )
    trainer.train_epoch(0)
    assert held == [True] * 6


@pytest.mark.cuda
def test_graphs_with_the_loader_thread_prefetching():
    """``--cuda-graphs --prefetch 2`` with dropout: the loader's thread captures and replays
    the sampler's graphs while the training thread draws dropout masks and captures and
    replays its steps; several epochs train with the sampler's and the step's graphs
    replayed (an H200 run failed here on PyTorch's generator before ``GRAPH_LOCK``)."""
    trainer = gpu_trainer(prefetch=2, dropout=0.5, epochs=4)
    records = [trainer.train_epoch(epoch) for epoch in range(4)]
    assert all(math.isfinite(r["loss"]) for r in records)
    sampler_graphs = trainer.parts.device_stages.sampler.graphs
    assert sampler_graphs is not None and sampler_graphs.captures == 2
    assert sampler_graphs.replays >= 4 * 6 - 4
    assert trainer.graphed.captures >= 2 and trainer.graphed.replays > 0
