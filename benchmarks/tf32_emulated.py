"""What ``--precision tf32`` costs in accuracy: TF32 emulated on the CPU.

On a GPU, ``--precision tf32`` runs the training forward's and backward's float32 matrix
products on TF32 tensor cores: each float32 operand is rounded to TF32 (1 sign bit, 8
exponent bits, 10 mantissa bits: float32 with the low 13 mantissa bits dropped, rounded to
nearest, ties to even) and the products are summed in float32. This script emulates that on
the CPU: :class:`TF32Products`, a :class:`TorchDispatchMode` (below autograd, so it sees the
backward's products too), rounds both matrix operands of every dense float32 matrix product
(:data:`MATRIX_OPERANDS`: ``mm``, ``addmm``, ``bmm``, ...; not the addend of ``addmm``) with
:func:`to_tf32` before the float32 product runs. It is entered where the GPU's setting is:
in the training forward and backward only (:class:`EmulatedTF32`); evaluation stays float32.

**TF32 emulated on the CPU (operands rounded to TF32 before each float32 product;
accumulation order not the tensor cores')**: the CPU's BLAS sums the products of the rounded
operands in its own order and blocking, in float32, not the tensor cores' order, so the
emulation reproduces TF32's input rounding exactly and its accumulation only up to float32
reordering. The GPU measures the real thing (``benchmarks/gpu.py``'s precision sweep).

The layers run as PyTorch ops (``--kernels torch``; the fused C++ kernels would not pass
through the dispatcher's products) on the GPU path's sampler (``--sampler device``, CPU
tensors). Their aggregations are sparse CSR products (:func:`distmb.nn.aggregate.aggregate`);
on a GPU (``--kernels auto``: Triton) the aggregation kernels sum in float32 without tensor
cores, so the mode leaves products with a sparse operand in float32 (``products_float32``).
GAT's attention scores are element-wise products and sums on both paths (float32).

Per dataset, precision (``float32``, ``tf32_emulated``) and seed, one
:class:`distmb.engine.Trainer` run records per epoch the loss, the validation and test
accuracies and (TF32) the products rounded. Reported per precision (``summary``): the last
epoch's test accuracy and the test accuracy of the best validation epoch, the last epoch's
loss (median and per seed, and per seed the difference from float32's run of the same seed:
same batches, same initialisation), and whether the largest such difference exceeds
float32's spread over the seeds (``beyond_float32_seed_range``).

Datasets (``benchmarks/feature_dtype.py``'s): ``cora`` (GraphSAGE with the documented
model-selection recipe ``distmb.config.recipes.CORA_SAGE_SELECTED``: up to 100 epochs, early
stop), ``cora_gat`` (GAT, ``recipes.CORA_GAT``: 30 epochs; its projections are most of its
arithmetic) and ``products`` (the GPU benchmark's products-shaped synthetic graph, scaled to
``--nodes`` (default 20k: 1600 training vertices, 2 batches an epoch), GraphSAGE 3 layers,
hidden 256, fan-out 5,10,15, batch 1000, ``--epochs`` (default 20: 40 steps, as many as
``feature_dtype.py``'s 5 epochs of its 100k-vertex graph take; float32 reaches 99.6-99.8 %
test accuracy, that graph 99.5 %): scaled down so that both precisions and three seeds fit
in minutes. The training loss is an epoch's mean over its batches, so the per-epoch loss
differences (``loss_per_epoch_max_abs_diff``, and the PNG) compare the same batches.

    python benchmarks/tf32_emulated.py                  # ~2.5 min on 2 idle cores
    python benchmarks/tf32_emulated.py --quick --out /tmp/tf32_emulated.json   # smoke run

Writes ``results/tf32_emulated.json`` (or ``--out``) and the PNG beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from feature_dtype import (  # noqa: E402
    add_products_args,
    apply_quick,
    dataset_record,
    draw_accuracy,
    machine,
    measure_and_write,
    plot_pairs,
    spread,
)
from feature_dtype import dataset as feature_dtype_dataset  # noqa: E402
from record import command_line  # noqa: E402  (benchmarks/ is not a package)

from distmb.config import recipes  # noqa: E402
from distmb.config.train import TrainConfig  # noqa: E402
from distmb.data import load_dataset  # noqa: E402
from distmb.data.graph import Graph  # noqa: E402
from distmb.data.local import LocalGraph  # noqa: E402
from distmb.engine import Trainer  # noqa: E402
from distmb.engine.precision import MixedPrecision  # noqa: E402

RESULTS = HERE.parent / "results"
#: What every number of a ``tf32_emulated`` run is.
LABEL = (
    "TF32 emulated on the CPU (operands rounded to TF32 before each float32 product; "
    "accumulation order not the tensor cores')"
)
#: The precisions compared: the baseline first.
PRECISIONS = ("float32", "tf32_emulated")
BASELINE = PRECISIONS[0]
#: The datasets (``--datasets``).
DATASETS = ("cora", "cora_gat", "products")
#: ``--quick``: one seed, one epoch of a tiny products-shaped graph (the smoke test's run).
QUICK = {"datasets": "products", "seeds": "0", "nodes": 2000, "avg_degree": 8.0,
         "feat_dim": 16, "hidden": 16, "batch_size": 64, "epochs": 1}  # fmt: skip
#: Mantissa bits float32 has and TF32 keeps.
FLOAT32_MANTISSA_BITS, TF32_MANTISSA_BITS = 23, 10
#: The low mantissa bits TF32 drops (13).
DROPPED_BITS = FLOAT32_MANTISSA_BITS - TF32_MANTISSA_BITS
#: The bit pattern with the dropped bits cleared (``& KEEP_MASK``), as an int32 value.
KEEP_MASK = -(1 << DROPPED_BITS)
#: Half a TF32 unit in the last place, less one, in the float32 bit pattern: adding it plus
#: the kept last bit, then clearing the dropped bits, rounds to nearest, ties to even.
HALF_ULP_LESS_ONE = (1 << (DROPPED_BITS - 1)) - 1
#: float32's quiet-NaN bit (the mantissa's highest): kept by TF32, so a NaN stays a NaN.
QUIET_NAN_BIT = 1 << (FLOAT32_MANTISSA_BITS - 1)
#: Per matrix-product ATen op (cuBLAS GEMMs on a GPU, which TF32 reaches), the positions of
#: its two matrix operands among the positional arguments (the ``addmm`` family's addend,
#: ``beta`` and ``alpha`` are not rounded: TF32 rounds the multiplied operands only).
MATRIX_OPERANDS: dict[Any, tuple[int, int]] = {
    torch.ops.aten.mm: (0, 1),
    torch.ops.aten.bmm: (0, 1),
    torch.ops.aten.addmm: (1, 2),
    torch.ops.aten.addmm_: (1, 2),
    torch.ops.aten._addmm_activation: (1, 2),
    torch.ops.aten.baddbmm: (1, 2),
    torch.ops.aten.baddbmm_: (1, 2),
    torch.ops.aten.addbmm: (1, 2),
    torch.ops.aten.addbmm_: (1, 2),
}


def to_tf32(x: Tensor) -> Tensor:
    """``x`` rounded to TF32: float32[...] -> float32[...] of the same shape whose values have
    their low 13 mantissa bits zero (TF32-representable).

    Round to nearest, ties to even, on the bit pattern (int32 ops, in place on one buffer):
    add the kept mantissa's last bit and half a TF32 unit less one, then clear the dropped
    bits. A carry out of the mantissa raises the exponent (a subnormal may become normal; a
    value at or past TF32's largest plus half a unit becomes infinity, as IEEE rounding
    overflows). Infinities are unchanged (their dropped bits are zero); a NaN stays a NaN of
    the same sign (quiet, its payload's dropped bits cleared; looked for only when the sum of
    ``x`` is NaN, which any NaN makes it). No int32 overflow: a finite or infinite pattern
    plus at most ``2**12`` stays below the sign bit or, negative, above ``-2**31``.

    Raises:
        TypeError: ``x`` is not float32.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"to_tf32 takes float32, not {x.dtype}")
    bits = x.view(torch.int32)
    rounded = torch.bitwise_right_shift(bits, DROPPED_BITS)
    rounded.bitwise_and_(1).add_(bits).add_(HALF_ULP_LESS_ONE).bitwise_and_(KEEP_MASK)
    if torch.isnan(x.sum()):
        nan = (bits | QUIET_NAN_BIT) & KEEP_MASK
        rounded = torch.where(torch.isnan(x), nan, rounded)
    return rounded.view(torch.float32)


def rounds(operand: Any) -> bool:  # noqa: ANN401 (any argument of an ATen op)
    """Whether TF32 rounds ``operand``: a dense (strided) float32 tensor."""
    return (
        isinstance(operand, Tensor)
        and operand.layout == torch.strided
        and operand.dtype == torch.float32
    )


class TF32Products(TorchDispatchMode):
    """Inside it, every ATen matrix product of :data:`MATRIX_OPERANDS` whose two matrix
    operands are dense float32 runs on those operands rounded by :func:`to_tf32` (the
    product itself, and any addend, in float32); other products (a sparse CSR operand: the
    aggregations) run unchanged. Below autograd: the backward's products are rounded too,
    from the unrounded saved tensors, as on the GPU.

    Counts ``rounded`` (products run on rounded operands) and ``float32`` (products left
    alone).
    """

    def __init__(self) -> None:
        super().__init__()
        self.rounded = 0
        self.float32 = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        positions = MATRIX_OPERANDS.get(func.overloadpacket)
        if positions is not None:
            if all(rounds(args[i]) for i in positions):
                args = tuple(to_tf32(a) if i in positions else a for i, a in enumerate(args))
                self.rounded += 1
            else:
                self.float32 += 1
        return func(*args, **(kwargs or {}))


class EmulatedTF32(MixedPrecision):
    """``--precision fp32`` whose training forward and backward run inside
    :class:`TF32Products`: what ``--precision tf32`` changes on a GPU, on the CPU.

    ``per_step``: the products rounded in each training step (forward + backward), in order.
    """

    def __init__(self, kernels: str, device: torch.device) -> None:
        super().__init__("fp32", kernels, device)
        self.mode = TF32Products()
        self.per_step: list[int] = []
        self._step_start = 0

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        self._step_start = self.mode.rounded
        with self.mode:
            yield

    def backward(self, loss: Tensor) -> None:
        with self.mode:
            loss.backward()
        self.per_step.append(self.mode.rounded - self._step_start)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help=f"small run: {QUICK}")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated")
    add_products_args(p, nodes=20_000)
    p.add_argument("--epochs", type=int, default=20, help="products")
    p.add_argument("--out", type=Path, default=RESULTS / "tf32_emulated.json",
                   help="JSON path (PNG beside it)")  # fmt: skip
    args = p.parse_args(argv)
    apply_quick(p, args, QUICK)
    args.datasets = args.datasets.split(",")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    for name in args.datasets:
        if name not in DATASETS:
            p.error(f"--datasets: {name!r} is not one of {', '.join(DATASETS)}")
    return args


def dataset(name: str, args: argparse.Namespace) -> tuple[str, Graph, dict[str, Any]]:
    """``(spec, graph, recipe)`` of dataset ``name``: ``cora_gat`` (GAT with its documented
    recipe on Cora), else feature_dtype.py's (``recipe``: TrainConfig fields)."""
    if name == "cora_gat":
        return "cora", load_dataset("cora"), dict(recipes.CORA_GAT)
    return feature_dtype_dataset(name, args)


def train(graph: Graph, recipe: dict[str, Any], precision: str, seed: int) -> dict[str, Any]:
    """One run (``--kernels torch --sampler device`` on the CPU) in ``precision``: its
    per-epoch numbers and, emulated TF32, the products it rounded."""
    config = TrainConfig(**recipe, seed=seed, progress=False, device="cpu", sampler="device",
                         kernels="torch")  # fmt: skip
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    emulated = None
    if precision == "tf32_emulated":
        emulated = EmulatedTF32(config.kernels, trainer.device)
        trainer.precision = emulated
    t0 = time.perf_counter()
    history = trainer.fit()
    last = history[-1]
    record: dict[str, Any] = {
        "precision": precision,
        "seed": seed,
        "epochs_run": len(history),
        **{
            f"{key}_per_epoch": [r[key] for r in history] for key in ("loss", "val_acc", "test_acc")
        },
        "loss": last["loss"],
        "test_acc": last["test_acc"],
        "best_test_acc": last["best_test_acc"],
        "best_epoch": last["best_epoch"],
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if emulated is not None:
        steps = [r["iterations"] for r in history]
        ends = [sum(steps[: i + 1]) for i in range(len(steps))]
        starts = [0, *ends[:-1]]
        record["products_rounded_first_iteration"] = emulated.per_step[0]
        record["products_rounded_per_epoch"] = [
            sum(emulated.per_step[a:b]) for a, b in zip(starts, ends, strict=True)
        ]
        record["products_float32"] = emulated.mode.float32
    return record


def summarize(runs: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """Per precision: accuracies and loss (median, per seed, range), the per-seed differences
    from float32, whether the largest exceeds float32's range over the seeds, and per seed the
    largest per-epoch loss difference (``loss_per_epoch_max_abs_diff``) beside the median over
    the epochs of float32's per-epoch range over the seeds."""
    base = {r["seed"]: r for r in runs if r["precision"] == BASELINE}
    keys = {"test_acc": "test_acc_last_epoch", "best_test_acc": "test_acc_best_val_epoch",
            "loss": "loss_last_epoch"}  # fmt: skip
    out: dict[str, Any] = {}
    for precision in PRECISIONS:
        mine = sorted((r for r in runs if r["precision"] == precision),
                      key=lambda r: seeds.index(r["seed"]))  # fmt: skip
        entry: dict[str, Any] = {key: spread([r[raw] for r in mine]) for raw, key in keys.items()}
        entry["best_epoch"] = [r["best_epoch"] for r in mine]
        entry["epochs_run"] = [r["epochs_run"] for r in mine]
        diffs = {raw: [r[raw] - base[r["seed"]][raw] for r in mine] for raw in keys}
        entry["diff_vs_float32_per_seed"] = diffs
        entry["diff_vs_float32_median"] = {k: statistics.median(v) for k, v in diffs.items()}
        entry["beyond_float32_seed_range"] = {
            raw: max(abs(d) for d in diffs[raw]) > seed_range(base, raw) for raw in keys
        }
        entry["loss_per_epoch_max_abs_diff"] = [
            max(abs(d) for d in loss_diffs(r, base[r["seed"]])) for r in mine
        ]
        out[precision] = entry
    ranges = loss_seed_ranges([r["loss_per_epoch"] for r in base.values()])
    out[BASELINE]["loss_per_epoch_seed_range_median"] = statistics.median(ranges)
    return out


def seed_range(base: dict[int, dict[str, Any]], key: str) -> float:
    """float32's range (max - min) of ``key`` over the seeds."""
    values = [r[key] for r in base.values()]
    return max(values) - min(values)


def loss_diffs(run: dict[str, Any], base: dict[str, Any]) -> list[float]:
    """``run``'s training loss minus ``base``'s, per epoch both trained."""
    return [a - b for a, b in zip(run["loss_per_epoch"], base["loss_per_epoch"], strict=False)]


def loss_seed_ranges(losses: list[list[float]]) -> list[float]:
    """Per epoch, the range (max - min) of the runs' losses that reached it."""
    longest = max(len(v) for v in losses)
    return [max(v[e] for v in losses if len(v) > e) - min(v[e] for v in losses if len(v) > e)
            for e in range(longest)]  # fmt: skip


def measure_dataset(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both precisions and every seed of dataset ``name``: the runs and their summary."""
    spec, graph, recipe = dataset(name, args)
    runs = []
    for seed in args.seeds:
        for precision in PRECISIONS:
            record = train(graph, recipe, precision, seed)
            runs.append(record)
            print(f"{name} {precision} seed {seed}: loss {record['loss']:.4f} "
                  f"test {record['test_acc']:.4f} best-val test {record['best_test_acc']:.4f} "
                  f"epochs {record['epochs_run']} ({record['seconds']} s)", flush=True)  # fmt: skip
    return {
        **dataset_record(spec, recipe, graph),
        "summary": summarize(runs, args.seeds),
        "runs": runs,
    }


def draw_loss(ax: Any, name: str, data: dict[str, Any]) -> None:  # noqa: ANN401
    """Per seed and epoch: emulated TF32's training loss minus float32's (same seed), beside
    float32's spread over the seeds at that epoch (max - min, shaded either side of zero)."""
    runs = data["runs"]
    base = {r["seed"]: r for r in runs if r["precision"] == BASELINE}
    ranges = loss_seed_ranges([r["loss_per_epoch"] for r in base.values()])
    epochs = range(len(ranges))
    ax.fill_between(epochs, [-r for r in ranges], ranges, color="grey", alpha=0.2,
                    label="± float32 seeds' range")  # fmt: skip
    for i, run in enumerate(r for r in runs if r["precision"] != BASELINE):
        diff = loss_diffs(run, base[run["seed"]])
        ax.plot(range(len(diff)), diff, color=f"C{i}", marker="." if len(diff) < 10 else None,
                label=f"seed {run['seed']}")  # fmt: skip
    ax.axhline(0.0, color="k", linewidth=0.8)
    ax.set(title=f"{name}: training loss, TF32 emulated - float32",
           xlabel="epoch", ylabel="loss difference")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper right")


def plot(result: dict[str, Any], path: Path) -> None:
    """Accuracy (dot plot) and the per-epoch loss difference per dataset."""

    def draw(left: Any, right: Any, name: str, data: dict[str, Any]) -> None:
        draw_accuracy(left, name, data["summary"], list(PRECISIONS),
                      ["float32", "TF32 emulated"])  # fmt: skip
        draw_loss(right, name, data)

    facts = result["machine"]
    plot_pairs(result, path, draw,
               f"{LABEL}\n{facts['cpu']}, {facts['cpus']} cores, torch {facts['torch']}, "
               "--kernels torch --sampler device")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "tf32_emulated",
        "label": LABEL,
        "command": command_line(argv, __file__),
        "machine": machine("cpu"),
        "kernels": "torch",
        "sampler": "device",
        "seeds": args.seeds,
        "precisions": {
            "float32": "plain float32 (--precision fp32)",
            "tf32_emulated": LABEL,
        },
        "datasets": {},
    }
    return measure_and_write(result, args, measure_dataset, plot)


if __name__ == "__main__":
    raise SystemExit(main())
