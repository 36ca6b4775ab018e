"""Single-rank epoch time of GraphSAGE (paper defaults) with the MBC/FWD/BWD split.

The baseline that the fused kernels and multi-rank training improve on. Runs a few epochs
on a synthetic graph (default: 200k vertices, average degree 30) and reports the median
epoch and phase times over the epochs after the first (warm-up). Writes
``results/train_epoch.json`` and ``results/train_epoch.png``.

    python benchmarks/train_epoch.py
    python benchmarks/train_epoch.py --kernels torch fused     # fused kernels against PyTorch ops
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from distmb.cli.report import save_figure, write_json
from distmb.config.train import TrainConfig
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.timers import PHASE_LABELS, PHASES

RESULTS = Path(__file__).resolve().parents[1] / "results"


def run(local: LocalGraph, model: str, epochs: int, kernels: str) -> dict:
    config = TrainConfig(
        model=model, epochs=epochs, eval_every=10**9, progress=False, kernels=kernels
    )
    trainer = Trainer(local, config, log=lambda _: None)
    records = []
    for epoch in range(epochs):
        records.append(trainer.train_epoch(epoch))
    timed = records[1:] if len(records) > 1 else records
    median = {
        k: round(statistics.median(r[k] for r in timed), 3)
        for k in ("epoch_time", *PHASES, "samples_per_s")
    }
    return {
        "model": model,
        "kernels": kernels,
        "epochs": epochs,
        "iterations_per_epoch": records[0]["iterations"],
        "median": median,
        "per_epoch": records,
    }


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{r['model']}\n{r['kernels']}" for r in runs]
    bottom = [0.0] * len(runs)
    for phase in PHASES:
        values = [r["median"][phase] for r in runs]
        ax.bar(labels, values, bottom=bottom, label=PHASE_LABELS[phase])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("median seconds per epoch")
    ax.set_title("single-rank epoch time (200k vertices, deg 30)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dataset", default="synthetic:nodes=200000,avg_degree=30")
    p.add_argument("--models", nargs="+", default=["sage"])
    p.add_argument("--kernels", nargs="+", default=["torch", "fused"], choices=["torch", "fused"])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--out", type=Path, default=RESULTS / "train_epoch.json")
    args = p.parse_args()
    graph = load_dataset(args.dataset)
    local = LocalGraph.from_graph(graph)
    runs = []
    for model in args.models:
        for kernels in args.kernels:
            r = run(local, model, args.epochs, kernels)
            print(json.dumps({k: r[k] for k in ("model", "kernels", "median")}), flush=True)
            runs.append(r)
    result = {
        "benchmark": "train_epoch",
        "dataset": args.dataset,
        "summary": graph.summary(),
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "runs": runs,
    }
    write_json(args.out, result)
    plot(runs, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
