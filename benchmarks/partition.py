"""Partition time and peak memory on synthetic graphs of ogbn-products' shape; and a
comparison of the partitioning engines (``--methods``).

Each configuration runs ``distmb-partition`` in a fresh process (so peak RSS is its own)
and the timings of its phases are read from its progress lines. Writes
``results/partition.json`` and ``results/partition.png``.

    python benchmarks/partition.py                      # 1e5, 1e6, 2.5e6 vertices; P = 4, 16
    python benchmarks/partition.py --nodes 100000 --parts 4

Every record has the child's peak resident memory (``/usr/bin/time``'s high-water mark) in
bytes per directed edge, in total and beyond the feature table, against the bounded-memory
goal (:data:`GOAL_BYTES_PER_EDGE`); ``--method kaminpar`` or ``--budget-bytes-per-edge 40``
(METIS on the edge sample that fits) measure the bounded configurations, ``--merge`` adds
them to the stored records (the measured runs: see ``results/README.md``).

With ``--methods metis,kaminpar`` it compares the engines instead: each dataset is loaded
once and its adjacency and training set saved; every (method, P, repeat) then runs in a
child process that loads just those arrays, runs the engine and the train rebalancing, and
reports the edge cut, the vertex and training-vertex balance, the time, and its peak memory
over the loaded arrays (the high-water mark ``VmHWM``, reset after loading, minus the
resident set before partitioning) per directed edge. ``--train-weights`` adds KaMinPar
runs with other training-vertex weights; a ``clustered-train:`` dataset draws its training
set from two classes only. Writes ``results/partition_engines.json`` and ``.png``; the
measured run (one command, wrapped here):

    python benchmarks/partition.py --methods metis,kaminpar --parts 4 16 --threads 2
        --train-weights 0,4 --dataset synthetic:nodes=500000,avg_degree=20,feat_dim=8 cora
        clustered-train:synthetic:nodes=200000,avg_degree=20,homophily=0.8,feat_dim=8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import command_line

from distmb.cli.report import save_figure, write_json
from distmb.core.plotting import panels, reference_line, set_scale

RESULTS = Path(__file__).resolve().parents[1] / "results"
ENGINE_RESULTS = RESULTS / "partition_engines.json"
STEP = re.compile(r"^\[\s*([\d.]+)s\] (.*)$")


#: The bounded-memory goal: peak bytes per directed edge beyond the feature table.
GOAL_BYTES_PER_EDGE = 40


def synthetic_sizes(nodes: int, avg_degree: int, feat_dim: int) -> tuple[int, int]:
    """(directed edges, feature bytes) of the synthetic graph: the generator's exact edge
    count, float32 features."""
    from distmb.data.datasets.synthetic import SyntheticConfig

    config = SyntheticConfig(nodes=nodes, avg_degree=float(avg_degree), feat_dim=feat_dim)
    return 2 * sum(config.edge_counts()), nodes * feat_dim * 4


def run_one(
    nodes: int,
    parts: int,
    avg_degree: int,
    feat_dim: int,
    workdir: Path,
    *,
    method: str = "metis",
    budget_bytes_per_edge: float | None = None,
    threads: int | None = None,
    mem_cap_gib: float | None = None,
) -> dict:
    """Partition one synthetic graph in a subprocess; return timings and peak memory.

    Args:
        method: ``--method``.
        budget_bytes_per_edge: pass ``--memory-budget`` = this many bytes per directed edge
            plus the feature table (METIS then partitions the edge sample that fits).
        threads: ``--threads``.
        mem_cap_gib: run the child under ``prlimit --as`` (address space), so a run that
            outgrows the machine fails instead of waking the OOM killer.
    """
    out = workdir / f"n{nodes}-p{parts}-{method}"
    spec = f"synthetic:nodes={nodes},avg_degree={avg_degree},feat_dim={feat_dim}"
    cmd = [
        sys.executable,
        "-m",
        "distmb.partition",
        "--dataset",
        spec,
        "--parts",
        str(parts),
        "--out",
        str(out),
        "--overwrite",
        "--method",
        method,
    ]
    edges, feature_bytes = synthetic_sizes(nodes, avg_degree, feat_dim)
    budget_gib = None
    if budget_bytes_per_edge is not None:
        budget_gib = round((budget_bytes_per_edge * edges + feature_bytes) / 2**30, 3)
        cmd += ["--memory-budget", str(budget_gib)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if mem_cap_gib is not None:
        cmd = ["prlimit", f"--as={int(mem_cap_gib * 2**30)}", *cmd]
    # /usr/bin/time's %M is the child's own high-water mark (it forks a fresh process; a
    # child of this interpreter would inherit this process' peak in ru_maxrss).
    wrapper = ["/usr/bin/time", "-f", "MAXRSS_KB=%M"] if Path("/usr/bin/time").exists() else []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    t0 = time.perf_counter()
    proc = subprocess.run(wrapper + cmd, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    steps = [
        (float(m.group(1)), m.group(2))
        for line in proc.stderr.splitlines()
        if (m := STEP.match(line))
    ]

    def at(prefix: str) -> float:
        return next(t for t, msg in steps if msg.startswith(prefix))

    t_assign = at("assigning")
    t_assigned = at("assigned")
    record = {
        "nodes": nodes,
        "parts": parts,
        "avg_degree": avg_degree,
        "feat_dim": feat_dim,
        "method": method,
        "threads": threads,
        "wall_s": round(wall, 2),
        "load_s": round(t_assign, 2),  # generate + CSR build + validate
        "assign_s": round(t_assigned - t_assign, 2),  # engine + train rebalancing
        "write_s": round(at("wrote") - t_assigned, 2),  # extract parts, checksums, rename
        "partition_s": round(at("wrote") - t_assign, 2),  # everything after loading
    }
    if budget_gib is not None:
        record["budget_bytes_per_edge"] = budget_bytes_per_edge
        record["memory_budget_gib"] = budget_gib
    sample = re.search(r"uniform (\d+) % sample of the edges", proc.stderr)
    record["metis_edge_percent"] = int(sample.group(1)) if sample else 100
    meta = json.loads((out / "partition.json").read_text())
    record["directed_edges"] = int(meta["num_edges"])
    record["feature_bytes"] = feature_bytes
    record["metis_edge_fraction"] = meta["partitioner"].get("metis_edge_fraction")
    record["partition_json_peak_memory"] = meta.get("peak_memory")
    rss = re.search(r"MAXRSS_KB=(\d+)", proc.stderr)
    if rss:
        peak = int(rss.group(1)) * 1024
        record["peak_rss_gib"] = round(peak / 2**30, 2)
        record["bytes_per_edge"] = round(peak / record["directed_edges"], 1)
        record["bytes_per_edge_beyond_features"] = round(
            (peak - feature_bytes) / record["directed_edges"], 1
        )
        record["meets_goal"] = record["bytes_per_edge_beyond_features"] <= GOAL_BYTES_PER_EDGE
    report = proc.stdout
    m = re.search(r"peak memory [\d.]+ GiB = ([\d.]+)x the graph's ([\d.]+) GiB", report)
    if m:
        record["peak_over_graph"] = float(m.group(1))
        record["graph_gib"] = float(m.group(2))
    m = re.search(r"edge cut: (\d+) of (\d+) in-edges", report)
    if m:
        record["edge_cut_fraction"] = round(int(m.group(1)) / int(m.group(2)), 4)
    m = re.search(r"vertices ([\d.]+), train ([\d.]+), edges ([\d.]+)", report)
    if m:
        record["imbalance"] = {
            "vertices": float(m.group(1)),
            "train": float(m.group(2)),
            "edges": float(m.group(3)),
        }
    shutil.rmtree(out, ignore_errors=True)
    return record


def series_label(record: dict) -> str:
    """``metis``, ``kaminpar`` or ``metis <=40 B/edge`` (a METIS run under a memory budget);
    records without a method predate bounded-memory partitioning (the "before" baseline)."""
    if "method" not in record:
        return "metis before bounded memory"
    label = record["method"]
    if record.get("budget_bytes_per_edge") is not None:
        label += f" <={record['budget_bytes_per_edge']:g} B/edge"
    return label


def record_key(record: dict) -> tuple:
    """What a record measures (``--merge`` replaces a stored record with the same key)."""
    return (
        record["nodes"],
        record["parts"],
        record["avg_degree"],
        record["feat_dim"],
        record.get("method", "metis"),
        record.get("budget_bytes_per_edge"),
    )


def plot(records: list[dict], path: Path) -> None:
    fig, (ax_t, ax_m, ax_e) = panels(3)
    series = sorted({(series_label(r), r["parts"]) for r in records})
    for label, parts in series:
        rs = sorted(
            (r for r in records if series_label(r) == label and r["parts"] == parts),
            key=lambda r: r["nodes"],
        )
        x = [r["nodes"] for r in rs]
        name = f"{label}, P={parts}"
        ax_t.plot(x, [r["wall_s"] for r in rs], "o-", label=f"{name} total")
        ax_m.plot(x, [r.get("peak_rss_gib", float("nan")) for r in rs], "o-", label=name)
        ax_e.plot(
            x, [r.get("bytes_per_edge_beyond_features", float("nan")) for r in rs], "o-", label=name
        )
    reference_line(ax_t, 600, "target: 10 minutes", color="red")
    reference_line(ax_m, 16 * 1e9 / 2**30, "target: 16 GB", color="red")
    reference_line(ax_e, GOAL_BYTES_PER_EDGE, f"goal: {GOAL_BYTES_PER_EDGE} B/edge", color="red")
    nodes = [r["nodes"] for r in records]
    set_scale(ax_t, [r["wall_s"] for r in records] + [600])
    per_edge = [r["bytes_per_edge_beyond_features"] for r in records if "bytes_per_edge" in r]
    set_scale(ax_e, per_edge + [GOAL_BYTES_PER_EDGE])
    shapes = sorted({(r["avg_degree"], r["feat_dim"]) for r in records})
    xlabel = "vertices (" + "; ".join(f"avg degree {d}, {f} features" for d, f in shapes) + ")"
    for ax in (ax_t, ax_m, ax_e):
        set_scale(ax, nodes, axis="x")
        ax.set_xlabel(xlabel if len(xlabel) < 70 else "vertices")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    ax_t.set_ylabel("seconds")
    ax_m.set_ylabel("peak RSS (GiB)")
    ax_e.set_ylabel("peak bytes per directed edge beyond features")
    fig.suptitle("distmb-partition: time and peak memory (child's high-water mark)")
    save_figure(fig, path, dpi=110)


# ---- engine comparison (--methods) ---------------------------------------------------------

#: Arrays a child process loads: the CSR and the training vertices.
GRAPH_ARRAYS = ("indptr", "indices", "train_idx")


#: Prefix of a dataset whose training set is replaced by a clustered one (``--clustered``).
CLUSTERED = "clustered-train:"
#: Classes a clustered training set is drawn from.
CLUSTERED_CLASSES = 2


def save_graph(spec: str, directory: Path) -> dict:
    """Load dataset ``spec`` and save its adjacency and training set as ``.npy`` files in
    ``directory``; return its sizes.

    With the :data:`CLUSTERED` prefix the training set is replaced by as many vertices drawn
    (seeded) from the first :data:`CLUSTERED_CLASSES` classes only: on a homophilous graph
    they gather in a few communities, the hard case for balancing training vertices.
    """
    import numpy as np

    from distmb.data import load_dataset

    clustered = spec.startswith(CLUSTERED)
    graph = load_dataset(spec.removeprefix(CLUSTERED))
    if clustered:
        pool = np.flatnonzero((graph.labels >= 0) & (graph.labels < CLUSTERED_CLASSES))
        size = min(graph.train_idx.size, pool.size)
        graph.train_idx = np.sort(np.random.default_rng(0).choice(pool, size, replace=False))
    directory.mkdir(parents=True)
    for name in GRAPH_ARRAYS:
        np.save(directory / f"{name}.npy", getattr(graph, name))
    info = {
        "dataset": spec,
        "name": graph.name,
        "nodes": graph.num_nodes,
        "directed_edges": graph.num_edges,
        "train_vertices": int(graph.train_idx.size),
        "symmetric": graph.symmetric,
    }
    (directory / "info.json").write_text(json.dumps(info))
    return info


def _status_bytes(key: str) -> int:
    """``VmRSS`` (current resident set) or ``VmHWM`` (its high-water mark) of this process,
    bytes. ``VmHWM`` rather than ``ru_maxrss``: a child's ``ru_maxrss`` also holds the
    parent's resident set at fork (the kernel carries it over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset this process's high-water mark (``VmHWM``) to its current RSS (Linux >= 4.0:
    ``5`` into ``/proc/self/clear_refs``), so that the peak measured next is the engine's,
    not the imports'. False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def engine_child(
    graph_dir: Path, method: str, parts: int, seed: int, threads: int, train_weight: int | None
) -> dict:
    """In a fresh process: run ``method`` and the train rebalancing on the saved graph;
    return cut, balance, times and the peak memory over the loaded arrays."""
    import numpy as np
    import pymetis  # noqa: F401  (both engines' libraries are resident in the baseline)

    from distmb import _C
    from distmb.data import Graph
    from distmb.partition.assign import assign_parts, rebalance_train_and_vertices
    from distmb.partition.kaminpar import KAMINPAR_TRAIN_WEIGHT, import_kaminpar, kaminpar_parts
    from distmb.partition.pipeline import DEFAULT_TRAIN_TOLERANCE, DEFAULT_VERTEX_TOLERANCE

    import_kaminpar()
    _C.set_num_threads(threads)
    info = json.loads((graph_dir / "info.json").read_text())
    arrays = {name: np.load(graph_dir / f"{name}.npy") for name in GRAPH_ARRAYS}
    n = arrays["indptr"].size - 1
    empty = np.zeros(0, dtype=np.int64)
    graph = Graph(
        name=info["name"],
        features=np.zeros((n, 0), dtype=np.float32),
        labels=np.zeros(n, dtype=np.int64),
        val_idx=empty,
        test_idx=empty,
        num_classes=1,
        symmetric=info["symmetric"],
        **arrays,
    )
    dst = np.repeat(np.arange(n, dtype=np.int32), np.diff(graph.indptr))  # for the cut

    def quality(part_of: np.ndarray) -> dict:
        cut = int(np.count_nonzero(part_of[dst] != part_of[graph.indices]))
        sizes = np.bincount(part_of, minlength=parts)
        train = np.bincount(part_of[graph.train_idx], minlength=parts)
        return {
            "edge_cut_fraction": round(cut / max(graph.num_edges, 1), 5),
            "vertex_imbalance": round(float(sizes.max() / sizes.mean()), 4),
            "train_imbalance": round(float(train.max() / max(train.mean(), 1e-12)), 4),
        }

    peak_reset = _reset_peak_rss()
    base_rss = _status_bytes("VmRSS")
    base_peak = _status_bytes("VmHWM")
    t0 = time.perf_counter()
    if method == "kaminpar" and train_weight is not None:
        part_of = kaminpar_parts(graph, parts, seed=seed, train_weight=train_weight)
    else:
        part_of = assign_parts(graph, parts, method=method, seed=seed)
    t1 = time.perf_counter()
    peak_assign = _status_bytes("VmHWM")
    before = quality(part_of)
    moved_train, moved_other = rebalance_train_and_vertices(
        graph,
        part_of,
        parts,
        train_tolerance=DEFAULT_TRAIN_TOLERANCE,
        vertex_tolerance=DEFAULT_VERTEX_TOLERANCE,
    )
    t2 = time.perf_counter()
    peak_total = _status_bytes("VmHWM")
    m = max(graph.num_edges, 1)
    return {
        "dataset": info["dataset"],
        "method": method,
        "train_weight": KAMINPAR_TRAIN_WEIGHT
        if method == "kaminpar" and train_weight is None
        else train_weight,
        "default_weight": method == "kaminpar" and train_weight is None,
        "parts": parts,
        "seed": seed,
        "threads": threads,
        "assign_s": round(t1 - t0, 3),
        "rebalance_s": round(t2 - t1, 3),
        "total_s": round(t2 - t0, 3),
        "before_rebalance": before,
        **quality(part_of),
        "train_moved": moved_train,
        "other_moved": moved_other,
        "baseline_rss_bytes": base_rss,
        "baseline_peak_bytes": base_peak,
        "peak_reset": peak_reset,
        "assign_peak_bytes_per_edge": round((peak_assign - base_rss) / m, 1),
        "peak_bytes_per_edge": round((peak_total - base_rss) / m, 1),
    }


def run_engine(
    graph_dir: Path, method: str, parts: int, seed: int, threads: int, train_weight: int | None
) -> dict:
    """:func:`engine_child` in a fresh interpreter (so ``ru_maxrss`` is this run's alone)."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(graph_dir),
        "--methods",
        method,
        "--parts",
        str(parts),
        "--seed",
        str(seed),
        "--threads",
        str(threads),
    ]
    if train_weight is not None:
        cmd += ["--train-weights", str(train_weight)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarise(runs: list[dict]) -> dict:
    """One record for the repeats of a configuration: medians of times and cuts (before and
    after rebalancing), min-max of the cut, the largest imbalance and peak; every repeat's
    own record under ``runs``."""
    import numpy as np

    def median(values: list[float]) -> float:
        return round(float(np.median(values)), 5)

    out = {k: v for k, v in runs[0].items() if k != "seed"}
    for key in ("assign_s", "rebalance_s", "total_s", "edge_cut_fraction"):
        out[key] = median([r[key] for r in runs])
    for key in (
        "vertex_imbalance",
        "train_imbalance",
        "assign_peak_bytes_per_edge",
        "peak_bytes_per_edge",
    ):
        out[key] = max(r[key] for r in runs)
    out["train_moved"] = median([r["train_moved"] for r in runs])
    out["other_moved"] = median([r["other_moved"] for r in runs])
    before = [r["before_rebalance"] for r in runs]
    out["before_rebalance"] = {
        "edge_cut_fraction": median([b["edge_cut_fraction"] for b in before]),
        "vertex_imbalance": max(b["vertex_imbalance"] for b in before),
        "train_imbalance": max(b["train_imbalance"] for b in before),
    }
    cuts = [r["edge_cut_fraction"] for r in runs]
    out["edge_cut_fraction_range"] = [min(cuts), max(cuts)]
    out["repeats"] = len(runs)
    out["runs"] = runs
    return out


def engine_label(record: dict) -> str:
    """``metis``, ``kaminpar w=2 (default)`` or ``kaminpar w=4``."""
    w = record.get("train_weight")
    if w is None:
        return record["method"]
    return f"{record['method']} w={w}" + (" (default)" if record.get("default_weight") else "")


def plot_engines(records: list[dict], path: Path) -> None:
    """Edge cut, time and peak bytes per directed edge against P, one line per dataset and
    engine."""
    keys = (
        ("edge_cut_fraction", "edge cut (share of directed edges)"),
        ("total_s", "seconds (engine + rebalancing)"),
        ("peak_bytes_per_edge", "peak bytes per directed edge"),
    )
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    fig, axes = panels(len(keys) * len(datasets))
    for row, dataset in enumerate(datasets):
        mine = [r for r in records if r["dataset"] == dataset]
        for ax, (key, label) in zip(axes[row * len(keys) :], keys, strict=False):
            for engine in dict.fromkeys(engine_label(r) for r in mine):
                rs = sorted(
                    (r for r in mine if engine_label(r) == engine), key=lambda r: r["parts"]
                )
                ax.plot([r["parts"] for r in rs], [r[key] for r in rs], "o-", label=engine)
            set_scale(ax, [r[key] for r in mine])
            set_scale(ax, [r["parts"] for r in mine], axis="x")
            ax.set_xlabel("parts P")
            ax.set_ylabel(label)
            ax.set_title(dataset if len(dataset) <= 48 else dataset[:45] + "...", fontsize="small")
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    fig.suptitle("Partitioning engines, after train rebalancing (medians of the repeats)")
    save_figure(fig, path, dpi=100)


def compare_engines(args: argparse.Namespace) -> None:
    """The ``--methods`` mode: every dataset x method x P x repeat in its own process."""
    methods = [m for m in args.methods.split(",") if m]
    datasets = args.dataset or [
        f"synthetic:nodes={n},avg_degree={args.avg_degree},feat_dim={args.feat_dim}"
        for n in args.nodes
    ]
    configs = [(m, None) for m in methods]
    if args.train_weights:
        configs += [("kaminpar", int(w)) for w in args.train_weights.split(",")]
    records, graphs = [], []
    with tempfile.TemporaryDirectory(prefix="distmb-bench-") as tmp:
        for i, spec in enumerate(datasets):
            graph_dir = Path(tmp) / f"g{i}"
            graphs.append(save_graph(spec, graph_dir))
            print(json.dumps(graphs[-1]), flush=True)
            for parts in args.parts:
                for method, weight in configs:
                    runs = [
                        run_engine(graph_dir, method, parts, args.seed + r, args.threads, weight)
                        for r in range(args.repeats)
                    ]
                    rec = summarise(runs)
                    print(json.dumps(rec), flush=True)
                    records.append(rec)
    result = {
        "benchmark": "partition_engines",
        "command": command_line(),
        "machine": machine(),
        "graphs": graphs,
        "records": records,
    }
    out = args.out if args.out != RESULTS / "partition.json" else ENGINE_RESULTS
    write_json(out, result)
    plot_engines(records, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def machine() -> dict:
    """CPU model, cores and library versions of this machine."""
    from importlib.metadata import PackageNotFoundError, version

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for package in ("pymetis", "kaminpar", "numpy"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        **versions,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[100_000, 1_000_000, 2_500_000])
    p.add_argument("--parts", type=int, nargs="+", default=[4, 16])
    p.add_argument("--avg-degree", type=int, default=50)
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--out", type=Path, default=RESULTS / "partition.json")
    p.add_argument(
        "--methods",
        help="compare these engines (e.g. metis,kaminpar) instead; writes "
        "results/partition_engines.json unless --out",
    )
    p.add_argument(
        "--dataset",
        nargs="+",
        help=f"--methods: dataset specs (default: synthetic); prefix {CLUSTERED} to draw the "
        f"training set from the first {CLUSTERED_CLASSES} classes only",
    )
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads (--threads)")
    p.add_argument("--repeats", type=int, default=3, help="--methods: runs per configuration")
    p.add_argument("--seed", type=int, default=0, help="--methods: seed of the first repeat")
    p.add_argument(
        "--train-weights",
        help="--methods: also run kaminpar with these training-vertex weights (e.g. 0,2,4)",
    )
    p.add_argument(
        "--method",
        default="metis",
        help="engine of the scaling runs (--methods compares engines instead)",
    )
    p.add_argument(
        "--budget-bytes-per-edge",
        type=float,
        help="give the partitioner --memory-budget = this many bytes per directed edge plus "
        f"the feature table (the bounded-memory goal is {GOAL_BYTES_PER_EDGE})",
    )
    p.add_argument(
        "--mem-cap-gib",
        type=float,
        help="cap each partitioner's address space (prlimit --as), so it fails rather than "
        "pushing a shared machine into the OOM killer",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the records of --out that this run does not measure again",
    )
    p.add_argument("--workdir", type=Path, help="where the partitions are written (temporary)")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        weight = int(args.train_weights) if args.train_weights else None
        rec = engine_child(args.child, args.methods, args.parts[0], args.seed, args.threads, weight)
        print(json.dumps(rec))
        return
    if args.methods:
        compare_engines(args)
        return
    records = []
    with tempfile.TemporaryDirectory(prefix="distmb-bench-", dir=args.workdir) as tmp:
        for nodes in args.nodes:
            for parts in args.parts:
                rec = run_one(
                    nodes,
                    parts,
                    args.avg_degree,
                    args.feat_dim,
                    Path(tmp),
                    method=args.method,
                    budget_bytes_per_edge=args.budget_bytes_per_edge,
                    threads=args.threads,
                    mem_cap_gib=args.mem_cap_gib,
                )
                print(json.dumps(rec), flush=True)
                records.append(rec)
    if args.merge and args.out.exists():
        new_keys = {record_key(r) for r in records}
        kept = [
            r for r in json.loads(args.out.read_text())["records"] if record_key(r) not in new_keys
        ]
        records = kept + records
    result = {
        "benchmark": "partition",
        "command": command_line(),
        "machine": machine(),
        "records": records,
    }
    write_json(args.out, result)
    plot(records, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
