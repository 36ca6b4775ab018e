"""Overlap of mini-batch creation with training: epoch time with ``--prefetch 0`` and ``N``.

Single rank, GraphSAGE with the paper's defaults, on a products-shaped synthetic graph
(ogbn-products: average degree ~50, 100 features, 47 classes, 8 % training vertices; a
power-law degree distribution with hubs; 250k vertices by default so that it runs on a
laptop). For each setting it trains a few epochs and takes medians over the epochs after
the first (warm-up); runs alternate between settings so that drift on a shared machine
hits both alike.

Reported per setting: epoch time, MBC (sample + gather, wherever it ran), the training
loop's wait for batches (``load_wait``) and compute (FWD + BWD + ARed + OPT). The target of
the data-path issue: with prefetching the epoch takes at most 1.1x ``max(compute, MBC)``.
Both readings are reported: against the phases of the synchronous run (no sharing of cores:
the stricter bound) and against the prefetched run's own phases (which sharing inflates).

    python benchmarks/prefetch.py                        # prefetch 0 vs 2, --threads = all
    python benchmarks/prefetch.py --threads 12 --loader-threads 4
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from pathlib import Path

import torch

from distmb import _C
from distmb.cli.report import save_figure, write_json
from distmb.config.train import TrainConfig
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: ogbn-products' shape at 1/10 of its vertices.
PRODUCTS_SHAPED = (
    "synthetic:nodes=250000,avg_degree=50,feat_dim=100,classes=47,"
    "train_fraction=0.08,val_fraction=0.02,test_fraction=0.9"
)
#: Phases of an iteration that are compute (not mini-batch creation).
COMPUTE = ("fwd", "bwd", "ared", "opt")
#: The issue's bound: epoch time with prefetching <= this x max(compute, MBC).
TARGET_RATIO = 1.1


def run_epochs(local: LocalGraph, config: TrainConfig, epochs: int) -> list[dict]:
    trainer = Trainer(local, config, log=lambda _: None)
    out = []
    for epoch in range(epochs):
        r = trainer.train_epoch(epoch)
        out.append(
            {
                "epoch_time": r["epoch_time"],
                "mbc": r["mbc"],
                "sample": r["sample"],
                "gather": r["gather"],
                "load_wait": r["load_wait"],
                "compute": round(sum(r[k] for k in COMPUTE), 4),
            }
        )
    return out


def median(records: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in records), 4)


def plot(settings: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [s["label"] for s in settings]
    compute = [s["median"]["compute"] for s in settings]
    wait = [s["median"]["load_wait"] for s in settings]
    ax.bar(labels, compute, label="compute (FWD+BWD+ARed+OPT)")
    ax.bar(labels, wait, bottom=compute, label="waiting for batches")
    ax.plot(labels, [s["median"]["epoch_time"] for s in settings], "ko", label="epoch time")
    ax.plot(labels, [s["median"]["mbc"] for s in settings], "r^", label="MBC (sample + gather)")
    ax.set_ylabel("median seconds per epoch")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dataset", default=PRODUCTS_SHAPED)
    p.add_argument("--prefetch", type=int, nargs="+", default=[0, 2])
    p.add_argument("--epochs", type=int, default=4, help="per run; the first is warm-up")
    p.add_argument("--repeats", type=int, default=2, help="alternating runs per setting")
    p.add_argument("--threads", type=int, default=None, help="PyTorch and kernel threads")
    p.add_argument("--loader-threads", type=int, default=None, help="prefetch thread's")
    p.add_argument("--out", type=Path, default=RESULTS / "prefetch.json")
    args = p.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        _C.set_num_threads(args.threads)
    graph = load_dataset(args.dataset)
    local = LocalGraph.from_graph(graph)
    print(graph.summary(), flush=True)
    timed: dict[int, list[dict]] = {n: [] for n in args.prefetch}
    for repeat in range(args.repeats):
        for n in args.prefetch:
            config = TrainConfig(
                epochs=args.epochs,
                eval_every=10**9,
                progress=False,
                prefetch=n,
                threads=args.threads,
                loader_threads=args.loader_threads,
            )
            records = run_epochs(local, config, args.epochs)
            timed[n].extend(records[1:] if len(records) > 1 else records)
            print(f"repeat {repeat} prefetch {n}: {records}", flush=True)
    settings = []
    for n in args.prefetch:
        med = {
            k: median(timed[n], k)
            for k in ("epoch_time", "mbc", "sample", "gather", "load_wait", "compute")
        }
        settings.append({"prefetch": n, "label": f"prefetch {n}", "median": med})
    sync = next((s for s in settings if s["prefetch"] == 0), None)
    if sync is not None:
        bound = max(sync["median"]["compute"], sync["median"]["mbc"])
        for s in settings:
            s["ratio_to_max_compute_mbc"] = round(s["median"]["epoch_time"] / bound, 3)
            s["speedup_vs_sync"] = round(
                sync["median"]["epoch_time"] / s["median"]["epoch_time"], 3
            )
            own = max(s["median"]["compute"], s["median"]["mbc"])
            s["ratio_to_own_max_compute_mbc"] = round(s["median"]["epoch_time"] / own, 3)
            s["meets_target"] = s["ratio_to_max_compute_mbc"] <= TARGET_RATIO
        print(
            f"bound max(compute, MBC) of the synchronous run: {bound:.3f} s; "
            + "; ".join(
                f"prefetch {s['prefetch']}: {s['median']['epoch_time']:.3f} s "
                f"(x{s['ratio_to_max_compute_mbc']} of the bound, x"
                f"{s['ratio_to_own_max_compute_mbc']} of its own, wait "
                f"{s['median']['load_wait']:.3f} s)"
                for s in settings
            ),
            flush=True,
        )
    threads = torch.get_num_threads()
    result = {
        "benchmark": "prefetch",
        "dataset": args.dataset,
        "summary": graph.summary(),
        "threads": threads,
        "loader_threads": args.loader_threads or threads,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "epochs_timed": {str(n): len(v) for n, v in timed.items()},
        "target_ratio": TARGET_RATIO,
        "settings": settings,
        "per_epoch": {str(n): v for n, v in timed.items()},
    }
    write_json(args.out, result)
    title = (
        f"{graph.summary()[:60]}...\n{os.cpu_count()} CPUs, {threads} threads, loader "
        f"{args.loader_threads or threads}"
    )
    plot(settings, args.out.with_suffix(".png"), title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
