"""What ``--feature-dtype`` costs in epoch time and saves in memory on the CPU (C++) path.

With ``--feature-dtype float16`` or ``bfloat16`` a rank stores its partition's float32
feature table in two bytes a value: ``open_features`` converts it chunk by chunk into a new
CPU tensor (``stored_rows``). The fused GraphSAGE first layer reads block 0's neighbour rows
in place through their ids, as from a float32 table (the aggregation kernel widens each
value as it reads it); the loader gathers only the destinations' own rows (``index_select``
in the stored dtype, then a cast), as at float32. So the rows the first layer reads move
half the bytes, and the table the rank holds is half float32's.

The graph is feature_dtype.py's products-shaped synthetic graph (``--nodes`` vertices,
default 400k, 100 features), written as a one-part partition (``distmb.partition``, npy
layout) and read back with ``LocalGraph.from_store`` like ``--part-dir``; the model is
feature_dtype.py's products model (GraphSAGE, 3 layers, hidden 256, fan-out 5,10,15, batch
1000), one seed. Per ``--features`` (``mmap``, ``memory``) and ``--dtypes`` dtype, each
configuration runs ``--epochs`` training epochs (``Trainer.train_epoch``) in a process of
its own, so that its memory counters are its own; the configurations are interleaved over
``--repeats`` rounds (each round rotates the dtypes' order) so the shared machine's noise
falls on all alike, and the partition's files are evicted from the page cache
(``posix_fadvise(DONTNEED)``) before each, so every one starts cold. Recorded per epoch:
``epoch_time`` and its phases (the Trainer's epoch record): on the training thread FWD,
BWD, OPT, ``load_wait`` (waiting for the loader) and ``other`` (the rest of
``epoch_time``); on the loader's prefetch thread, overlapping them, MBC = ``sample`` +
``gather``. ``summary``: per configuration the medians over the steady epochs (every epoch
but each process's first) of all rounds, the first epochs' medians apart, and each dtype's
ratio to float32's median of the same ``--features`` measured in this run.

Memory, per configuration:

- ``table``: the feature source's table (solid and halo rows): its ``bytes``, of which
  ``in_ram_bytes`` lie in the process's own (anonymous) memory, a stored two-byte tensor or
  a float32 array read into RAM, and ``page_cache_bytes`` are a memory-mapped file's (the
  OS page cache holds them: evictable, at the price of disk reads when read again; a float32
  table that ``--features memory`` leaves memory-mapped counts here too).
- ``rss``: ``RssAnon`` and ``RssFile`` of ``/proc/self/status`` at ``start`` (after the
  imports), ``setup`` (the Trainer built, the table converted) and ``last_epoch``, and
  ``evaluated`` where the run evaluated. ``RssAnon``: resident anonymous memory, the
  process's own (heap, tensors; ``--malloc retain``, the default, keeps freed heap mapped, so
  after an epoch it stays near the epoch's peak, gather buffers and activations included).
  ``RssFile``: resident pages of mapped files (the memory-mapped partition arrays and the
  shared libraries) that this process touched: clean page-cache pages, reclaimable.

The first round's runs also evaluate (``Trainer.evaluate``: exact layer-wise inference) and
every run checks 1000 gathered rows against the float32 table rounded to its dtype: a
sanity check that the rounding leaves the result alone (feature_dtype.py studies accuracy).

    python benchmarks/feature_dtype_cpu.py                 # ~10 min on 2 cores (--repeats 2: 7)
    python benchmarks/feature_dtype_cpu.py --quick --out /tmp/feature_dtype_cpu.json   # smoke

Writes ``results/feature_dtype_cpu.json`` (or ``--out``) and the PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from feature_dtype import (  # noqa: E402
    BASELINE,
    HEADROOM,
    add_products_args,
    apply_quick,
    dataset,
    machine,
)
from record import command_line  # noqa: E402

from distmb.cli.report import save_figure, write_json  # noqa: E402
from distmb.config.train import TrainConfig  # noqa: E402
from distmb.core.plotting import bar_axis, panels  # noqa: E402
from distmb.data.local import LocalGraph  # noqa: E402
from distmb.data.store.rowfile import evict_page_cache  # noqa: E402
from distmb.data.store.store import PartitionStore  # noqa: E402
from distmb.engine import Trainer  # noqa: E402
from distmb.engine.timers import PHASE_LABELS  # noqa: E402
from distmb.partition import partition_graph  # noqa: E402
from distmb.pipeline.features.memory import ArrayFeatures, PartFeatures  # noqa: E402
from distmb.pipeline.features.storage import STORAGE_DTYPES, file_backed  # noqa: E402

RESULTS = HERE.parent / "results"
#: ``--features`` values measured (``ooc`` serves float32 only).
FEATURE_KINDS = ("mmap", "memory")
#: ``--quick``: one round of two epochs on a tiny products-shaped graph (the smoke test's run).
QUICK = {"nodes": 2000, "avg_degree": 8.0, "feat_dim": 16, "hidden": 16, "batch_size": 64,
         "epochs": 2, "repeats": 1}  # fmt: skip
#: The epoch record's seconds kept per epoch (``other``: the rest of ``epoch_time``).
PHASE_KEYS = ("epoch_time", "mbc", "sample", "gather", "fwd", "bwd", "ared", "opt", "load_wait")
#: The training thread's share of ``epoch_time``, stacked in the figure (sums to it with
#: ``ared``, the gradient all-reduce: zero on one rank).
TRAINING_THREAD = ("fwd", "bwd", "opt", "load_wait", "other")
#: The loader thread's phases (MBC), stacked beside it.
LOADER_THREAD = ("sample", "gather")
#: The figure's names of the phases.
PHASE_NAMES = {
    **{phase: PHASE_LABELS[phase] for phase in ("fwd", "bwd", "opt")},
    "load_wait": "waiting for the loader",
    "other": "other",
    "sample": "MBC: sample (loader thread)",
    "gather": "MBC: gather (loader thread)",
}
#: The ``/proc/self/status`` fields recorded.
RSS_FIELDS = ("RssAnon", "RssFile")
#: Rows compared with the float32 table rounded to the stored dtype.
CHECKED_ROWS = 1000
SEED = 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help=f"small run: {QUICK}")
    p.add_argument("--dtypes", default="float32,bfloat16,float16",
                   help=f"comma-separated --feature-dtype values, {BASELINE} always")  # fmt: skip
    p.add_argument("--features", default=",".join(FEATURE_KINDS), help="comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="rounds over the configurations")
    p.add_argument("--epochs", type=int, default=3, help="per run, the first reported apart")
    add_products_args(p, nodes=400_000)
    p.add_argument("--workdir", type=Path, default=None,
                   help="the partition's folder (default: a temporary one)")  # fmt: skip
    p.add_argument("--out", type=Path, default=RESULTS / "feature_dtype_cpu.json",
                   help="JSON path (PNG beside it)")  # fmt: skip
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one run, JSON task
    args = p.parse_args(argv)
    if args.child is not None:
        return args
    apply_quick(p, args, QUICK)
    dtypes = listed(p, "--dtypes", args.dtypes, tuple(STORAGE_DTYPES))
    args.dtypes = list(dict.fromkeys([BASELINE, *dtypes]))
    args.features = listed(p, "--features", args.features, FEATURE_KINDS)
    if args.epochs < 2:
        p.error(f"--epochs: {args.epochs}, need 2 or more (the first is reported apart)")
    if args.repeats < 1:
        p.error(f"--repeats: {args.repeats}, need 1 or more")
    return args


def listed(
    p: argparse.ArgumentParser, flag: str, value: str, allowed: tuple[str, ...]
) -> list[str]:
    """The comma-separated names of ``flag``'s ``value``, each one of ``allowed`` (else
    ``p.error`` naming the flag)."""
    names = value.split(",")
    for name in names:
        if name not in allowed:
            p.error(f"{flag}: {name!r} is not one of {', '.join(allowed)}")
    return names


# -- one run (a child process) ---------------------------------------------------------------
def rss_bytes() -> dict[str, int]:
    """``RssAnon`` and ``RssFile`` of ``/proc/self/status``, bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in RSS_FIELDS:
                out[key] = int(value.split()[0]) * 1024  # "12345 kB"
    if set(out) != set(RSS_FIELDS):
        raise RuntimeError(f"/proc/self/status lacks {set(RSS_FIELDS) - set(out)}")
    return out


def table_memory(source: PartFeatures) -> dict[str, Any]:
    """The bytes of the tables under ``source`` (its solid and halo rows): all of them, those
    in the process's own memory (a tensor, an array read into RAM) and those of a mapped file
    (held by the page cache); their rows, width and stored dtype."""
    parts = (source.head, source.tail)
    if not all(isinstance(p, ArrayFeatures) for p in parts):
        raise TypeError(f"expected in-memory or memory-mapped tables, got {parts}")
    total = in_ram = 0
    dtypes = set()
    for part in parts:
        table = part.table  # type: ignore[attr-defined]
        nbytes = int(table.nbytes)
        total += nbytes
        mapped = isinstance(table, np.ndarray) and file_backed(table)
        in_ram += 0 if mapped else nbytes
        if part.num_rows:
            dtypes.add(str(table.dtype).removeprefix("torch."))
    return {
        "dtype": ",".join(sorted(dtypes)),
        "rows": source.num_rows,
        "dim": source.dim,
        "bytes": total,
        "in_ram_bytes": in_ram,
        "page_cache_bytes": total - in_ram,
    }


def rows_match(source: PartFeatures, local: LocalGraph, dtype: str) -> bool:
    """Whether :data:`CHECKED_ROWS` random rows gathered from ``source`` equal the
    partition's float32 rows rounded to ``dtype``."""
    rng = np.random.default_rng(SEED)
    ids = np.sort(rng.choice(local.n_solid, min(CHECKED_ROWS, local.n_solid), replace=False))
    expected = torch.from_numpy(np.array(local.features[ids], dtype=np.float32))
    expected = expected.to(STORAGE_DTYPES[dtype]).float()
    return bool(torch.equal(source.gather(ids), expected))


def epoch_phases(record: dict[str, Any]) -> dict[str, float]:
    """An epoch record's seconds (:data:`PHASE_KEYS`, ``other``) and loss."""
    phases = {key: float(record[key]) for key in PHASE_KEYS}
    busy = phases["ared"] + sum(phases[key] for key in TRAINING_THREAD if key != "other")
    phases["other"] = round(phases["epoch_time"] - busy, 4)
    return {**phases, "loss": float(record["loss"])}


def run_configuration(task: dict[str, Any]) -> dict[str, Any]:
    """One configuration's run (this process's only one): build the Trainer on the
    partition, train the recipe's epochs, record the memory counters and phases, check
    rows, evaluate when asked."""
    rss = {"start": rss_bytes()}
    local = LocalGraph.from_store(PartitionStore(task["part_dir"], 0))
    recipe = {**task["recipe"], "fanout": tuple(task["recipe"]["fanout"])}
    config = TrainConfig(**recipe, seed=SEED, progress=False,
                         features=task["features"], feature_dtype=task["dtype"])  # fmt: skip
    start = time.perf_counter()
    trainer = Trainer(local, config, log=lambda _: None)
    setup_s = time.perf_counter() - start
    rss["setup"] = rss_bytes()
    epochs = [epoch_phases(trainer.train_epoch(epoch)) for epoch in range(config.epochs)]
    rss["last_epoch"] = rss_bytes()
    source = trainer.parts.feature_sources.train
    record = {
        "setup_s": round(setup_s, 3),
        "note": trainer.parts.feature_sources.note,
        "table": table_memory(source),
        "block0_in_place": source.rows_in_place(np.zeros(1, np.int64)) is not None,
        "rows_match_rounded_float32": rows_match(source, local, task["dtype"]),
        "epochs": epochs,
        "evaluation": None,
        "rss": rss,
    }
    if task["evaluate"]:
        record["evaluation"] = trainer.evaluate()
        rss["evaluated"] = rss_bytes()
    return record


def spawn(task: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_configuration` of ``task`` in a new process (its last stdout line)."""
    return run_child(Path(__file__), task, f"{task['features']}/{task['dtype']}")


def run_child(script: Path, task: dict[str, Any], name: str) -> dict[str, Any]:
    """``script --child <task as JSON>`` in a new process: the JSON of its last stdout line
    (a RuntimeError naming the configuration ``name``, with the end of its stderr, if it
    fails). Also ``precision_cpu.py``'s runs."""
    command = [sys.executable, str(script.resolve()), "--child", json.dumps(task)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the sweep --------------------------------------------------------------------------------
def write_partition(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """The products-shaped graph as a one-part partition in ``directory``; its spec, recipe
    and shape. Opening it once here verifies and stamps it, so the runs do not."""
    spec, graph, recipe = dataset("products", args)
    partition_graph(graph, 1, directory, seed=SEED, overwrite=True)
    recipe = {k: list(v) if isinstance(v, tuple) else v for k, v in recipe.items()}
    info = {"spec": spec, "recipe": recipe, "in_edges": int(graph.indices.size)}
    del graph
    store = PartitionStore(directory, 0)
    features = directory / "part-0" / "features.npy"
    info.update(rows=int(store.features.shape[0]), feat_dim=int(store.features.shape[1]),
                train_vertices=int(store.train_idx.size),
                feature_file_bytes=features.stat().st_size)  # fmt: skip
    return info


def schedule(args: argparse.Namespace) -> list[tuple[int, str, str]]:
    """``(round, features, dtype)`` in run order: per round every ``--features``, the dtypes
    rotated by the round (so no dtype always runs first)."""
    order = []
    for repeat in range(args.repeats):
        shift = repeat % len(args.dtypes)
        dtypes = args.dtypes[shift:] + args.dtypes[:shift]
        order += [(repeat, kind, dtype) for kind in args.features for dtype in dtypes]
    return order


def evict_partition(directory: Path) -> None:
    """Drop the partition's files from the page cache."""
    for path in sorted(directory.rglob("*.npy")):
        evict_page_cache(path)


def median_of(epochs: list[dict[str, float]]) -> dict[str, float]:
    """Per key of :data:`PHASE_KEYS` and ``other``: the median over ``epochs``."""
    return {key: statistics.median(e[key] for e in epochs) for key in (*PHASE_KEYS, "other")}


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per ``--features`` and dtype: phase medians (steady and first epochs), the ratio of
    each steady median to float32's, the table's bytes, the RSS medians over rounds, the
    losses and the first round's accuracies."""
    out: dict[str, Any] = {}
    for kind in args.features:
        per_dtype: dict[str, Any] = {}
        for dtype in args.dtypes:
            mine = [r for r in runs if r["features"] == kind and r["dtype"] == dtype]
            tables = {json.dumps(r["table"], sort_keys=True) for r in mine}
            if len(tables) != 1:
                raise RuntimeError(f"{kind}/{dtype}: the table differs across rounds: {tables}")
            evaluated = next(r["evaluation"] for r in mine if r["evaluation"] is not None)
            losses = [r["epochs"][-1]["loss"] for r in mine]
            per_dtype[dtype] = {
                "steady": median_of([e for r in mine for e in r["epochs"][1:]]),
                "first_epoch": median_of([r["epochs"][0] for r in mine]),
                "steady_epochs": sum(len(r["epochs"]) - 1 for r in mine),
                "setup_s": statistics.median(r["setup_s"] for r in mine),
                "table": mine[0]["table"],
                "block0_in_place": all(r["block0_in_place"] for r in mine),
                "rows_match_rounded_float32": all(r["rows_match_rounded_float32"] for r in mine),
                "rss": {
                    stage: {
                        field: statistics.median(r["rss"][stage][field] for r in mine)
                        for field in RSS_FIELDS
                    }
                    for stage in ("start", "setup", "last_epoch")
                },
                "loss_last_epoch": losses[0],
                "loss_same_across_rounds": len(set(losses)) == 1,
                "val_acc": evaluated["val_acc"],
                "test_acc": evaluated["test_acc"],
            }
        base = per_dtype[BASELINE]["steady"]
        for entry in per_dtype.values():
            entry["ratio_to_float32"] = {
                key: entry["steady"][key] / base[key] if base[key] > 0 else None for key in base
            }
        out[kind] = per_dtype
    return out


def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """Write the partition, run every configuration (:func:`schedule`), summarise."""
    graph = write_partition(args, directory)
    runs = []
    for repeat, kind, dtype in schedule(args):
        task = {"part_dir": str(directory), "features": kind, "dtype": dtype,
                "recipe": graph["recipe"], "evaluate": repeat == 0}  # fmt: skip
        evict_partition(directory)
        start = time.perf_counter()
        record = {"round": repeat, "features": kind, "dtype": dtype, **spawn(task)}
        record["seconds"] = round(time.perf_counter() - start, 2)
        runs.append(record)
        steady = statistics.median(e["epoch_time"] for e in record["epochs"][1:])
        print(f"round {repeat} {kind}/{dtype}: epoch {steady:.3f} s (steady median), table "
              f"{record['table']['in_ram_bytes'] / 2**20:.1f} MiB in RAM, RssAnon "
              f"{record['rss']['last_epoch']['RssAnon'] / 2**20:.0f} MiB "
              f"({record['seconds']} s)", flush=True)  # fmt: skip
    recipe = graph.pop("recipe")
    return {"graph": graph, "recipe": recipe, "summary": summarize(runs, args), "runs": runs}


# -- the figure -------------------------------------------------------------------------------
def configurations(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``(features, dtype)`` in the figure's order."""
    return [(kind, dtype) for kind in result["features"] for dtype in result["dtypes"]]


def title_of(facts: dict[str, Any]) -> str:
    """``Intel(R) Xeon(R) ..., 2 cores, torch 2.x``: the machine the run measured."""
    return f"{facts['cpu']}, {facts['cpus']} cores, torch {facts['torch']}"


def stacked(ax: Any, x: list[float], entries: list[dict[str, float]], keys: tuple, width: float,
            labels: dict[str, str], first_colour: int) -> None:  # fmt: skip
    """Bars at ``x`` stacking ``keys`` of each entry (a phase's seconds), from zero."""
    bottom = [0.0] * len(x)
    for i, key in enumerate(keys):
        values = [entry[key] for entry in entries]
        ax.bar(x, values, width, bottom=bottom, label=labels[key], color=f"C{first_colour + i}")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]


def draw_epoch(ax: Any, result: dict[str, Any]) -> None:
    """Per configuration: the steady epoch split on the training thread (sums to
    ``epoch_time``; labelled with its ratio to float32) and MBC on the loader's thread."""
    configs = configurations(result)
    summary = result["summary"]
    entries = [summary[kind][dtype]["steady"] for kind, dtype in configs]
    width = 0.38
    left = [i - width / 2 for i in range(len(configs))]
    stacked(ax, left, entries, TRAINING_THREAD, width, PHASE_NAMES, 0)
    stacked(ax, [i + width / 2 for i in range(len(configs))], entries, LOADER_THREAD, width,
            PHASE_NAMES, len(TRAINING_THREAD))  # fmt: skip
    for x, (kind, dtype), entry in zip(left, configs, entries, strict=True):
        ratio = summary[kind][dtype]["ratio_to_float32"]["epoch_time"]
        ax.text(x, entry["epoch_time"], f"{entry['epoch_time']:.3g} s\n{ratio:.2f}x",
                ha="center", va="bottom", fontsize="x-small")  # fmt: skip
    ax.set_xticks(range(len(configs)), [f"{k}\n{d}" for k, d in configs])
    ax.set(title="steady epoch (median): training thread | loader thread\n"
           "(epoch seconds, ratio to float32 of the same --features)",
           ylabel="seconds per epoch")  # fmt: skip
    bar_axis(ax, end=HEADROOM * max(max(e["epoch_time"], e["mbc"]) for e in entries))
    ax.legend(fontsize="x-small", ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.15))


def draw_memory(ax: Any, result: dict[str, Any]) -> None:
    """Per configuration: the table's bytes in RAM and in the page cache, and the process's
    RssAnon after setup and after the last epoch and RssFile after the last epoch (MiB)."""
    configs = configurations(result)
    summary = result["summary"]
    series = (
        ("table in RAM", lambda e: e["table"]["in_ram_bytes"]),
        ("table in the page cache (mapped file)", lambda e: e["table"]["page_cache_bytes"]),
        ("RssAnon after setup", lambda e: e["rss"]["setup"]["RssAnon"]),
        ("RssAnon after the last epoch", lambda e: e["rss"]["last_epoch"]["RssAnon"]),
        ("RssFile after the last epoch", lambda e: e["rss"]["last_epoch"]["RssFile"]),
    )
    width = 0.8 / len(series)
    ends = []
    for i, (label, value) in enumerate(series):
        mib = [value(summary[kind][dtype]) / 2**20 for kind, dtype in configs]
        x = [c + (i - (len(series) - 1) / 2) * width for c in range(len(configs))]
        ax.bar(x, mib, width, label=label)
        ends += mib
    ax.set_xticks(range(len(configs)), [f"{k}\n{d}" for k, d in configs])
    ax.set(title="feature table and process memory (median over rounds)", ylabel="MiB")
    bar_axis(ax, end=HEADROOM * max(ends))
    ax.legend(fontsize="x-small", ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.15))


def draw_accuracy(ax: Any, result: dict[str, Any]) -> None:
    """Per configuration: the first round's test accuracy, labelled with the last epoch's
    loss (the axis spans the values, not from zero)."""
    configs = configurations(result)
    summary = result["summary"]
    accuracy = [100 * summary[kind][dtype]["test_acc"] for kind, dtype in configs]
    ax.plot(range(len(configs)), accuracy, "o", color="C0")
    for x, (kind, dtype), acc in zip(range(len(configs)), configs, accuracy, strict=True):
        loss = summary[kind][dtype]["loss_last_epoch"]
        ax.annotate(f"{acc:.2f} %\nloss {loss:.4f}", (x, acc), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize="x-small")  # fmt: skip
    low, high = min(accuracy), max(accuracy)
    pad = max(high - low, 0.2)
    top = min(high + pad, 100.0)  # an accuracy ends at 100 %
    ax.set_ylim(min(low, top - 2 * pad) - pad, top)
    ax.set_xticks(range(len(configs)), [f"{k}\n{d}" for k, d in configs])
    ax.set(title="test accuracy after the last epoch, one seed\n(axis not from zero)",
           ylabel="test accuracy (%)")  # fmt: skip
    ax.grid(axis="y", alpha=0.3)


def plot(result: dict[str, Any], path: Path) -> None:
    """Epoch split, memory, accuracy: one panel each."""
    fig, axes = panels(3, panel_size=(6.0, 5.2))
    draw_epoch(axes[0], result)
    draw_memory(axes[1], result)
    draw_accuracy(axes[2], result)
    graph = result["graph"]
    fig.suptitle(f"--feature-dtype on the CPU path, {graph['rows']} vertices x "
                 f"{graph['feat_dim']} features, GraphSAGE: {title_of(result['machine'])}",
                 fontsize="medium")  # fmt: skip
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_configuration(json.loads(args.child))), flush=True)
        return 0
    result: dict[str, Any] = {
        "benchmark": "feature_dtype_cpu",
        "command": command_line(argv, __file__),
        "machine": machine("cpu"),
        "dtypes": args.dtypes,
        "features": args.features,
        "repeats": args.repeats,
        "epochs": args.epochs,
        "seed": SEED,
    }
    start = time.perf_counter()
    if args.workdir is not None:
        result.update(measure(args, args.workdir / "partition"))
    else:
        with tempfile.TemporaryDirectory(prefix="feature_dtype_cpu-") as tmp:
            result.update(measure(args, Path(tmp) / "partition"))
    result["seconds"] = round(time.perf_counter() - start, 1)
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
