"""Multi-rank training measurements (each run is a real ``mpiexec -n P``).

Sections (``--section``):
- ``scaling``: epoch time and its breakdown for P = 1, 2, 4 on a 200k-vertex synthetic graph
  (average degree 30), GraphSAGE defaults. With 2 cores, P = 2 runs ``--threads 1`` per rank
  and P = 4 is oversubscribed (2 ranks per core): read it as a functional check.
- ``traffic``: bytes per epoch and test accuracy for the default HEC, ``--no-hec`` and the
  executed exact baseline ``--exact-remote`` (see :func:`traffic`).
- ``sweep``: HEC hit rate per layer when one of cs, nc, ls, d varies around the defaults.

Writes ``results/distributed.json`` and ``results/distributed.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from distmb.cli.report import save_figure, write_json
from distmb.core.plotting import panels, rotate_labels

RESULTS = Path(__file__).resolve().parents[1] / "results"
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def train(ranks: int, args: list[str], workdir: Path, tag: str) -> list[dict]:
    """One ``mpiexec -n ranks python -m distmb.train`` run; its per-epoch records."""
    results = workdir / f"{tag}.jsonl"
    results.unlink(missing_ok=True)
    cmd = [
        MPIEXEC,
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "distmb.train",
        *args,
        "--no-progress",
        "--results",
        str(results),
        "--partition-cache",
        str(workdir / "parts"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in results.read_text().splitlines()]


def scaling(workdir: Path) -> list[dict]:
    out = []
    for ranks in (1, 2, 4):
        threads = "2" if ranks == 1 else "1"
        recs = train(
            ranks,
            [
                "--dataset",
                "synthetic:nodes=200000,avg_degree=30",
                "--epochs",
                "3",
                "--eval-every",
                "3",
                "--threads",
                threads,
            ],
            workdir,
            f"scale-{ranks}",
        )
        last = recs[1:] or recs
        keys = ("epoch_time", "mbc", "fwd", "bwd", "ared", "opt")
        row = {k: round(sum(r[k] for r in last) / len(last), 3) for k in keys}
        row.update(
            ranks=ranks,
            threads_per_rank=int(threads),
            comm_wait=last[-1].get("comm_wait", 0.0),
            imbalance=last[-1].get("imbalance", 1.0),
            hec_hit_rate=last[-1].get("hec_hit_rate"),
            bytes_pushed=last[-1].get("bytes_pushed", 0),
            test_acc=recs[-1]["test_acc"],
        )
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


TRAFFIC_MODES = {
    "hec (default)": [],
    "no-hec": ["--no-hec"],
    "exact-remote (DistDGL-like)": ["--exact-remote"],
}
TRAFFIC_SEEDS = (0, 1, 2)


def traffic(workdir: Path, ranks: int = 2) -> list[dict]:
    """Bytes sent per epoch and test accuracy (medians over :data:`TRAFFIC_SEEDS`) for the
    default HEC, ``--no-hec`` and the executed DistDGL-like exact baseline
    (``--exact-remote``: remote neighbours sampled at their owners and remote features
    fetched every iteration), plus one rank on the same global batches (the accuracy an exact
    scheme should reach) and the counted bytes of pulling exactly the hidden-layer halo rows
    each batch needs (what a pull design that computed them remotely would move)."""
    out = []
    cfg = [
        "--dataset",
        "synthetic",
        "--layers",
        "2",
        "--fanout",
        "10,15",
        "--hidden",
        "128",
        "--epochs",
        "25",
        "--eval-every",
        "25",
    ]
    for mode, extra in TRAFFIC_MODES.items():
        runs = [
            train(
                ranks,
                [*cfg, "--batch-size", str(250 // ranks), "--threads", "1", "--seed", str(seed)]
                + extra,
                workdir,
                f"traffic-{mode.split()[0]}-{seed}",
            )
            for seed in TRAFFIC_SEEDS
        ]
        row = {
            "mode": mode,
            "ranks": ranks,
            "seeds": list(TRAFFIC_SEEDS),
            "test_acc_per_seed": [recs[-1]["test_acc"] for recs in runs],
            "test_acc": statistics.median(recs[-1]["test_acc"] for recs in runs),
            "bytes_per_epoch": statistics.median(
                sum(r["bytes_pushed"] + r.get("bytes_exact_remote", 0) for r in recs) / len(recs)
                for recs in runs
            ),
            "hec_hit_rate": runs[0][-1]["hec_hit_rate"],
            "epoch_time": statistics.median(
                sum(r["epoch_time"] for r in recs) / len(recs) for recs in runs
            ),
        }
        if mode.startswith("hec"):
            recs = runs[0]
            n_layers = len(recs[0]["bytes_exact_pull"])
            counted = [
                sum(r["bytes_exact_pull"][i] for r in recs) / len(recs) for i in range(n_layers)
            ]
        print(json.dumps(row), flush=True)
        out.append(row)
    singles = [
        train(
            1,
            [*cfg, "--batch-size", "250", "--threads", "2", "--seed", str(seed)],
            workdir,
            f"traffic-1-{seed}",
        )
        for seed in TRAFFIC_SEEDS
    ]
    rows = [
        {
            "mode": "one rank (reference)",
            "ranks": 1,
            "seeds": list(TRAFFIC_SEEDS),
            "bytes_per_epoch": 0,
            "test_acc_per_seed": [recs[-1]["test_acc"] for recs in singles],
            "test_acc": statistics.median(recs[-1]["test_acc"] for recs in singles),
        },
        {
            "mode": "counted pull of hidden-layer halo rows",
            "ranks": ranks,
            "bytes_per_epoch": sum(counted[1:]),
            "bytes_per_epoch_layer0_features": counted[0],
            "test_acc": None,
            "note": "counted in the HEC run (ids + rows each batch's halo leaves need), seed 0",
        },
    ]
    for row in rows:
        print(json.dumps(row), flush=True)
    return out + rows


SWEEP = {
    "cs": ("--hec-size", [1000, 4000, 1_000_000]),
    "nc": ("--hec-nc", [50, 200, 2000]),
    "ls": ("--hec-lifespan", [0, 2, 8]),
    "d": ("--hec-delay", [1, 2, 4]),
}


def sweep(workdir: Path, ranks: int = 2) -> list[dict]:
    out = []
    base = [
        "--dataset",
        "synthetic",
        "--layers",
        "3",
        "--fanout",
        "5,10,15",
        "--hidden",
        "64",
        "--batch-size",
        "250",
        "--epochs",
        "4",
        "--eval-every",
        "4",
        "--threads",
        "1",
    ]
    for name, (flag, values) in SWEEP.items():
        for value in values:
            recs = train(ranks, [*base, flag, str(value)], workdir, f"sweep-{name}-{value}")
            rates = recs[-1]["hec_hit_rate"]
            row = {
                "param": name,
                "value": value,
                "hec_hit_rate": rates,
                "bytes_per_epoch": recs[-1]["bytes_pushed"],
                "test_acc": recs[-1]["test_acc"],
            }
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def plot(result: dict, path: Path) -> None:
    present = [k for k in ("scaling", "traffic", "sweep") if result.get(k)]
    count = len(present) + (len(SWEEP) - 1 if "sweep" in present else 0)
    fig, axes = panels(count, panel_size=(4.6, 3.8))  # wraps into rows of 3
    if "scaling" in present:
        ax = axes.pop(0)
        rows = result["scaling"]
        bottom = [0.0] * len(rows)
        for key in ("mbc", "fwd", "bwd", "ared", "opt"):
            vals = [r[key] for r in rows]
            ax.bar([str(r["ranks"]) for r in rows], vals, bottom=bottom, label=key.upper())
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xlabel("ranks (2 cores)")
        ax.set_ylabel("seconds per epoch (max over ranks)")
        ax.legend(fontsize=7)
        ax.set_title("200k vertices, deg 30")
    if "traffic" in present:
        ax = axes.pop(0)
        rows = result["traffic"]
        names = [r["mode"].replace(" (", "\n(").replace("of hidden", "\nof hidden") for r in rows]
        sent = [r["bytes_per_epoch"] / 2**20 for r in rows]
        ax.bar(names, sent)
        for i, r in enumerate(rows):
            label = "-" if r.get("test_acc") is None else f"{100 * r['test_acc']:.1f}%"
            ax.text(i, sent[i], label, ha="center", va="bottom")
        ax.set_ylabel("MiB sent per epoch (labels: test acc)")
        ax.set_title("traffic vs accuracy, 2 ranks")
        ax.tick_params(axis="x", labelsize=6)
        rotate_labels(ax)
    if "sweep" in present:
        for name in SWEEP:
            ax = axes.pop(0)
            rows = [r for r in result["sweep"] if r["param"] == name]
            n_layers = len(rows[0]["hec_hit_rate"])
            for layer in range(n_layers):
                if all(r["hec_hit_rate"][layer] is None for r in rows):
                    continue  # no cache at this layer (replicated halo features)
                ys = [100 * (r["hec_hit_rate"][layer] or 0.0) for r in rows]
                ax.plot([str(r["value"]) for r in rows], ys, "o-", label=f"layer {layer}")
            ax.set_xlabel(name)
            ax.set_ylabel("HEC hit rate (%)")
            ax.legend(fontsize=7)
    save_figure(fig, path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--section",
        nargs="+",
        default=["scaling", "traffic", "sweep"],
        choices=["scaling", "traffic", "sweep"],
    )
    p.add_argument("--out", type=Path, default=RESULTS / "distributed.json")
    args = p.parse_args()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    with tempfile.TemporaryDirectory(prefix="distmb-dist-") as tmp:
        for section in args.section:
            result[section] = {"scaling": scaling, "traffic": traffic, "sweep": sweep}[section](
                Path(tmp)
            )
    result["cpus"] = os.cpu_count()
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
