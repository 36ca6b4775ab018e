"""The accuracy study of a lower ``--precision`` against float32, over seeds: shared by
``tf32_emulated.py`` (TF32 emulated on the CPU) and ``bf16_accuracy_cpu.py`` (the fused C++
kernels' bfloat16 products). A :class:`Study` names the precisions compared (the baseline
first), their labels and how one run trains; everything else is here.

Per dataset, precision and seed, one :class:`distmb.engine.Trainer` run (the study's
``train``) records per epoch the loss, the validation and test accuracies
(:func:`history_record`). Reported per precision (:func:`summarize`): the last epoch's test
accuracy and the test accuracy of the best validation epoch, the last epoch's loss (median
and per seed, and per seed the difference from the baseline's run of the same seed: same
batches, same initialisation), and whether the largest such difference exceeds the
baseline's spread over the seeds (``beyond_<baseline>_seed_range``). The training loss is an
epoch's mean over its batches, so the per-epoch loss differences
(``loss_per_epoch_max_abs_diff``, and the figure) compare the same batches.

Datasets (:data:`DATASETS`, ``feature_dtype.py``'s and GAT): ``cora`` (GraphSAGE with the
documented model-selection recipe ``distmb.config.recipes.CORA_SAGE_SELECTED``: up to 100
epochs, early stop), ``cora_gat`` (GAT, ``recipes.CORA_GAT``: 30 epochs; its projections are
most of its arithmetic) and ``products`` (the GPU benchmark's products-shaped synthetic
graph, scaled to ``--nodes`` (default 20k: 1600 training vertices, 2 batches an epoch),
GraphSAGE 3 layers, hidden 256, fan-out 5,10,15, batch 1000, ``--epochs`` (default 20: 40
steps, as many as ``feature_dtype.py``'s 5 epochs of its 100k-vertex graph take): scaled
down so that both precisions and three seeds fit in minutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from feature_dtype import (  # noqa: E402  (benchmarks/ is not a package)
    add_products_args,
    apply_quick,
    dataset_record,
    draw_accuracy,
    plot_pairs,
    spread,
)
from feature_dtype import dataset as feature_dtype_dataset  # noqa: E402

from distmb.config import recipes  # noqa: E402
from distmb.data import load_dataset  # noqa: E402
from distmb.data.graph import Graph  # noqa: E402

#: The datasets (``--datasets``).
DATASETS = ("cora", "cora_gat", "products")
#: ``--quick``: one seed, one epoch of a tiny products-shaped graph (the smoke tests' run).
QUICK = {"datasets": "products", "seeds": "0", "nodes": 2000, "avg_degree": 8.0,
         "feat_dim": 16, "hidden": 16, "batch_size": 64, "epochs": 1}  # fmt: skip
#: The summary's names of a run's numbers (the run record's key -> the summary's key).
SUMMARY_KEYS = {"test_acc": "test_acc_last_epoch", "best_test_acc": "test_acc_best_val_epoch",
                "loss": "loss_last_epoch"}  # fmt: skip

#: ``train(graph, recipe, precision, seed)``: one run's record (:func:`history_record` and
#: whatever the study adds).
Train = Callable[[Graph, dict[str, Any], str, int], dict[str, Any]]


@dataclass(frozen=True)
class Study:
    """One accuracy study.

    Attributes:
        precisions: the precisions compared (the runs' ``precision``), the baseline first.
        labels: their names in the figure, in the same order.
        train: how one run trains (:data:`Train`).
    """

    precisions: tuple[str, ...]
    labels: tuple[str, ...]
    train: Train

    def __post_init__(self) -> None:
        if len(self.precisions) < 2 or len(self.labels) != len(self.precisions):
            raise ValueError(f"Study: need a baseline and at least one precision, a label "
                             f"each; got {self.precisions} labelled {self.labels}")  # fmt: skip

    @property
    def baseline(self) -> str:
        """The precision every other is compared with (the first)."""
        return self.precisions[0]


def parse_args(argv: list[str] | None, description: str, out: Path) -> argparse.Namespace:
    """A study's command line: ``--quick`` (:data:`QUICK`), ``--datasets``, ``--seeds``, the
    products graph's flags (``--nodes`` default 20k), ``--epochs`` (products, default 20) and
    ``--out`` (default ``out``); ``description`` is the script's docstring."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help=f"small run: {QUICK}")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated")
    add_products_args(p, nodes=20_000)
    p.add_argument("--epochs", type=int, default=20, help="products")
    p.add_argument("--out", type=Path, default=out, help="JSON path (PNG beside it)")
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


def history_record(
    precision: str, seed: int, history: list[dict[str, Any]], seconds: float
) -> dict[str, Any]:
    """A run's record from its Trainer history (one dict per epoch): the per-epoch loss,
    validation and test accuracy, the last epoch's loss and test accuracy, the test accuracy
    of the best validation epoch and that epoch, and the run's wall-clock ``seconds``."""
    last = history[-1]
    return {
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
        "seconds": round(seconds, 2),
    }


def summarize(
    runs: list[dict[str, Any]], seeds: list[int], precisions: tuple[str, ...]
) -> dict[str, Any]:
    """Per precision (``precisions``, the baseline first): accuracies and loss (median, per
    seed, range), the per-seed differences from the baseline (``diff_vs_<baseline>_*``),
    whether the largest exceeds the baseline's range over the seeds, and per seed the largest
    per-epoch loss difference (``loss_per_epoch_max_abs_diff``) beside (in the baseline's
    entry) the median over the epochs of the baseline's per-epoch range over the seeds."""
    baseline = precisions[0]
    base = {r["seed"]: r for r in runs if r["precision"] == baseline}
    out: dict[str, Any] = {}
    for precision in precisions:
        mine = sorted((r for r in runs if r["precision"] == precision),
                      key=lambda r: seeds.index(r["seed"]))  # fmt: skip
        entry: dict[str, Any] = {
            key: spread([r[raw] for r in mine]) for raw, key in SUMMARY_KEYS.items()
        }
        entry["best_epoch"] = [r["best_epoch"] for r in mine]
        entry["epochs_run"] = [r["epochs_run"] for r in mine]
        diffs = {raw: [r[raw] - base[r["seed"]][raw] for r in mine] for raw in SUMMARY_KEYS}
        entry[f"diff_vs_{baseline}_per_seed"] = diffs
        entry[f"diff_vs_{baseline}_median"] = {k: statistics.median(v) for k, v in diffs.items()}
        entry[f"beyond_{baseline}_seed_range"] = {
            raw: max(abs(d) for d in diffs[raw]) > seed_range(base, raw) for raw in SUMMARY_KEYS
        }
        entry["loss_per_epoch_max_abs_diff"] = [
            max(abs(d) for d in loss_diffs(r, base[r["seed"]])) for r in mine
        ]
        out[precision] = entry
    ranges = loss_seed_ranges([r["loss_per_epoch"] for r in base.values()])
    out[baseline]["loss_per_epoch_seed_range_median"] = statistics.median(ranges)
    return out


def seed_range(base: dict[int, dict[str, Any]], key: str) -> float:
    """The baseline's range (max - min) of ``key`` over the seeds (``base``: its run per seed)."""
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


def measure_dataset(name: str, args: argparse.Namespace, study: Study) -> dict[str, Any]:
    """Every precision of ``study`` and every seed of dataset ``name``: the runs (seed by
    seed, the precisions in order) and their summary."""
    spec, graph, recipe = dataset(name, args)
    runs = []
    for seed in args.seeds:
        for precision in study.precisions:
            record = study.train(graph, recipe, precision, seed)
            runs.append(record)
            print(f"{name} {precision} seed {seed}: loss {record['loss']:.4f} "
                  f"test {record['test_acc']:.4f} best-val test {record['best_test_acc']:.4f} "
                  f"epochs {record['epochs_run']} ({record['seconds']} s)", flush=True)  # fmt: skip
    return {
        **dataset_record(spec, recipe, graph),
        "summary": summarize(runs, args.seeds, study.precisions),
        "runs": runs,
    }


def draw_loss(ax: Any, name: str, data: dict[str, Any], study: Study) -> None:  # noqa: ANN401
    """Per seed and epoch: each compared precision's training loss minus the baseline's (same
    seed), beside the baseline's spread over the seeds at that epoch (max - min, shaded
    either side of zero)."""
    runs = data["runs"]
    baseline, label_of = study.baseline, dict(zip(study.precisions, study.labels, strict=True))
    base = {r["seed"]: r for r in runs if r["precision"] == baseline}
    ranges = loss_seed_ranges([r["loss_per_epoch"] for r in base.values()])
    epochs = range(len(ranges))
    ax.fill_between(epochs, [-r for r in ranges], ranges, color="grey", alpha=0.2,
                    label=f"± {label_of[baseline]} seeds' range")  # fmt: skip
    for i, run in enumerate(r for r in runs if r["precision"] != baseline):
        diff = loss_diffs(run, base[run["seed"]])
        label = f"seed {run['seed']}"
        if len(study.precisions) > 2:  # name the precision where several are compared
            label = f"{label_of[run['precision']]}, {label}"
        ax.plot(range(len(diff)), diff, color=f"C{i}", marker="." if len(diff) < 10 else None,
                label=label)  # fmt: skip
    ax.axhline(0.0, color="k", linewidth=0.8)
    ax.set(title=f"{name}: training loss, {' / '.join(study.labels[1:])} - {study.labels[0]}",
           xlabel="epoch", ylabel="loss difference")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper right")


def plot(result: dict[str, Any], path: Path, study: Study, headline: str, setup: str) -> None:
    """Per dataset: accuracy (dot plot) and the per-epoch loss difference; titled
    ``headline``, then the machine and ``setup`` (the runs' flags)."""

    def draw(left: Any, right: Any, name: str, data: dict[str, Any]) -> None:
        draw_accuracy(left, name, data["summary"], list(study.precisions), list(study.labels))
        draw_loss(right, name, data, study)

    facts = result["machine"]
    plot_pairs(result, path, draw,
               f"{headline}\n{facts['cpu']}, {facts['cpus']} cores, torch {facts['torch']}, "
               f"{setup}")  # fmt: skip
