"""``python -m distmb.report FILE...``: plots of ``--results`` JSONL files.

For every ``FILE`` it writes ``FILE.png`` beside it: loss and accuracy curves per epoch (with
the best validation epoch marked), and the stacked epoch-time breakdown (MBC / FWD / BWD /
ARed / OPT, plus evaluation).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from distmb.core.atomic import write_atomic
from distmb.core.errors import InputError, exit_on_user_error
from distmb.core.plotting import panels, set_scale
from distmb.engine.timers import PHASE_LABELS, PHASES

#: Keys every per-epoch record has (the others are drawn when present).
REQUIRED_KEYS = ("epoch", "loss")


#: What a file given to the report must be, as its errors say.
EXPECTED = "expected a --results file of python -m distmb.train: one JSON object per line"


def read_records(path: Path) -> list[dict[str, Any]]:
    """The per-epoch records of a JSONL results file (objects without ``epoch`` skipped).

    Raises:
        InputError: one line naming the file (and line) and what was expected: not a
            regular file, unreadable, not UTF-8 text (a checkpoint, an image), a line that
            is not a JSON object, an epoch record without its keys, or no epoch record.
    """
    if path.exists() and not path.is_file():  # a directory, a device: never read to its end
        raise InputError(f"{path}: not a regular file ({EXPECTED})")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file ({EXPECTED})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{path}:{number}: not a JSON object ({exc.msg}; {EXPECTED})"
            ) from None
        if not isinstance(record, dict):
            raise InputError(
                f"{path}:{number}: a JSON {type(record).__name__}, not an object ({EXPECTED})"
            )
        if "epoch" in record:
            missing = [k for k in REQUIRED_KEYS if k not in record]
            if missing:
                raise InputError(
                    f"{path}:{number}: an epoch record without {', '.join(missing)} "
                    "(is it a --results file of python -m distmb.train?)"
                )
            records.append(record)
    if not records:
        raise InputError(f"{path}: no per-epoch records (is it a --results file?)")
    return records


def plot(records: list[dict[str, Any]], out: Path, title: str) -> None:
    """Draw loss, accuracy, time per epoch, (multi-rank runs with the historical cache) the
    HEC hit rate per layer and (``--features ooc``) the feature cache's hit rate, labelled
    with its policy, into ``out`` (PNG, written atomically); panels wrap into rows of 3
    (:mod:`distmb.core.plotting`), the loss axis is logarithmic only when it spans >= 10x."""
    x = list(range(len(records)))
    epochs = [r["epoch"] for r in records]
    hit_rates = [r.get("hec_hit_rate") or [] for r in records]
    with_hec = any(h is not None for rates in hit_rates for h in rates)
    caches = {key: [r.get(key) for r in records] for key in ("feature_cache", "neighbor_cache")}
    with_cache = any(
        c and c.get("hit_rate") is not None for series in caches.values() for c in series
    )
    fig, axes = panels(3 + with_hec + with_cache)
    ax_loss, ax_acc, ax_time = axes[:3]
    losses = [r["loss"] for r in records]
    ax_loss.plot(x, losses, "o-", ms=3)
    log_loss = set_scale(ax_loss, losses) == "log"
    ax_loss.set_ylabel("training loss" + (" (log scale)" if log_loss else ""))
    for key, label in (
        ("train_acc", "train (mini-batch)"),
        ("val_acc", "val"),
        ("test_acc", "test"),
    ):
        pts = [(i, 100 * r[key]) for i, r in enumerate(records) if key in r]
        if pts:
            ax_acc.plot(*zip(*pts, strict=True), "o-", ms=3, label=label)
    best = records[-1].get("best_epoch")  # the run's best validation epoch (model selection)
    if best in epochs:
        ax_acc.axvline(epochs.index(best), color="k", ls=":", label=f"best val (epoch {best})")
    ax_acc.set_ylabel("accuracy (%)")
    ax_acc.legend()
    # Stacked: what the epoch waited for. With prefetching, MBC overlaps the compute, so the
    # loader's wait is stacked and the whole MBC is drawn as a line.
    prefetched = all("load_wait" in r for r in records)
    stacked = ("load_wait" if prefetched else "mbc", *PHASES[1:], "eval_time")
    labels = {**PHASE_LABELS, "load_wait": "batch wait", "eval_time": "eval"}
    bottom = [0.0] * len(records)
    for phase in stacked:
        values = [float(r.get(phase, 0.0)) for r in records]
        ax_time.bar(x, values, bottom=bottom, label=labels.get(phase, phase))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    if prefetched:
        ax_time.plot(x, [r["mbc"] for r in records], "k.--", label="MBC (overlapped)")
    ax_time.set_ylabel("seconds per epoch")
    ax_time.legend(fontsize=8)
    if with_hec:
        ax_hec = axes[3]
        for layer in range(max(len(rates) for rates in hit_rates)):
            pts = [
                (i, 100 * rates[layer])
                for i, rates in enumerate(hit_rates)
                if layer < len(rates) and rates[layer] is not None
            ]
            if pts:
                ax_hec.plot(*zip(*pts, strict=True), "o-", ms=3, label=f"layer {layer}")
        ax_hec.set_ylabel("HEC hit rate (%)")
        ax_hec.legend(fontsize=8)
    if with_cache:
        ax_fc = axes[-1]
        for key, name in (("feature_cache", "features"), ("neighbor_cache", "neighbour lists")):
            pts = [
                (i, 100 * c["hit_rate"])
                for i, c in enumerate(caches[key])
                if c and c.get("hit_rate") is not None
            ]
            if not pts:
                continue
            last = next(c for c in reversed(caches[key]) if c)
            label = (
                f"{name}: {last.get('policy', '?')}, {last.get('memory_bytes', 0) / 2**20:.0f} MiB"
            )
            ax_fc.plot(*zip(*pts, strict=True), "o-", ms=3, label=label)
        ax_fc.set_ylabel("out-of-core cache hit rate (%)")
        ax_fc.legend(fontsize=8)
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.set_xticks(x[:: max(1, len(x) // 10)], [str(e) for e in epochs[:: max(1, len(x) // 10)]])
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    save_figure(fig, out)


def save_figure(fig, path: Path, dpi: int = 100) -> None:
    """Save a matplotlib figure as PNG via a temporary file and a rename (a reader never sees
    a partial image), then close it."""
    import matplotlib.pyplot as plt

    try:
        write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=dpi), "plot")
    finally:
        plt.close(fig)


def write_json(path: Path, obj: Any, indent: int = 1) -> None:
    """Write ``obj`` as JSON via a temporary file and a rename, creating parent directories."""
    text = json.dumps(obj, indent=indent) + "\n"
    write_atomic(path, lambda f: f.write(text.encode()), "JSON")


@exit_on_user_error("distmb.report")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m distmb.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", type=Path, help="--results JSONL files")
    p.add_argument(
        "--all-runs",
        action="store_true",
        help="a file that holds several runs: draw each into FILE.RUN_ID.png (default: the "
        "last run into FILE.png)",
    )
    args = p.parse_args(argv)
    for path in args.files:
        runs = split_runs(read_records(path))
        if len(runs) > 1 and not args.all_runs:
            print(f"{path} holds {len(runs)} runs; drawing the last (--all-runs for each)")
        chosen = runs if args.all_runs else runs[-1:]
        for i, records in enumerate(chosen):
            last = i == len(chosen) - 1
            run_id = records[-1].get("run_id")
            suffix = ".png" if last or run_id is None else f".{run_id}.png"
            out = path.with_name(path.name + suffix)
            name = records[-1].get("model", "")
            title = f"{path.name}: {name} on {records[-1].get('dataset', '?')}"
            plot(records, out, title + (f" (run {run_id})" if run_id else ""))
            print(f"wrote {out}")
    return 0


def split_runs(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive records of one run (same ``run_id``) per list, in file order; records
    written before runs had ids form one run."""
    runs: list[list[dict[str, Any]]] = []
    for record in records:
        if runs and runs[-1][-1].get("run_id") == record.get("run_id"):
            runs[-1].append(record)
        else:
            runs.append([record])
    return runs


if __name__ == "__main__":
    sys.exit(main())
