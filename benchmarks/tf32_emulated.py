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

import precision_accuracy  # noqa: E402  (benchmarks/ is not a package)
from feature_dtype import machine, measure_and_write  # noqa: E402
from precision_accuracy import Study, history_record  # noqa: E402
from record import command_line  # noqa: E402

from distmb.config.train import TrainConfig  # noqa: E402
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
#: The precisions compared: the baseline first (the datasets, ``--quick`` and the summary:
#: ``precision_accuracy.py``'s study, shared with ``bf16_accuracy_cpu.py``).
PRECISIONS = ("float32", "tf32_emulated")
BASELINE = PRECISIONS[0]
#: ``(spec, graph, recipe)`` of a dataset (the shared study's).
dataset = precision_accuracy.dataset
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
    """The study's command line (:func:`precision_accuracy.parse_args`)."""
    return precision_accuracy.parse_args(argv, __doc__, RESULTS / "tf32_emulated.json")


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
    record = history_record(precision, seed, history, time.perf_counter() - t0)
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


#: float32 against emulated TF32 (:mod:`precision_accuracy`).
STUDY = Study(PRECISIONS, ("float32", "TF32 emulated"), train)


def measure_dataset(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both precisions and every seed of dataset ``name``: the runs and their summary."""
    return precision_accuracy.measure_dataset(name, args, STUDY)


def plot(result: dict[str, Any], path: Path) -> None:
    """Accuracy (dot plot) and the per-epoch loss difference per dataset."""
    precision_accuracy.plot(result, path, STUDY, LABEL, "--kernels torch --sampler device")


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
