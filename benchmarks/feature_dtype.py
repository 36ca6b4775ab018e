"""What ``--feature-dtype`` costs in accuracy, and what it saves in host bytes per epoch.

The GPU path (``--device cuda``, or CPU tensors with ``--sampler device``) can store its
feature table (the pinned host rows it reads over PCIe, and its device cache) in float16 or
bfloat16: two bytes a value, the gathers returning float32 of the rounded values. Training
and evaluation (exact layer-wise inference, from the rank's host copy stored the same way)
read the rounded rows. Per dataset, ``--feature-dtype`` (float32, float16, bfloat16) and seed, one
:class:`distmb.engine.Trainer` run records per epoch the loss, the validation and test
accuracies and the device cache's counters (``device_cache``: ``bytes_h2d``,
``rows_loaded``, ``hits``, ``lookups``). Reported per dtype (``summary``): the last epoch's
test accuracy and the test accuracy of the best validation epoch (median and per seed, and
per seed the difference from float32's run of the same seed: same batches, same
initialisation), the last epoch's loss, and the host bytes a training epoch reads.

The device cache holds ``--cache-percent`` of the table's rows, sized two ways:

- ``same_rows``: the cache's MiB scaled by the dtype's bytes so that it holds the same rows
  as float32's (the GPU benchmark's ``cache10/.../float16`` runs): the same rows miss, so a
  two-byte table's host bytes are exactly half float32's (``exact_half`` checks every epoch);
- ``same_mib``: float32's MiB for every dtype (``--device-cache-mb`` left alone): a two-byte
  cache holds twice the rows, so fewer rows miss and the ratio is below 0.5.

A row's value is the same from the cache or from host memory, so both sizings train on the
same numbers (``accuracy_same_across_sizings`` checks the losses and accuracies).
``table_rounding``: the share of the table's values the dtype changes (and makes zero), the
median and largest relative error (of the table the device path stores: normalised first
where the recipe normalises).

Datasets: ``cora`` (the shipped Planetoid files, with the documented model-selection recipe
``distmb.config.recipes.CORA_SAGE_SELECTED``: row-normalised features, cosine schedule, up
to 100 epochs, early stop) and ``products`` (the GPU benchmark's products-shaped synthetic
graph, scaled to ``--nodes`` (default 100k), with its model: GraphSAGE 3 layers, hidden
256, fan-out 5,10,15, batch 1000, ``--epochs`` epochs). The synthetic graph is easy: its test
accuracy nears 99.5 % within 5 epochs, so there its losses are the finer comparison.

    python benchmarks/feature_dtype.py                  # CPU, --sampler device (~7 min, 2 cores)
    python benchmarks/feature_dtype.py --device cuda    # the same on a GPU
    python benchmarks/feature_dtype.py --quick --out /tmp/feature_dtype.json   # smoke run

Writes ``results/feature_dtype.json`` (``results/feature_dtype_cuda.json`` with
``--device cuda``) or ``--out``, and the PNG beside it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from record import command_line  # noqa: E402  (benchmarks/ is not a package)

from distmb.cli.report import save_figure, write_json  # noqa: E402
from distmb.config import recipes  # noqa: E402
from distmb.config.train import DEFAULT_FANOUT, TrainConfig  # noqa: E402
from distmb.core.machine import cpu_model  # noqa: E402
from distmb.core.plotting import bar_axis, panels  # noqa: E402
from distmb.data import load_dataset  # noqa: E402
from distmb.data.datasets.synthetic import SyntheticConfig, generate  # noqa: E402
from distmb.data.graph import Graph  # noqa: E402
from distmb.data.local import LocalGraph  # noqa: E402
from distmb.engine import Trainer  # noqa: E402
from distmb.pipeline.features.storage import STORAGE_DTYPES  # noqa: E402

RESULTS = HERE.parent / "results"
#: The baseline every other dtype is compared with.
BASELINE = "float32"
#: How the device cache of a two-byte table is sized (module docstring).
SIZINGS = ("same_rows", "same_mib")
#: The datasets (``--datasets``).
DATASETS = ("cora", "products")
#: ``--quick``: one seed, one epoch of a tiny products-shaped graph (the smoke test's run).
QUICK = {"datasets": "products", "seeds": "0", "nodes": 2000, "avg_degree": 8.0,
         "feat_dim": 16, "hidden": 16, "batch_size": 64, "epochs": 1}  # fmt: skip
#: Smallest span of an accuracy axis, percentage points: values that barely differ are not
#: blown up to the panel's height.
MIN_ACCURACY_SPAN = 2.0
#: The bar panels' axis end, as a multiple of the longest bar: room for the labels.
HEADROOM = 1.3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cuda = torch.cuda.is_available()
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if cuda else "cpu")
    p.add_argument("--quick", action="store_true", help=f"small run: {QUICK}")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated")
    p.add_argument("--dtypes", default=",".join(STORAGE_DTYPES),
                   help=f"comma-separated --feature-dtype values, {BASELINE} always")  # fmt: skip
    p.add_argument("--cache-percent", type=float, default=10.0,
                   help="rows of the table in the device cache (float32's MiB)")  # fmt: skip
    add_products_args(p, nodes=100_000)
    p.add_argument("--epochs", type=int, default=5, help="products")
    p.add_argument("--out", type=Path, default=None, help="JSON path (PNG beside it)")
    args = p.parse_args(argv)
    apply_quick(p, args, QUICK)
    if args.device == "cuda" and not cuda:
        p.error(f"--device cuda: torch {torch.__version__} sees no GPU")
    args.datasets = args.datasets.split(",")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.dtypes = list(dict.fromkeys([BASELINE, *args.dtypes.split(",")]))
    for name in args.datasets:
        if name not in DATASETS:
            p.error(f"--datasets: {name!r} is not one of {', '.join(DATASETS)}")
    for dtype in args.dtypes:
        if dtype not in STORAGE_DTYPES:
            p.error(f"--dtypes: {dtype!r} is not one of {', '.join(STORAGE_DTYPES)}")
    if args.out is None:
        args.out = RESULTS / ("feature_dtype.json" if args.device == "cpu" else
                              "feature_dtype_cuda.json")  # fmt: skip
    return args


def add_products_args(p: argparse.ArgumentParser, nodes: int) -> None:
    """The products-shaped graph's flags (:func:`products_spec`) and its model's
    (:func:`dataset`): ``--nodes`` (default ``nodes``), ``--avg-degree``, ``--feat-dim``,
    ``--classes``, ``--train-fraction``, ``--hidden``, ``--batch-size``."""
    p.add_argument("--nodes", type=int, default=nodes, help="products: vertices")
    p.add_argument("--avg-degree", type=float, default=26.0, help="products")
    p.add_argument("--feat-dim", type=int, default=100, help="products")
    p.add_argument("--classes", type=int, default=47, help="products")
    p.add_argument("--train-fraction", type=float, default=0.08, help="products")
    p.add_argument("--hidden", type=int, default=256, help="products")
    p.add_argument("--batch-size", type=int, default=1000, help="products")


def apply_quick(p: argparse.ArgumentParser, args: argparse.Namespace, quick: dict) -> None:
    """With ``--quick``, the values of ``quick`` for the flags left at their defaults (flags
    given explicitly win)."""
    if args.quick:
        for key, value in quick.items():
            if p.get_default(key) == getattr(args, key):
                setattr(args, key, value)


def machine(device: str) -> dict[str, Any]:
    """The CPU's model and cores, the torch version, the device (and the GPU's name)."""
    facts: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
    }
    if device == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["cuda"] = torch.version.cuda
    return facts


def products_spec(args: argparse.Namespace) -> str:
    """The GPU benchmark's products-shaped graph (``benchmarks/gpu.py``), ``--nodes``
    vertices: half of them test vertices, the shape's 5 % validation ones."""
    return (
        f"shape=products,nodes={args.nodes},avg_degree={args.avg_degree},"
        f"feat_dim={args.feat_dim},classes={args.classes},"
        f"train_fraction={args.train_fraction},test_fraction=0.5,seed=0"
    )


def dataset(name: str, args: argparse.Namespace) -> tuple[str, Graph, dict[str, Any]]:
    """``(spec, graph, recipe)`` of dataset ``name`` (``recipe``: TrainConfig fields)."""
    if name == "cora":
        return "cora", load_dataset("cora"), dict(recipes.CORA_SAGE_SELECTED)
    spec = products_spec(args)
    recipe = dict(layers=len(DEFAULT_FANOUT), fanout=tuple(DEFAULT_FANOUT), hidden=args.hidden,
                  batch_size=args.batch_size, epochs=args.epochs)  # fmt: skip
    return f"synthetic:{spec}", generate(SyntheticConfig.from_spec(spec)), recipe


def dataset_record(spec: str, recipe: dict[str, Any], graph: Graph) -> dict[str, Any]:
    """A dataset's part of the record: its spec, its recipe (tuples as lists, for JSON) and
    its graph's vertices, in-edges and features."""
    return {
        "spec": spec,
        "recipe": {k: list(v) if isinstance(v, tuple) else v for k, v in recipe.items()},
        "graph": {
            "nodes": graph.num_nodes,
            "in_edges": int(graph.indices.size),
            "feat_dim": int(graph.features.shape[1]),
        },
    }


def cache_rows_of(num_rows: int, percent: float) -> int:
    """Rows a cache of ``percent`` of a ``num_rows``-row table holds (rounded down, as a
    float32 cache of that share's MiB does)."""
    return int(num_rows * percent / 100)


def cache_mib(rows: int, dim: int, itemsize: int) -> float:
    """MiB of ``rows`` rows of ``dim`` values of ``itemsize`` bytes: exactly that many rows
    (a power-of-two division: ``cache_mib * 2**20`` is the bytes again, no rounding)."""
    return rows * dim * itemsize / 2**20


def train(
    graph: Graph, recipe: dict[str, Any], device: str, dtype: str, mib: float, seed: int
) -> tuple[list[dict[str, Any]], Trainer]:
    """One run on the GPU path (``--sampler device`` on ``device``): the per-epoch records
    and the trainer."""
    config = TrainConfig(**recipe, seed=seed, progress=False, device=device, sampler="device",
                         device_cache_mb=mib, feature_dtype=dtype)  # fmt: skip
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    return trainer.fit(), trainer


def run_record(
    history: list[dict[str, Any]], trainer: Trainer, dtype: str, sizing: str, seed: int
) -> dict[str, Any]:
    """A run's settings, its cache (``device_cache_mb``: the flag; ``cache_memory_bytes``:
    the cached rows and the directory) and its per-epoch numbers (the device cache's
    counters of the training gathers)."""
    cache = trainer.parts.device_stages.device_cache
    last = history[-1]
    epochs = ("loss", "val_acc", "test_acc")
    counters = ("bytes_h2d", "rows_loaded", "hits", "lookups")
    return {
        "dtype": dtype,
        "sizing": sizing,
        "seed": seed,
        "device_cache_mb": trainer.cfg.device_cache_mb,
        "cache_rows": int(cache.capacity),
        "cache_memory_bytes": int(cache.memory_bytes),
        "epochs_run": len(history),
        **{f"{key}_per_epoch": [r[key] for r in history] for key in epochs},
        **{f"{key}_per_epoch": [r["device_cache"][key] for r in history] for key in counters},
        "loss": last["loss"],
        "test_acc": last["test_acc"],
        "best_test_acc": last["best_test_acc"],
        "best_epoch": last["best_epoch"],
    }


def table_rounding(table: torch.Tensor, dtypes: list[str]) -> dict[str, dict[str, float]]:
    """Per dtype, over ``table``'s values (float32[rows, dim]): the share it changes, of all
    and of the non-zero ones (zeros are exact in every dtype), the share of non-zero ones it
    makes zero (below float16's smallest subnormal, 6e-8), and the median and largest
    relative error of the non-zero ones (a value made zero has error 1)."""
    out = {}
    nonzero = table != 0
    for name in dtypes:
        rounded = table.to(STORAGE_DTYPES[name]).float()
        error = (rounded - table).abs()
        relative = error[nonzero] / table.abs()[nonzero]
        zeroed = rounded[nonzero] == 0
        empty = not relative.numel()
        out[name] = {
            "changed_fraction": float((error != 0).float().mean()),
            "changed_fraction_of_nonzero": 0.0 if empty else float((relative != 0).float().mean()),
            "zeroed_fraction_of_nonzero": 0.0 if empty else float(zeroed.float().mean()),
            "median_relative_error": 0.0 if empty else float(relative.median()),
            "max_relative_error": 0.0 if empty else float(relative.max()),
        }  # fmt: skip
    return out


def spread(values: list[float]) -> dict[str, Any]:
    """Median, per-seed values, and range of ``values``."""
    return {"median": statistics.median(values), "per_seed": values,
            "range": max(values) - min(values)}  # fmt: skip


def bytes_ratio(run: dict[str, Any], base: dict[str, Any]) -> tuple[float, bool]:
    """``run``'s host bytes over ``base``'s (the same seed's float32 run) over the epochs
    both trained, and whether every such epoch moved exactly half of ``base``'s bytes."""
    common = min(run["epochs_run"], base["epochs_run"])
    mine, theirs = run["bytes_h2d_per_epoch"][:common], base["bytes_h2d_per_epoch"][:common]
    exact = all(2 * a == b for a, b in zip(mine, theirs, strict=True))
    return sum(mine) / sum(theirs), exact


def summarize(runs: list[dict[str, Any]], dtypes: list[str], seeds: list[int]) -> dict:
    """Per sizing and dtype: accuracies, loss, bytes per epoch and their ratio to float32
    (float32 is the same run under both sizings)."""
    base = {r["seed"]: r for r in runs if r["dtype"] == BASELINE}
    out: dict[str, Any] = {}
    for sizing in SIZINGS:
        per_dtype = {}
        for dtype in dtypes:
            mine = [r for r in runs if r["dtype"] == dtype and r["sizing"] in (sizing, "both")]
            mine.sort(key=lambda r: seeds.index(r["seed"]))
            ratios = [bytes_ratio(r, base[r["seed"]]) for r in mine]
            rates = [sum(r["hits_per_epoch"]) / sum(r["lookups_per_epoch"]) for r in mine]
            epoch_bytes = [statistics.mean(r["bytes_h2d_per_epoch"]) for r in mine]
            per_dtype[dtype] = {
                "cache_rows": mine[0]["cache_rows"],
                "device_cache_mb": mine[0]["device_cache_mb"],
                "test_acc_last_epoch": spread([r["test_acc"] for r in mine]),
                "test_acc_best_val_epoch": spread([r["best_test_acc"] for r in mine]),
                "best_epoch": [r["best_epoch"] for r in mine],
                "epochs_run": [r["epochs_run"] for r in mine],
                "loss_last_epoch": spread([r["loss"] for r in mine]),
                "diff_vs_float32_per_seed": {
                    key: [r[key] - base[r["seed"]][key] for r in mine]
                    for key in ("test_acc", "best_test_acc", "loss")
                },
                "bytes_h2d_per_epoch": spread(epoch_bytes),
                "hit_rate": spread(rates),
                "bytes_ratio_to_float32": [ratio for ratio, _ in ratios],
                "exact_half": None if dtype == BASELINE else all(ok for _, ok in ratios),
            }
        out[sizing] = per_dtype
    return out


def same_numbers(runs: list[dict[str, Any]]) -> bool:
    """Whether each dtype's and seed's two sizings trained and evaluated alike (losses and
    accuracies per epoch)."""
    keys = ("loss_per_epoch", "val_acc_per_epoch", "test_acc_per_epoch")
    pairs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in runs:
        pairs.setdefault((r["dtype"], r["seed"]), []).append(r)
    return all(all(p[0][k] == q[k] for q in p[1:] for k in keys) for p in pairs.values())


def measure_dataset(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every dtype, sizing and seed of dataset ``name``: its runs and their summary."""
    spec, graph, recipe = dataset(name, args)
    dim = int(graph.features.shape[1])
    rows = cache_rows_of(graph.num_nodes, args.cache_percent)
    float32_mib = cache_mib(rows, dim, STORAGE_DTYPES[BASELINE].itemsize)
    runs, rounding = [], None
    for seed in args.seeds:
        for dtype in args.dtypes:
            itemsize = STORAGE_DTYPES[dtype].itemsize
            sizings = {"both": float32_mib} if dtype == BASELINE else {
                "same_rows": cache_mib(rows, dim, itemsize), "same_mib": float32_mib}  # fmt: skip
            for sizing, mib in sizings.items():
                t0 = time.perf_counter()
                history, trainer = train(graph, recipe, args.device, dtype, mib, seed)
                record = run_record(history, trainer, dtype, sizing, seed)
                if sizing != "same_mib" and record["cache_rows"] != rows:
                    raise RuntimeError(f"{dtype} cache holds {record['cache_rows']} rows, "
                                       f"not {rows}")  # fmt: skip
                if rounding is None:  # the table the device path stores, before its dtype
                    stored = trainer.parts.device_stages.device_cache.host.view.float().cpu()
                    rounding = table_rounding(stored, args.dtypes)
                record["seconds"] = round(time.perf_counter() - t0, 2)
                runs.append(record)
                print(f"{name} {dtype} {sizing} seed {seed}: loss {record['loss']:.4f} "
                      f"test {record['test_acc']:.4f} best-val test {record['best_test_acc']:.4f}"
                      f" bytes/epoch {statistics.mean(record['bytes_h2d_per_epoch']):.0f} "
                      f"({record['seconds']} s)", flush=True)  # fmt: skip
    return {
        **dataset_record(spec, recipe, graph),
        "cache_percent": args.cache_percent,
        "cache_rows_float32": rows,
        "table_rounding": rounding,
        "accuracy_same_across_sizings": same_numbers(runs),
        "summary": summarize(runs, args.dtypes, args.seeds),
        "runs": runs,
    }


def machine_title(facts: dict[str, Any]) -> str:
    """``Intel(R) Xeon(R) ..., 2 cores, torch 2.x, --device cpu --sampler device``."""
    where = facts.get("gpu") or facts["cpu"]
    return (f"{where}, {facts['cpus']} cores, torch {facts['torch']}, "
            f"--device {facts['device']} --sampler device")  # fmt: skip


def draw_accuracy(
    ax: Any, name: str, summary: dict[str, Any], columns: list[str], labels: list[str] | None = None
) -> None:
    """Per column of ``summary`` (a dtype, or a precision; the first is the baseline): each
    seed's test accuracy at the best validation epoch and at the last epoch, their medians
    as bars across, and the baseline's seed range shaded. ``labels``: the columns' tick
    labels (default their keys). The axis spans the values (it does not start at zero):
    read it by its tick labels. Also drawn by ``tf32_emulated.py``."""
    baseline = columns[0]
    series = (("test_acc_best_val_epoch", "best-val epoch", "o", -0.12),
              ("test_acc_last_epoch", "last epoch", "s", 0.12))  # fmt: skip
    for i, (key, label, marker, offset) in enumerate(series):
        base = summary[baseline][key]["per_seed"]
        ax.axhspan(100 * min(base), 100 * max(base), color=f"C{i}", alpha=0.12,
                   label=f"{baseline} seeds' range, {label}")  # fmt: skip
        for x, column in enumerate(columns):
            values = [100 * v for v in summary[column][key]["per_seed"]]
            ax.scatter([x + offset] * len(values), values, marker=marker, color=f"C{i}",
                       alpha=0.7, label=label if x == 0 else None, zorder=3)  # fmt: skip
            median = 100 * summary[column][key]["median"]
            ax.hlines(median, x + offset - 0.1, x + offset + 0.1, color="k", zorder=4,
                      label="median" if x == 0 and i == 0 else None)  # fmt: skip
    ax.set_xticks(range(len(columns)), labels or columns)
    ax.set_xlim(-0.5, len(columns) - 0.5)
    low, high = ax.get_ylim()
    span = max(high - low, MIN_ACCURACY_SPAN)
    top = min((low + high + span) / 2, 100.0)  # an accuracy ends at 100 %
    ax.set_ylim(top - span, top)
    seeds = len(summary[baseline]["test_acc_last_epoch"]["per_seed"])
    ax.set(title=f"{name}: test accuracy, {seeds} seed{'s' * (seeds > 1)} "
           "(axis not from zero)", ylabel="test accuracy (%)")  # fmt: skip
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="x-small", ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.08))


def draw_bytes(ax: Any, name: str, data: dict[str, Any], dtypes: list[str]) -> None:
    """Per dtype: host bytes a training epoch reads (median over seeds), the cache holding
    the same rows and the same MiB, labelled with the ratio to float32 and the hit rate."""
    width = 0.38
    ends = []
    for i, sizing in enumerate(SIZINGS):
        summary = data["summary"][sizing]
        values = [summary[d]["bytes_h2d_per_epoch"]["median"] / 2**20 for d in dtypes]
        labels = [f"{statistics.median(summary[d]['bytes_ratio_to_float32']):.3g}x\n"
                  f"hit {100 * summary[d]['hit_rate']['median']:.0f}%" for d in dtypes]  # fmt: skip
        label = "cache: same rows" if sizing == "same_rows" else "cache: same MiB"
        bars = ax.bar([x + (i - 0.5) * width for x in range(len(dtypes))], values, width,
                      label=label)  # fmt: skip
        ax.bar_label(bars, labels, fontsize="x-small", padding=2)
        ends += values
    ax.set_xticks(range(len(dtypes)), dtypes)
    ax.set(title=f"{name}: host bytes per training epoch\n(ratio to float32, cache hit rate)",
           ylabel="MiB read from host memory / epoch")  # fmt: skip
    bar_axis(ax, end=HEADROOM * max(ends))
    ax.legend(fontsize="x-small", loc="upper right")


#: ``draw(left_ax, right_ax, name, data)``: a dataset's two panels.
DrawPair = Callable[[Any, Any, str, dict[str, Any]], None]


def plot_pairs(result: dict[str, Any], path: Path, draw: DrawPair, title: str) -> None:
    """Two panels per dataset of ``result["datasets"]`` (``draw``), two datasets a row, the
    figure titled ``title``, saved to ``path``."""
    names = list(result["datasets"])
    fig, axes = panels(2 * len(names), max_columns=2, panel_size=(5.5, 4.5))
    for i, name in enumerate(names):
        draw(axes[2 * i], axes[2 * i + 1], name, result["datasets"][name])
    fig.suptitle(title, fontsize="medium")
    save_figure(fig, path)


def plot(result: dict[str, Any], path: Path) -> None:
    """Accuracy (dot plot) and bytes per epoch (bars from zero) per dataset."""
    dtypes = result["dtypes"]

    def draw(left: Any, right: Any, name: str, data: dict[str, Any]) -> None:
        draw_accuracy(left, name, data["summary"]["same_rows"], dtypes)
        draw_bytes(right, name, data, dtypes)

    plot_pairs(result, path, draw, f"--feature-dtype: {machine_title(result['machine'])}")


def measure_and_write(
    result: dict[str, Any],
    args: argparse.Namespace,
    measure: Callable[[str, argparse.Namespace], dict[str, Any]],
    draw: Callable[[dict[str, Any], Path], None],
) -> int:
    """Fill ``result["datasets"]`` with ``measure(name, args)`` per ``args.datasets`` and its
    ``"seconds"``, write it to ``args.out`` and its figure (``draw``) beside it. Also the
    end of ``tf32_emulated.py``'s run."""
    start = time.perf_counter()
    for name in args.datasets:
        result["datasets"][name] = measure(name, args)
    result["seconds"] = round(time.perf_counter() - start, 1)
    write_json(args.out, result)
    draw(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {
        "benchmark": "feature_dtype",
        "command": command_line(argv, __file__),
        "machine": machine(args.device),
        "sampler": "device",
        "seeds": args.seeds,
        "dtypes": args.dtypes,
        "sizings": {
            "same_rows": "the cache holds float32's rows (its MiB scaled by the dtype's bytes)",
            "same_mib": "the cache has float32's MiB (a two-byte table caches twice the rows)",
        },  # fmt: skip
        "datasets": {},
    }
    return measure_and_write(result, args, measure_dataset, plot)


if __name__ == "__main__":
    raise SystemExit(main())
