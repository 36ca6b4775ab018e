"""``--precision`` (distmb.engine.precision): CPU bf16 autocast reaches the PyTorch-ops layers,
the fused kernels take bfloat16 products, and both train about as well as fp32; tf32's
setting covers the training forward and backward only; the combinations that cannot work are
refused; fp16, bf16 and tf32 on a GPU under ``pytest -m cuda``. The fused kernels' bfloat16
products themselves: tests/test_bf16_products.py."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAST_FLAGS, SMALL

from distmb.cli.train import main as train_main
from distmb.config.train import parse_config
from distmb.core.errors import InputError
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine.precision import MixedPrecision
from distmb.nn.kernels.dispatch import get_kernels, set_kernels
from distmb.nn.models import GraphSAGE
from distmb.pipeline.sample import NeighborSampler

#: A graph on which four epochs of the small model separate learning from guessing.
LEARNABLE = (
    "synthetic:nodes=4000,avg_degree=10,feat_dim=16,classes=4,train_fraction=0.3,"
    "val_fraction=0.1,test_fraction=0.6"
)
FAST = [*FAST_FLAGS, "--eval-every", "1", "--prefetch", "0"]


def records(tmp_path, name: str, argv: list[str]) -> list[dict]:
    results = tmp_path / f"{name}.jsonl"
    assert train_main([*argv, "--results", str(results)]) == 0
    return [json.loads(line) for line in results.read_text().splitlines()]


def test_cpu_bf16_autocast_reaches_the_torch_layers():
    graph = LocalGraph.from_graph(load_dataset(SMALL))
    sampler = NeighborSampler(graph.indptr, graph.indices, graph.n_solid, graph.n_local, (4, 4), 0)
    blocks = sampler.sample(graph.train_idx[:50], 0, 0)
    x = torch.from_numpy(graph.features[blocks[0].src_ids.numpy()])
    model = GraphSAGE(graph.feat_dim, 16, graph.num_classes, 2, dropout=0.0)
    seen: list[torch.dtype] = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    before = get_kernels()
    try:
        set_kernels("torch")
        fp32 = model(blocks, x)
        assert seen and set(seen) == {torch.float32}
        seen.clear()
        with MixedPrecision("bf16", "torch", torch.device("cpu")).autocast():
            bf16 = model(blocks, x)
    finally:
        set_kernels(before)
    assert seen and set(seen) == {torch.bfloat16}  # every projection ran in bf16
    assert not torch.equal(bf16.float(), fp32)  # computed in bf16, not cast at the end
    torch.testing.assert_close(bf16.float(), fp32, rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    ("sampler", "kernels"), [("cpp", "torch"), ("device", "torch"), ("cpp", "fused")]
)
def test_bf16_trains_within_a_few_points_of_fp32(tmp_path, capsys, sampler, kernels):
    """Under autocast (--kernels torch) or through the fused kernels' bfloat16 products (the
    run header says which)."""
    base = ["--dataset", LEARNABLE, *FAST, "--epochs", "4", "--kernels", kernels,
            "--sampler", sampler]  # fmt: skip
    fp32 = records(tmp_path, "fp32", base)
    capsys.readouterr()
    bf16 = records(tmp_path, "bf16", [*base, "--precision", "bf16"])
    header = "--precision bf16: the fused kernels' matrix products on bfloat16 operands"
    assert (header in capsys.readouterr().out) is (kernels == "fused")
    assert [r["loss"] for r in bf16] != [r["loss"] for r in fp32]  # bf16 did compute
    assert bf16[-1]["loss"] < bf16[0]["loss"]
    assert bf16[-1]["test_acc"] > 0.25 + 0.2  # chance is 1/4
    assert abs(bf16[-1]["test_acc"] - fp32[-1]["test_acc"]) < 0.03


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--precision", "fp16"], r"--precision fp16 needs a GPU \(--device cuda\)"),
        (["--precision", "fp16", "--kernels", "torch", "--sampler", "device"],
         "--precision fp16 needs a GPU"),
        (["--precision", "tf32"], r"--precision tf32 needs a GPU \(--device cuda\)"),
        (["--precision", "tf32", "--kernels", "torch", "--sampler", "device"],
         "--precision tf32 needs a GPU"),
    ],
)  # fmt: skip
def test_refused_combinations(argv, message):
    with pytest.raises(InputError, match=message):
        parse_config(argv)


def test_auto_device_is_checked_once_resolved():
    # --device auto on a CPU-only machine: the config cannot know; MixedPrecision refuses.
    parse_config(["--device", "auto", "--precision", "fp16"])
    with pytest.raises(InputError, match="--precision fp16 needs a GPU"):
        MixedPrecision("fp16", "torch", torch.device("cpu"))
    assert MixedPrecision("bf16", "fused", torch.device("cuda")).scaler is None


def test_fp32_changes_nothing():
    mp = MixedPrecision("fp32", "fused", torch.device("cpu"))
    with mp.autocast():
        y = torch.nn.Linear(3, 2)(torch.randn(4, 3))
    assert y.dtype == torch.float32 and mp.state_dict() is None


class _RecordsBackwardPrecision(torch.autograd.Function):
    """Identity whose backward records the CUDA matmul precision it runs under."""

    seen: list[str] = []

    @staticmethod
    def forward(ctx, x):  # noqa: ANN001, ANN205
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        _RecordsBackwardPrecision.seen.append(torch.backends.cuda.matmul.fp32_precision)
        return grad


def test_tf32_covers_the_forward_and_the_backward_only():
    """The TF32 setting holds inside the forward's context and during the backward (autograd
    may run it on another thread: the setting is process-wide), and is restored after both,
    also when the forward raises."""
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    mp = MixedPrecision("tf32", "fused", torch.device("cuda"))  # built, not run, on a CPU
    assert mp.tf32 and mp.dtype is None and mp.scaler is None
    x = torch.randn(3, requires_grad=True)
    with mp.autocast():
        assert matmul.fp32_precision == "tf32"
        loss = _RecordsBackwardPrecision.apply(x).sum()
    assert matmul.fp32_precision == before
    _RecordsBackwardPrecision.seen.clear()
    mp.backward(loss)
    assert _RecordsBackwardPrecision.seen == ["tf32"]
    assert matmul.fp32_precision == before
    with pytest.raises(RuntimeError, match="boom"), mp.autocast():
        raise RuntimeError("boom")
    assert matmul.fp32_precision == before
    _RecordsBackwardPrecision.seen.clear()
    fp32 = MixedPrecision("fp32", "fused", torch.device("cpu"))
    with fp32.autocast():
        loss = _RecordsBackwardPrecision.apply(x).sum()
    fp32.backward(loss)
    assert _RecordsBackwardPrecision.seen == [before]


@pytest.mark.cuda
def test_cuda_tf32_rounds_the_products_and_trains(tmp_path):
    a = torch.randn(256, 256, device="cuda")
    b = torch.randn(256, 256, device="cuda")
    exact = (a.double() @ b.double()).float()
    ieee = a @ b
    with MixedPrecision("tf32", "fused", torch.device("cuda")).autocast():
        tf32 = a @ b
    ieee_err = (ieee - exact).abs().max().item()
    tf32_err = (tf32 - exact).abs().max().item()
    assert tf32_err > 10 * ieee_err  # 10-bit mantissa inputs: far coarser than IEEE float32
    assert tf32_err < 2**-10 * (a.abs() @ b.abs()).max().item()
    base = ["--dataset", LEARNABLE, *FAST, "--epochs", "4", "--device", "cuda"]
    fp32 = records(tmp_path, "fp32", base)
    low = records(tmp_path, "tf32", [*base, "--precision", "tf32"])
    assert low[-1]["test_acc"] > 0.25 + 0.2
    assert abs(low[-1]["test_acc"] - fp32[-1]["test_acc"]) < 0.05


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("kernels", ["fused", "triton"])
def test_cuda_low_precision_trains(tmp_path, precision, kernels):
    base = ["--dataset", LEARNABLE, *FAST, "--epochs", "4", "--device", "cuda"]
    fp32 = records(tmp_path, "fp32", base)
    low = records(tmp_path, "low", [*base, "--precision", precision, "--kernels", kernels])
    assert low[-1]["test_acc"] > 0.25 + 0.2
    assert abs(low[-1]["test_acc"] - fp32[-1]["test_acc"]) < 0.05


@pytest.mark.cuda
def test_cuda_fp16_scaler_state_in_checkpoints(tmp_path):
    base = ["--dataset", SMALL, *FAST, "--device", "cuda", "--precision", "fp16"]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ck")]
    straight = records(tmp_path, "straight", [*base, "--epochs", "2"])
    records(tmp_path, "first", [*base, "--epochs", "1", *ckpt])
    second = records(tmp_path, "second", [*base, "--epochs", "2", *ckpt, "--resume"])
    assert second[-1]["loss"] == pytest.approx(straight[-1]["loss"], rel=1e-3)
