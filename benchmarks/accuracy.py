"""The README's accuracy tables, measured: writes ``results/accuracy.json``.

- ``single``: Cora with the documented GraphSAGE and GAT recipes (median of seeds 0-2, 30
  epochs, last epoch), GraphSAGE with model selection (``recipes.CORA_SAGE_SELECTED``: test
  accuracy at the best validation epoch, median of ``recipes.CORA_SELECTED_SEEDS``; the
  last epoch's beside it), and the built-in synthetic graph with the defaults
  (``python -m distmb.train``: first-epoch loss, test accuracy after 10 and 40 epochs,
  seed 0).
- ``multi``: the multi-rank table (``distmb.config.recipes.MULTI_RANK``: the same global batch as
  one rank; medians of 10 Cora seeds and 3 synthetic seeds): 1 rank, and 2 and 4 ranks with
  the historical embedding cache and without (``--no-hec``), under a real ``mpiexec``.

    python benchmarks/accuracy.py                       # both tables (~10 min on 2 cores)
    python benchmarks/accuracy.py --tables multi --datasets synthetic
    python benchmarks/accuracy.py --tables single --datasets cora --entries cora_sage_selected

``--out`` is updated, not replaced: entries measured now replace those of the same name, the
others are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distmb.cli.report import write_json
from distmb.config import recipes
from distmb.config.train import TrainConfig
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        raise SystemExit("mpiexec not found: install the mpich extra (pip install -e '.[mpich]')")
    return found


def single_rank(spec: str, recipe: dict, seed: int) -> list[dict]:
    config = TrainConfig(**recipe, seed=seed, progress=False)
    return Trainer(LocalGraph.from_graph(load_dataset(spec)), config, log=lambda _: None).fit()


def multi_rank(spec: str, recipe: dict, ranks: int, seed: int, extra: list[str], work: Path):
    results = work / f"r{ranks}-{seed}-{len(extra)}.jsonl"
    per_rank = {**recipe, "batch_size": recipe["batch_size"] // ranks}
    cmd = [
        mpiexec(), "-n", str(ranks), sys.executable, "-m", "distmb.train", "--dataset", spec,
        *recipes.as_flags(per_rank), "--eval-every", str(recipe["epochs"]), "--no-progress",
        "--threads", "1", "--seed", str(seed), "--partition-cache", str(work / "parts"),
        "--results", str(results), *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return [json.loads(line) for line in results.read_text().splitlines()]


#: The entries of the ``single`` table.
SINGLE_ENTRIES = ("cora_sage", "cora_gat", "cora_sage_selected", "synthetic_default")


def table_single(datasets: list[str], entries: list[str]) -> dict:
    out: dict = {}
    spec = "cora"  # the shipped Planetoid files
    for name, recipe in (("cora_sage", recipes.CORA_SAGE), ("cora_gat", recipes.CORA_GAT)):
        if "cora" not in datasets or name not in entries:
            continue
        accs = [single_rank(spec, recipe, s)[-1]["test_acc"] for s in (0, 1, 2)]
        out[name] = {"recipe": _jsonable(recipe), "seeds": [0, 1, 2], "test_acc": accs,
                     "median": statistics.median(accs)}  # fmt: skip
        print(name, out[name]["median"], flush=True)
    if "cora" in datasets and "cora_sage_selected" in entries:
        recipe, seeds = recipes.CORA_SAGE_SELECTED, recipes.CORA_SELECTED_SEEDS
        last = [single_rank(spec, recipe, s)[-1] for s in seeds]
        best = [r["best_test_acc"] for r in last]
        out["cora_sage_selected"] = {
            "recipe": _jsonable(recipe),
            "seeds": list(seeds),
            "test_acc": best,  # at the best validation epoch
            "median": statistics.median(best),
            "best_epoch": [r["best_epoch"] for r in last],
            "epochs_run": [r["epoch"] + 1 for r in last],
            "test_acc_last_epoch": [r["test_acc"] for r in last],
            "median_last_epoch": statistics.median(r["test_acc"] for r in last),
        }
        print("cora_sage_selected", out["cora_sage_selected"]["median"], flush=True)
    if "synthetic" in datasets and "synthetic_default" in entries:
        history = single_rank("synthetic", {"epochs": 40}, 0)
        out["synthetic_default"] = {
            "recipe": "defaults (python -m distmb.train), seed 0",
            "first_epoch_loss": history[0]["loss"],
            "test_acc_epoch10": history[9]["test_acc"],
            "test_acc_epoch40": history[39]["test_acc"],
        }
        print("synthetic_default", out["synthetic_default"], flush=True)
    return out


def table_multi(datasets: list[str], rank_counts: list[int]) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for dataset in datasets:
            spec = "cora" if dataset == "cora" else "synthetic"
            recipe, seeds = recipes.MULTI_RANK[dataset], recipes.MULTI_RANK_SEEDS[dataset]
            eval_last = {**recipe, "eval_every": recipe["epochs"]}
            row = {"recipe": _jsonable(recipe), "seeds": list(seeds)}
            row["1"] = statistics.median(
                single_rank(spec, eval_last, s)[-1]["test_acc"] for s in seeds
            )
            for ranks in rank_counts:
                for mode, extra in (("hec", []), ("no-hec", ["--no-hec"])):
                    accs = [
                        multi_rank(spec, recipe, ranks, s, extra, work)[-1]["test_acc"]
                        for s in seeds
                    ]
                    row[f"{ranks}-{mode}"] = statistics.median(accs)
            out[dataset] = row
            print(dataset, {k: v for k, v in row.items() if k[0].isdigit()}, flush=True)
    return out


def _jsonable(recipe: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in recipe.items()}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tables", nargs="+", choices=["single", "multi"], default=["single", "multi"])
    p.add_argument(
        "--datasets", nargs="+", choices=["cora", "synthetic"], default=["cora", "synthetic"]
    )
    p.add_argument(
        "--entries",
        nargs="+",
        choices=SINGLE_ENTRIES,
        default=list(SINGLE_ENTRIES),
        help="entries of the single table to measure",
    )
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--out", type=Path, default=RESULTS / "accuracy.json")
    args = p.parse_args()
    start = time.time()
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result.update(benchmark="accuracy", platform=platform.platform(), cpus=os.cpu_count())
    if "single" in args.tables:
        result.setdefault("single", {}).update(table_single(args.datasets, args.entries))
    if "multi" in args.tables:
        result.setdefault("multi", {}).update(table_multi(args.datasets, args.ranks))
    result["seconds"] = round(time.time() - start, 1)  # of the last invocation
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
