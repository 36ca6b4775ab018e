"""Partition time and peak memory on synthetic graphs of ogbn-products' shape.

Each configuration runs ``distmb-partition`` in a fresh process (so peak RSS is its own)
and the timings of its phases are read from its progress lines. Writes
``results/partition.json`` and ``results/partition.png``.

    python benchmarks/partition.py                      # 1e5, 1e6, 2.5e6 vertices; P = 4, 16
    python benchmarks/partition.py --nodes 100000 --parts 4
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

from distmb.plotting import panels, reference_line, set_scale
from distmb.report import save_figure, write_json

RESULTS = Path(__file__).resolve().parents[1] / "results"
STEP = re.compile(r"^\[\s*([\d.]+)s\] (.*)$")


def run_one(nodes: int, parts: int, avg_degree: int, feat_dim: int, workdir: Path) -> dict:
    """Partition one synthetic graph in a subprocess; return timings and peak memory."""
    out = workdir / f"n{nodes}-p{parts}"
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
    ]
    wrapper = ["/usr/bin/time", "-f", "MAXRSS_KB=%M"] if Path("/usr/bin/time").exists() else []
    t0 = time.perf_counter()
    proc = subprocess.run(wrapper + cmd, capture_output=True, text=True, check=False)
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
        "wall_s": round(wall, 2),
        "load_s": round(t_assign, 2),  # generate + CSR build + validate
        "assign_s": round(t_assigned - t_assign, 2),  # METIS + train rebalancing
        "write_s": round(at("wrote") - t_assigned, 2),  # extract parts, checksums, rename
        "partition_s": round(at("wrote") - t_assign, 2),  # everything after loading
    }
    sample = re.search(r"uniform (\d+) % sample of the edges", proc.stderr)
    record["metis_edge_percent"] = int(sample.group(1)) if sample else 100
    rss = re.search(r"MAXRSS_KB=(\d+)", proc.stderr)
    if rss:
        record["peak_rss_gib"] = round(int(rss.group(1)) / 2**20, 2)
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


def plot(records: list[dict], path: Path) -> None:
    fig, (ax_t, ax_m) = panels(2)
    for parts in sorted({r["parts"] for r in records}):
        rs = sorted((r for r in records if r["parts"] == parts), key=lambda r: r["nodes"])
        x = [r["nodes"] for r in rs]
        ax_t.plot(x, [r["wall_s"] for r in rs], "o-", label=f"P={parts} total")
        ax_t.plot(x, [r["partition_s"] for r in rs], "s--", label=f"P={parts} after loading")
        ax_m.plot(x, [r.get("peak_rss_gib", float("nan")) for r in rs], "o-", label=f"P={parts}")
    reference_line(ax_t, 600, "target: 10 minutes", color="red")
    reference_line(ax_m, 16 * 1e9 / 2**30, "target: 16 GB", color="red")
    nodes = [r["nodes"] for r in records]
    set_scale(ax_t, [v for r in records for v in (r["wall_s"], r["partition_s"])] + [600])
    for ax in (ax_t, ax_m):
        set_scale(ax, nodes, axis="x")
        ax.set_xlabel("vertices (avg degree 50, 100 features)")
        ax.grid(alpha=0.3)
        ax.legend()
    ax_t.set_ylabel("seconds")
    ax_m.set_ylabel("peak RSS (GiB)")
    fig.suptitle("distmb-partition (METIS, train-balanced)")
    save_figure(fig, path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[100_000, 1_000_000, 2_500_000])
    p.add_argument("--parts", type=int, nargs="+", default=[4, 16])
    p.add_argument("--avg-degree", type=int, default=50)
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--out", type=Path, default=RESULTS / "partition.json")
    args = p.parse_args()
    records = []
    with tempfile.TemporaryDirectory(prefix="distmb-bench-") as tmp:
        for nodes in args.nodes:
            for parts in args.parts:
                rec = run_one(nodes, parts, args.avg_degree, args.feat_dim, Path(tmp))
                print(json.dumps(rec), flush=True)
                records.append(rec)
    result = {
        "benchmark": "partition",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "records": records,
    }
    write_json(args.out, result)
    plot(records, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
