"""``--kernels auto`` (the default): resolved once per run on the training device, to the
Triton kernels on a CUDA device where Triton is installed and to the fused C++ kernels
everywhere else (the CPU above all, even where Triton's interpreter could run them); what
a run, a resume and a prediction then use."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import require_triton

from distmb.config.train import TrainConfig
from distmb.core.errors import InputError
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.checkpoint import CHECKPOINT_FILE, read_checkpoint, save_checkpoint
from distmb.engine.device import check_kernels
from distmb.engine.evaluate import layerwise_inference
from distmb.engine.predict import predict
from distmb.nn import sage
from distmb.nn.kernels.dispatch import KERNELS, get_kernels, resolve_kernels
from distmb.pipeline.sample import idmap_triton

GRAPH = "synthetic:nodes=300,avg_degree=6,feat_dim=8,classes=3"
#: A tiny run: one rank, two layers, three batches an epoch, no thread beside the loop.
TINY = dict(
    layers=2, fanout=(3, 3), hidden=8, batch_size=12, epochs=1, eval_every=10**9,
    progress=False, prefetch=0, threads=1,
)  # fmt: skip
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture(scope="module")
def local() -> LocalGraph:
    return LocalGraph.from_graph(load_dataset(GRAPH))


@pytest.fixture
def no_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if Triton were not installed (what ``usable`` reads)."""
    monkeypatch.setattr(idmap_triton, "triton", None)


@pytest.fixture
def fused_layers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the SAGE layers' calls of their fused C++ path (run for real)."""
    calls: list[int] = []
    forward_fused = sage.SAGEConv._forward_fused

    def spy(self, block, x_src):  # noqa: ANN001, ANN202 - the wrapped method's arguments
        calls.append(block.n_dst)
        return forward_fused(self, block, x_src)

    monkeypatch.setattr(sage.SAGEConv, "_forward_fused", spy)
    return calls


# ---- the resolver ------------------------------------------------------------------------


def test_auto_is_fused_on_the_cpu_even_where_triton_could_run_interpreted():
    assert idmap_triton.usable(CPU)[0]  # the tests' interpreter: Triton runs on CPU tensors
    assert resolve_kernels("auto", CPU) == "fused"


def test_auto_is_triton_on_a_cuda_device_where_triton_is_installed():
    require_triton("cuda")  # Triton installed (no GPU needed to ask)
    assert resolve_kernels("auto", CUDA) == "triton"
    assert resolve_kernels("auto", torch.device("cuda", 1)) == "triton"


def test_auto_is_fused_on_a_cuda_device_without_triton(no_triton):
    assert not idmap_triton.usable(CUDA)[0]
    assert resolve_kernels("auto", CUDA) == "fused"


@pytest.mark.parametrize("name", KERNELS)
def test_a_named_implementation_is_kept_on_every_device(name):
    assert resolve_kernels(name, CPU) == resolve_kernels(name, CUDA) == name


def test_unknown_kernels_are_refused():
    with pytest.raises(ValueError, match="unknown kernels 'cuda'; expected one of auto, fused"):
        resolve_kernels("cuda", CPU)


# ---- the options -------------------------------------------------------------------------


def test_compile_with_the_default_on_the_cpu_is_refused_naming_the_flags():
    message = (
        r"--compile with --kernels auto, which is --kernels fused on the CPU: the Triton "
        r"layers only .*add --kernels triton"
    )
    with pytest.raises(InputError, match=message):
        TrainConfig(compile=True, sampler="device")
    TrainConfig(compile=True, sampler="device", kernels="triton")  # the way out


def test_compile_with_the_default_is_checked_once_the_device_is_known(no_triton):
    """``--device auto``: the options cannot tell; the device check can (and is the one
    ``training_device`` runs, on every rank, before anything is built)."""
    config = TrainConfig(compile=True, device="auto")
    with pytest.raises(InputError, match="--kernels auto, which is --kernels fused on the CPU"):
        check_kernels(config, CPU)
    with pytest.raises(InputError, match="--kernels auto, which is --kernels fused on cuda:0"):
        check_kernels(config, torch.device("cuda", 0))


def test_compile_with_the_default_on_a_gpu_with_triton_is_accepted():
    require_triton("cuda")
    TrainConfig(compile=True, device="cuda")
    check_kernels(TrainConfig(compile=True, device="auto"), torch.device("cuda", 0))


# ---- a run, a resume, a prediction -------------------------------------------------------


def test_a_cpu_run_with_the_default_trains_the_fused_kernels(local, fused_layers):
    config = TrainConfig(**TINY)
    assert config.kernels == "auto"
    trainer = Trainer(local, config, log=lambda _: None, device=CPU)
    assert trainer.parts.kernels == get_kernels() == "fused"
    fused_layers.clear()  # the epoch's calls only
    record = trainer.train_epoch(0)
    # Both layers of each of the epoch's batches took the fused C++ path.
    assert len(fused_layers) == 2 * record["iterations"] > 0


def test_the_device_path_note_names_the_kernels_auto_picked(local):
    trainer = Trainer(local, TrainConfig(**TINY, sampler="device"), log=lambda _: None)
    assert trainer.parts.notes[-1].startswith("GPU path on cpu: ")
    assert trainer.parts.notes[-1].endswith("; layers: fused kernels (--kernels auto)")
    config = TrainConfig(**TINY, sampler="device", kernels="torch")
    named = Trainer(local, config, log=lambda _: None)
    assert named.parts.notes[-1].endswith("; layers: torch kernels")


def _losses(local: LocalGraph, **options) -> tuple[list[float], list[str]]:
    """The epochs' losses of a tiny run with ``options``, and the lines it logged."""
    lines: list[str] = []
    trainer = Trainer(local, TrainConfig(**{**TINY, **options}), log=lines.append)
    return [r["loss"] for r in trainer.fit()], lines


def test_a_checkpoint_of_the_old_default_resumes_with_the_new_one_unchanged(local, tmp_path):
    """A checkpoint written before ``auto`` holds ``--kernels fused``: resumed with the
    default, the change is applied and said, and on the CPU the run goes on as it would have
    (the same kernels: bit-identical losses)."""
    straight, _ = _losses(local, kernels="fused", epochs=2)
    ckpt = str(tmp_path / "ckpt")
    first, _ = _losses(local, kernels="fused", epochs=1, checkpoint_dir=ckpt)
    second, lines = _losses(local, epochs=2, checkpoint_dir=ckpt, resume=True)
    assert "resume: applied --kernels 'fused' -> 'auto'" in lines
    assert get_kernels() == "fused"
    assert first + second == straight


def test_a_checkpoint_saved_with_auto_predicts_as_the_trainer_evaluates(local, tmp_path):
    """The checkpoint records ``auto``; a prediction resolves it on the CPU (the fused
    kernels) and repeats the trainer's evaluation bit for bit; the same weights saved with
    an older checkpoint's ``fused`` or ``triton`` predict alike."""
    ckpt = tmp_path / "ckpt"
    trainer = Trainer(local, TrainConfig(**TINY, checkpoint_dir=str(ckpt)), log=lambda _: None)
    trainer.fit()
    state = read_checkpoint(ckpt / CHECKPOINT_FILE, "--checkpoint")
    assert state["args"]["kernels"] == "auto"
    expected = layerwise_inference(
        trainer.model, trainer.features, trainer.sampler, trainer.cfg.eval_batch_size
    ).numpy()
    got = predict(ckpt, dataset=GRAPH, log=lambda _: None)
    np.testing.assert_array_equal(got.logits, expected)
    for kernels, exact in (("fused", True), ("triton", False)):
        old = tmp_path / kernels
        old.mkdir()
        save_checkpoint(old, {**state, "args": {**state["args"], "kernels": kernels}})
        logits = predict(old, dataset=GRAPH, log=lambda _: None).logits
        if exact:
            np.testing.assert_array_equal(logits, expected)
        else:  # another summation order (the Triton kernels, interpreted here)
            np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_the_default_trains_the_triton_kernels_on_a_gpu(local, monkeypatch):
    """On a GPU node with Triton the default takes the Triton layers (only a GPU shows it)."""
    require_triton("cuda")
    from distmb.nn.kernels import ops

    calls: list[int] = []
    linear_aggregate = ops.linear_aggregate

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the wrapped function's
        calls.append(1)
        return linear_aggregate(*args, **kwargs)

    monkeypatch.setattr(ops, "linear_aggregate", spy)
    trainer = Trainer(local, TrainConfig(**TINY, device="cuda"), log=lambda _: None)
    assert trainer.parts.kernels == get_kernels() == "triton"
    assert trainer.parts.notes[-1].endswith("; layers: triton kernels (--kernels auto)")
    calls.clear()  # the epoch's calls only
    record = trainer.train_epoch(0)
    assert np.isfinite(record["loss"])
    assert len(calls) == 2 * record["iterations"]  # both layers of every batch
