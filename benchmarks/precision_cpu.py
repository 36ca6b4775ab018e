"""What ``--precision bf16`` buys in epoch time on the CPU (C++) path, and costs in accuracy.

With ``--precision bf16`` on the CPU the fused C++ kernels (``--kernels fused``, the default
there) run every matrix product of the UPDATE and of GAT's projection on bfloat16 operands
summed in float32 (AVX512-BF16 where the build has it), forward and backward, and keep
float32 outputs; the other PyTorch ops of the training forward run under CPU bfloat16
autocast. Before, bf16 on the CPU needed ``--kernels torch`` (autocast over PyTorch ops
only): that is measured too, to show what it cost. Per model (``--models``: GraphSAGE, GAT)
the configurations are ``--kernels`` x ``--precisions``: ``fused/fp32`` (the baseline),
``fused/bf16``, ``torch/fp32`` and ``torch/bf16``.

The graph is feature_dtype.py's products-shaped synthetic graph (``--nodes`` vertices,
default 100k, 100 features), written as a one-part partition and read back like
``--part-dir`` (feature_dtype_cpu.py's ``write_partition``); the model is feature_dtype.py's
products recipe (3 layers, fan-out 5,10,15, batch 1000; GraphSAGE hidden ``--hidden`` 256;
GAT ``--heads`` 4 heads of ``--gat-hidden`` 64, concatenated to 256, at GAT's default
learning rate), one seed. Each configuration runs ``--epochs`` training epochs
(``Trainer.train_epoch``) in a process of its own; the configurations are interleaved over
``--repeats`` rounds (each round rotates their order), so the shared machine's noise falls on
all alike. Recorded per epoch (feature_dtype_cpu.py's ``epoch_phases``): ``epoch_time`` and
its phases from the Trainer's epoch record, on the training thread FWD, BWD, OPT,
``load_wait`` and ``other``; on the loader's prefetch thread, overlapping them, MBC =
``sample`` + ``gather``; and the epoch's loss. ``summary``: per model and configuration the
medians over the steady epochs (every epoch but each process's first) of all rounds, the
first epochs' medians apart, the ratio of each steady median to ``fused/fp32``'s of the same
model measured in this run, the last epoch's loss (and whether every round trained to the
same loss) and the test and validation accuracy after the first round's run
(``Trainer.evaluate``: exact layer-wise inference in float32). GAT, at its default learning
rate, is still far from converged after the default 4 epochs: its accuracies compare the
configurations at the same point of training, one seed, not what each would reach.

    python benchmarks/precision_cpu.py                  # ~6 min on 2 cores
    python benchmarks/precision_cpu.py --quick --out /tmp/precision_cpu.json   # smoke run

Writes ``results/precision_cpu.json`` (or ``--out``) and the PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from feature_dtype import HEADROOM, add_products_args, apply_quick, machine  # noqa: E402
from feature_dtype_cpu import (  # noqa: E402
    LOADER_THREAD,
    PHASE_NAMES,
    TRAINING_THREAD,
    epoch_phases,
    listed,
    median_of,
    run_child,
    stacked,
    title_of,
    write_partition,
)
from record import command_line  # noqa: E402

from distmb.cli.report import save_figure, write_json  # noqa: E402
from distmb.config.train import TrainConfig  # noqa: E402
from distmb.core.plotting import bar_axis, panels  # noqa: E402
from distmb.data.local import LocalGraph  # noqa: E402
from distmb.data.store.store import PartitionStore  # noqa: E402
from distmb.engine import Trainer  # noqa: E402
from distmb.nn.kernels.cpu_update import bf16_native  # noqa: E402

RESULTS = HERE.parent / "results"
#: The models measured (``--models``).
MODELS = ("sage", "gat")
#: ``--kernels`` values and ``--precision`` values measured; the first of each is the baseline.
KERNELS, PRECISIONS = ("fused", "torch"), ("fp32", "bf16")
#: The configuration every other is compared with (same model, same run).
BASELINE = "fused/fp32"
#: ``--quick``: one round of two epochs on a tiny products-shaped graph (the smoke test's run).
QUICK = {"nodes": 2000, "avg_degree": 8.0, "feat_dim": 16, "hidden": 16, "gat_hidden": 4,
         "batch_size": 64, "epochs": 2, "repeats": 1}  # fmt: skip
SEED = 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help=f"small run: {QUICK}")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    p.add_argument("--kernels", default=",".join(KERNELS),
                   help=f"comma-separated --kernels values, {KERNELS[0]} always")  # fmt: skip
    p.add_argument("--precisions", default=",".join(PRECISIONS),
                   help=f"comma-separated --precision values, {PRECISIONS[0]} always")  # fmt: skip
    p.add_argument("--repeats", type=int, default=2, help="rounds over the configurations")
    p.add_argument("--epochs", type=int, default=4, help="per run, the first reported apart")
    add_products_args(p, nodes=100_000)
    p.add_argument("--gat-hidden", type=int, default=64, help="GAT: width per head")
    p.add_argument("--heads", type=int, default=4, help="GAT: attention heads")
    p.add_argument("--workdir", type=Path, default=None,
                   help="the partition's folder (default: a temporary one)")  # fmt: skip
    p.add_argument("--out", type=Path, default=RESULTS / "precision_cpu.json",
                   help="JSON path (PNG beside it)")  # fmt: skip
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one run, JSON task
    args = p.parse_args(argv)
    if args.child is not None:
        return args
    apply_quick(p, args, QUICK)
    args.models = listed(p, "--models", args.models, MODELS)
    kernels = listed(p, "--kernels", args.kernels, KERNELS)
    precisions = listed(p, "--precisions", args.precisions, PRECISIONS)
    args.kernels = list(dict.fromkeys([KERNELS[0], *kernels]))
    args.precisions = list(dict.fromkeys([PRECISIONS[0], *precisions]))
    if args.epochs < 2:
        p.error(f"--epochs: {args.epochs}, need 2 or more (the first is reported apart)")
    if args.repeats < 1:
        p.error(f"--repeats: {args.repeats}, need 1 or more")
    if args.gat_hidden < 1 or args.heads < 1:
        p.error(f"--gat-hidden {args.gat_hidden} / --heads {args.heads}: need 1 or more")
    return args


def configurations(args: argparse.Namespace) -> list[str]:
    """``kernels/precision`` names, the baseline first."""
    return [f"{k}/{p}" for k in args.kernels for p in args.precisions]


def model_recipe(recipe: dict[str, Any], model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The products recipe (TrainConfig fields) for ``model``: GAT gets ``--heads`` heads of
    ``--gat-hidden`` columns."""
    if model == "gat":
        return {**recipe, "model": "gat", "hidden": args.gat_hidden, "heads": args.heads}
    return {**recipe, "model": model}


# -- one run (a child process) ---------------------------------------------------------------
def run_configuration(task: dict[str, Any]) -> dict[str, Any]:
    """One configuration's run (this process's only one): build the Trainer on the
    partition, train the recipe's epochs, record the phases and losses, evaluate when asked;
    the 1-minute load average before and after (other processes share the cores)."""
    loadavg_start = os.getloadavg()[0]
    local = LocalGraph.from_store(PartitionStore(task["part_dir"], 0))
    recipe = {**task["recipe"], "fanout": tuple(task["recipe"]["fanout"])}
    config = TrainConfig(**recipe, seed=SEED, progress=False, kernels=task["kernels"],
                         precision=task["precision"])  # fmt: skip
    start = time.perf_counter()
    trainer = Trainer(local, config, log=lambda _: None)
    setup_s = time.perf_counter() - start
    epochs = [epoch_phases(trainer.train_epoch(epoch)) for epoch in range(config.epochs)]
    return {
        "setup_s": round(setup_s, 3),
        "notes": list(trainer.parts.notes),
        "threads": torch.get_num_threads(),
        "epochs": epochs,
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg()[0],
        "evaluation": trainer.evaluate() if task["evaluate"] else None,
    }


# -- the sweep --------------------------------------------------------------------------------
def schedule(args: argparse.Namespace) -> list[tuple[int, str, str]]:
    """``(round, model, configuration)`` in run order: per round every model, the
    configurations rotated by the round (so none always runs first)."""
    names = configurations(args)
    order = []
    for repeat in range(args.repeats):
        shift = repeat % len(names)
        rotated = names[shift:] + names[:shift]
        order += [(repeat, model, name) for model in args.models for name in rotated]
    return order


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per model and configuration: phase medians (steady and first epochs), the ratio of each
    steady median to the baseline's, the last epoch's loss, the first round's accuracies."""
    out: dict[str, Any] = {}
    for model in args.models:
        per_config: dict[str, Any] = {}
        for name in configurations(args):
            mine = [r for r in runs if r["model"] == model and r["config"] == name]
            evaluated = next(r["evaluation"] for r in mine if r["evaluation"] is not None)
            losses = [r["epochs"][-1]["loss"] for r in mine]
            per_config[name] = {
                "kernels": mine[0]["kernels"],
                "precision": mine[0]["precision"],
                "steady": median_of([e for r in mine for e in r["epochs"][1:]]),
                "first_epoch": median_of([r["epochs"][0] for r in mine]),
                "steady_epochs": sum(len(r["epochs"]) - 1 for r in mine),
                "setup_s": statistics.median(r["setup_s"] for r in mine),
                "loadavg_median": statistics.median(
                    v for r in mine for v in (r["loadavg_start"], r["loadavg_end"])
                ),
                "loss_last_epoch": losses[0],
                "loss_same_across_rounds": len(set(losses)) == 1,
                "val_acc": evaluated["val_acc"],
                "test_acc": evaluated["test_acc"],
                "notes": mine[0]["notes"],
            }
        base = per_config[BASELINE]["steady"]
        for entry in per_config.values():
            entry["ratio_to_fused_fp32"] = {
                key: entry["steady"][key] / base[key] if base[key] > 0 else None for key in base
            }
        out[model] = per_config
    return out


def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """Write the partition, run every configuration (:func:`schedule`), summarise."""
    graph = write_partition(args, directory)
    recipe = graph.pop("recipe")
    runs = []
    for repeat, model, name in schedule(args):
        kernels, precision = name.split("/")
        task = {"part_dir": str(directory), "recipe": model_recipe(recipe, model, args),
                "kernels": kernels, "precision": precision, "evaluate": repeat == 0}  # fmt: skip
        start = time.perf_counter()
        child = run_child(Path(__file__), task, f"{model} {name}")
        record = {"round": repeat, "model": model, "config": name, "kernels": kernels,
                  "precision": precision, **child}  # fmt: skip
        record["seconds"] = round(time.perf_counter() - start, 2)
        runs.append(record)
        steady = statistics.median(e["epoch_time"] for e in record["epochs"][1:])
        loss = record["epochs"][-1]["loss"]
        print(f"round {repeat} {model} {name}: epoch {steady:.3f} s (steady median), "
              f"loss {loss:.4f} ({record['seconds']} s)", flush=True)  # fmt: skip
    recipes = {model: model_recipe(recipe, model, args) for model in args.models}
    return {"graph": graph, "recipes": recipes, "summary": summarize(runs, args), "runs": runs}


# -- the figure -------------------------------------------------------------------------------
def draw_epoch(ax: Any, model: str, result: dict[str, Any]) -> None:
    """Per configuration of ``model``: the steady epoch split on the training thread (sums to
    ``epoch_time``; labelled with its ratio to fused/fp32) and MBC on the loader's thread."""
    names = result["configurations"]
    summary = result["summary"][model]
    entries = [summary[name]["steady"] for name in names]
    width = 0.38
    left = [i - width / 2 for i in range(len(names))]
    stacked(ax, left, entries, TRAINING_THREAD, width, PHASE_NAMES, 0)
    stacked(ax, [i + width / 2 for i in range(len(names))], entries, LOADER_THREAD, width,
            PHASE_NAMES, len(TRAINING_THREAD))  # fmt: skip
    for x, name, entry in zip(left, names, entries, strict=True):
        ratio = summary[name]["ratio_to_fused_fp32"]["epoch_time"]
        ax.text(x, entry["epoch_time"], f"{entry['epoch_time']:.3g} s\n{ratio:.2f}x",
                ha="center", va="bottom", fontsize="x-small")  # fmt: skip
    ax.set_xticks(range(len(names)), [n.replace("/", "\n") for n in names])
    ax.set(title=f"{model}: steady epoch (median): training thread | loader thread\n"
           f"(epoch seconds, ratio to {BASELINE})", ylabel="seconds per epoch")  # fmt: skip
    bar_axis(ax, end=HEADROOM * max(max(e["epoch_time"], e["mbc"]) for e in entries))
    ax.legend(fontsize="x-small", ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.15))


def draw_accuracy(ax: Any, model: str, result: dict[str, Any]) -> None:
    """Per configuration of ``model``: the first round's test accuracy after its last epoch,
    labelled with that epoch's loss (the axis spans the values, not from zero)."""
    names = result["configurations"]
    summary = result["summary"][model]
    accuracy = [100 * summary[name]["test_acc"] for name in names]
    ax.plot(range(len(names)), accuracy, "o", color="C0")
    for x, name, acc in zip(range(len(names)), names, accuracy, strict=True):
        loss = summary[name]["loss_last_epoch"]
        ax.annotate(f"{acc:.2f} %\nloss {loss:.4f}", (x, acc), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize="x-small")  # fmt: skip
    low, high = min(accuracy), max(accuracy)
    pad = max(high - low, 0.2)
    top = min(high + pad, 100.0)  # an accuracy ends at 100 %
    ax.set_ylim(min(low, top - 2 * pad) - pad, top)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_xticks(range(len(names)), [n.replace("/", "\n") for n in names])
    ax.set(title=f"{model}: test accuracy after {result['epochs']} epochs, one seed\n"
           "(epoch loss; axis not from zero)", ylabel="test accuracy (%)")  # fmt: skip
    ax.grid(axis="y", alpha=0.3)


def plot(result: dict[str, Any], path: Path) -> None:
    """Per model: the epoch split (bars from zero) and the accuracy."""
    models = list(result["summary"])
    fig, axes = panels(2 * len(models), max_columns=2, panel_size=(6.0, 5.2))
    for i, model in enumerate(models):
        draw_epoch(axes[2 * i], model, result)
        draw_accuracy(axes[2 * i + 1], model, result)
    facts = result["machine"]
    products = "AVX512-BF16" if facts["bf16_native"] else "portable C++ (no AVX512-BF16)"
    graph = result["graph"]
    fig.suptitle(f"--precision on the CPU path, {graph['rows']} vertices x {graph['feat_dim']} "
                 f"features; fused bf16 products: {products}\n{title_of(facts)}",
                 fontsize="medium")  # fmt: skip
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_configuration(json.loads(args.child))), flush=True)
        return 0
    result: dict[str, Any] = {
        "benchmark": "precision_cpu",
        "command": command_line(argv, __file__),
        "machine": {
            **machine("cpu"),
            "bf16_native": bf16_native(),
            "torch_threads": torch.get_num_threads(),
        },  # fmt: skip
        "models": args.models,
        "configurations": configurations(args),
        "baseline": BASELINE,
        "repeats": args.repeats,
        "epochs": args.epochs,
        "seed": SEED,
    }
    start = time.perf_counter()
    if args.workdir is not None:
        result.update(measure(args, args.workdir / "partition"))
    else:
        with tempfile.TemporaryDirectory(prefix="precision_cpu-") as tmp:
            result.update(measure(args, Path(tmp) / "partition"))
    result["seconds"] = round(time.perf_counter() - start, 1)
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
