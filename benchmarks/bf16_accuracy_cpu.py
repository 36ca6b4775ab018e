"""What ``--precision bf16`` costs in accuracy on the CPU (C++) path, over seeds.

With ``--precision bf16`` on the CPU the fused C++ kernels (``--kernels fused``) run every
matrix product of the UPDATE (GraphSAGE) and of GAT's projection on bfloat16 operands summed
in float32 (AVX512-BF16 where the build has it), forward and backward, and keep float32
outputs; the other PyTorch ops of the training forward run under CPU bfloat16 autocast;
evaluation stays float32 (:class:`distmb.engine.precision.MixedPrecision`).
``precision_cpu.py`` measures what that buys in epoch time (one seed); this script measures
its accuracy cost with ``tf32_emulated.py``'s study (``precision_accuracy.py``): per dataset
(``cora``: GraphSAGE, model-selection recipe; ``cora_gat``: GAT; ``products``: a 20k-vertex
products-shaped graph, 20 epochs), precision (``float32``: ``--precision fp32``, ``bf16``:
``--precision bf16``) and seed (0-2), one :class:`distmb.engine.Trainer` run with
``--kernels fused --sampler cpp`` on the CPU (the float32 baseline on the fused kernels too:
the PyTorch ops draw other dropout masks, so only the products differ between a seed's two
runs). Reported: the last epoch's and the best validation epoch's test accuracy and the loss,
per seed their differences from float32's run of the same seed, whether the largest exceeds
float32's spread over the seeds, and the per-epoch loss differences. Each run records the
run header's precision note (``precision_note``: the bfloat16 products on AVX512-BF16 or on
portable C++) and whether the kernels' products went bfloat16 (``fused_bf16_products``).

    python benchmarks/bf16_accuracy_cpu.py                  # ~1 min on 2 cores
    python benchmarks/bf16_accuracy_cpu.py --quick --out /tmp/bf16_accuracy_cpu.json   # smoke

Writes ``results/bf16_accuracy_cpu.json`` (or ``--out``) and the PNG beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

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
from distmb.nn.kernels.cpu_update import bf16_native  # noqa: E402

RESULTS = HERE.parent / "results"
#: What the ``bf16`` runs are.
LABEL = (
    "--precision bf16 on the CPU: the fused C++ kernels' matrix products (UPDATE, GAT "
    "projection; forward and backward) on bfloat16 operands summed in float32, other ops of "
    "the training forward under CPU autocast; evaluation float32"
)
#: The figure's title line.
HEADLINE = (
    "--precision bf16 on the CPU: the fused kernels' matrix products on bfloat16 operands, "
    "summed in float32; evaluation float32"
)
#: Per precision compared (the baseline first), its ``--precision`` value.
PRECISION_FLAGS = {"float32": "fp32", "bf16": "bf16"}
#: The runs' ``--kernels`` and ``--sampler``.
KERNELS, SAMPLER = "fused", "cpp"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The study's command line (:func:`precision_accuracy.parse_args`)."""
    return precision_accuracy.parse_args(argv, __doc__, RESULTS / "bf16_accuracy_cpu.json")


def train(graph: Graph, recipe: dict[str, Any], precision: str, seed: int) -> dict[str, Any]:
    """One run (``--kernels fused --sampler cpp`` on the CPU) in ``precision`` (a key of
    :data:`PRECISION_FLAGS`): its per-epoch numbers, whether the fused kernels' products
    went bfloat16 and the run header's precision note (None for float32)."""
    config = TrainConfig(**recipe, seed=seed, progress=False, device="cpu", sampler=SAMPLER,
                         kernels=KERNELS, precision=PRECISION_FLAGS[precision])  # fmt: skip
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    t0 = time.perf_counter()
    history = trainer.fit()
    record = history_record(precision, seed, history, time.perf_counter() - t0)
    record["fused_bf16_products"] = trainer.precision.fused_bf16
    record["precision_note"] = trainer.precision.note
    return record


#: float32 against the fused kernels' bfloat16 products (:mod:`precision_accuracy`).
STUDY = Study(tuple(PRECISION_FLAGS), ("float32", "bf16 (fused)"), train)


def measure_dataset(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both precisions and every seed of dataset ``name``: the runs and their summary."""
    return precision_accuracy.measure_dataset(name, args, STUDY)


def plot(result: dict[str, Any], path: Path) -> None:
    """Accuracy (dot plot) and the per-epoch loss difference per dataset."""
    products = "AVX512-BF16" if result["machine"]["bf16_native"] else "portable C++"
    setup = f"--kernels {KERNELS} --sampler {SAMPLER}, bf16 products on {products}"
    precision_accuracy.plot(result, path, STUDY, HEADLINE, setup)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "bf16_accuracy_cpu",
        "label": LABEL,
        "command": command_line(argv, __file__),
        "machine": {**machine("cpu"), "bf16_native": bf16_native()},
        "kernels": KERNELS,
        "sampler": SAMPLER,
        "seeds": args.seeds,
        "precisions": {
            "float32": f"--precision fp32 --kernels {KERNELS}",
            "bf16": LABEL,
        },
        "datasets": {},
    }
    return measure_and_write(result, args, measure_dataset, plot)


if __name__ == "__main__":
    raise SystemExit(main())
