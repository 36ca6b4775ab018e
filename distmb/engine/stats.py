"""Per-epoch records: the cross-rank view of an epoch, and the line printed for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from distmb.comm import RankGroup
from distmb.core.atomic import append_whole, write_atomic
from distmb.engine.timers import PHASES
from distmb.halo.scheme import SECOND_COUNTERS


def allreduce_named(comm: RankGroup, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Element-wise sums over ranks of several float64-compatible arrays in one
    ``Allreduce``: packed by name in a fixed order, unpacked by the same names."""
    names = sorted(arrays)
    flat = [np.asarray(arrays[n], dtype=np.float64).reshape(-1) for n in names]
    total = comm.allreduce_sum(np.concatenate(flat) if flat else np.zeros(0))
    out, offset = {}, 0
    for name, part in zip(names, flat, strict=True):
        out[name] = total[offset : offset + part.size]
        offset += part.size
    return out


def global_stats(
    comm: RankGroup,
    record: dict[str, Any],
    halo: dict[str, np.ndarray],
) -> dict[str, Any]:
    """Cross-rank view of an epoch: loss and accuracy averaged over ranks, phases (and the
    loader's wait) at their maximum, load imbalance, halo-scheme counters summed. (The
    caches' records come from their owners: :mod:`distmb.engine.build.counters`.)

    Args:
        record: this rank's epoch record (:meth:`Trainer.train_epoch`).
        halo: this rank's halo-scheme counters (:meth:`HaloScheme.stats`).
    """
    total = allreduce_named(
        comm,
        {
            "loss": np.array([record["loss"]]),
            "train_acc": np.array([record["train_acc"]]),
            **{k: v for k, v in halo.items() if k not in SECOND_COUNTERS},
        },
    )
    out = {
        "loss": float(total["loss"][0] / comm.size),
        "train_acc": float(total["train_acc"][0] / comm.size),
        "hec_hit_rate": [
            float(h / lk) if lk else None
            for h, lk in zip(total["hits"], total["lookups"], strict=True)
        ],
        "rows_pushed": [int(r) for r in total["rows_pushed"]],
        "bytes_pushed": int(total["bytes_pushed"].sum()),
        "bytes_received": int(total["bytes_received"].sum()),
        "bytes_exact_pull": [int(b) for b in total["bytes_needed"]],
        "bytes_exact_remote": int(total["bytes_exact_remote"][0]),
        "comm_wait": round(comm.allreduce_max(float(halo["comm_wait"][0])), 4),
        "imbalance": round(
            comm.allreduce_max(record["epoch_time"])
            / max(comm.allreduce_min(record["epoch_time"]), 1e-9),
            3,
        ),
    }
    for phase in ("epoch_time", *PHASES, "sample", "gather", "load_wait"):
        out[phase] = round(comm.allreduce_max(record[phase]), 4)
    return out


def rank_records(
    comm: RankGroup, counts: dict[str, Any], times: dict[str, float]
) -> dict[str, list[dict[str, Any]]]:
    """Every rank's own view of an epoch, gathered (one ``allgather``; every rank gets all).

    Args:
        counts: this rank's counters (sizes of its part, work, traffic; the same in
            identical runs).
        times: this rank's wall and CPU seconds (they differ between identical runs).

    Returns:
        ``{"per_rank": [counts of rank 0, ...], "per_rank_time": [times of rank 0, ...]}``,
        each entry with its ``rank``.
    """
    gathered = comm.allgather((counts, times))
    return {
        "per_rank": [{"rank": r, **c} for r, (c, _) in enumerate(gathered)],
        "per_rank_time": [{"rank": r, **t} for r, (_, t) in enumerate(gathered)],
    }


#: Counters of the feature cache that are summed over ranks (the times are maxima).
_CACHE_SUMS = ("lookups", "hits", "rows_read", "bytes_read", "memory_bytes")


def cache_record(comm: RankGroup, counters: dict[str, float]) -> dict[str, Any]:
    """The epoch record of an out-of-core cache (``feature_cache``, ``neighbor_cache``):
    rows (or lists) requested (``lookups``), ``hits`` and the ``hit_rate``, rows and bytes
    read from disk, cache memory (summed over ranks); disk read and inspector seconds
    (maximum over ranks)."""
    total = allreduce_named(comm, {k: np.array([counters[k]]) for k in _CACHE_SUMS})
    out: dict[str, Any] = {k: int(total[k][0]) for k in _CACHE_SUMS}
    out["hit_rate"] = out["hits"] / out["lookups"] if out["lookups"] else None
    for key in ("read_time", "inspect_time"):
        out[key] = round(comm.allreduce_max(float(counters[key])), 4)
    return out


#: Counters of the device feature cache (GPU path), summed over ranks.
DEVICE_CACHE_SUMS = (
    "lookups", "hits", "misses", "rows_loaded", "rows_reused", "bytes_h2d", "memory_bytes",
)  # fmt: skip


def device_cache_record(comm: RankGroup, counters: dict[str, int], policy: str) -> dict[str, Any]:
    """The epoch record of the GPU path's device feature cache (``device_cache``): ids
    looked up, cache hits and the ``hit_rate``, rows read from host memory (``rows_loaded``)
    and taken from the previous batch instead (``rows_reused``, Match), host->device bytes
    and the cache's device memory, summed over ranks."""
    total = allreduce_named(comm, {k: np.array([counters[k]]) for k in DEVICE_CACHE_SUMS})
    out: dict[str, Any] = {k: int(total[k][0]) for k in DEVICE_CACHE_SUMS}
    out["hit_rate"] = out["hits"] / out["lookups"] if out["lookups"] else None
    out["policy"] = policy
    return out


def format_epoch(r: dict[str, Any]) -> str:
    """One line per epoch: loss, accuracies, time and its MBC/FWD/BWD/ARed split, and how
    long the loop waited for batches (``wait``: MBC not hidden by prefetching)."""
    acc = f"train {100 * r['train_acc']:.2f}%"
    if "val_acc" in r:
        acc += f"  val {100 * r['val_acc']:.2f}%  test {100 * r['test_acc']:.2f}%"
    return (
        f"epoch {r['epoch']:3d}  loss {r['loss']:.4f}  {acc}  |  {r['epoch_time']:.2f}s "
        f"(MBC {r['mbc']:.2f}  wait {r['load_wait']:.2f}  FWD {r['fwd']:.2f}  "
        f"BWD {r['bwd']:.2f}  ARed {r['ared']:.2f})  {r['samples_per_s']:.0f} samples/s"
    )


def format_feature_cache(r: dict[str, Any]) -> str:
    """The out-of-core part of the epoch line (empty without ``--features ooc`` and
    ``--graph-layout ooc``)."""
    parts = []
    for key, name in (("feature_cache", "feature cache"), ("neighbor_cache", "neighbour cache")):
        c = r.get(key)
        if not c:
            continue
        rate = "-" if c["hit_rate"] is None else f"{100 * c['hit_rate']:.1f}%"
        text = f"{name} hit {rate}  read {c['bytes_read'] / 2**20:.1f} MiB in {c['read_time']:.2f}s"
        if c["inspect_time"]:
            text += f"  inspect {c['inspect_time']:.2f}s"
        parts.append(text)
    d = r.get("device_cache")
    if d:
        rate = "-" if d["hit_rate"] is None else f"{100 * d['hit_rate']:.1f}%"
        parts.append(f"device cache hit {rate}  host->device {d['bytes_h2d'] / 2**20:.1f} MiB")
    return "".join(f"  |  {p}" for p in parts)


def format_hec(r: dict[str, Any]) -> str:
    """The multi-rank part of the epoch line: HEC hit rates, traffic, wait, imbalance."""
    rates = "/".join("-" if h is None else f"{100 * h:.0f}%" for h in r["hec_hit_rate"])
    if r.get("bytes_exact_remote"):
        traffic = f"exact remote {r['bytes_exact_remote'] / 2**20:.1f} MiB"
    else:
        traffic = f"HEC hit {rates}  pushed {r['bytes_pushed'] / 2**20:.1f} MiB"
    return f"  |  {traffic}  comm wait {r['comm_wait']:.2f}s  imbalance {r['imbalance']:.2f}"


def drop_records_from(path: str | Path, first_epoch: int) -> int:
    """Remove the records of epochs ``>= first_epoch`` at the end of a ``--results`` file:
    what a killed run wrote after its last checkpoint, which the resumed run writes again.
    Earlier records (other runs, earlier epochs) are kept; the file is rewritten atomically.
    Returns how many records were dropped."""
    path = Path(path)
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    keep = len(lines)
    while keep > 0:
        try:
            record = json.loads(lines[keep - 1])
        except json.JSONDecodeError:
            if keep == len(lines):  # a torn last line of the killed run
                keep -= 1
                continue
            break
        epoch = record.get("epoch") if isinstance(record, dict) else None
        if not isinstance(epoch, int) or epoch < first_epoch:
            break
        keep -= 1
    if keep == len(lines):
        return 0
    text = "".join(lines[:keep])
    write_atomic(path, lambda f: f.write(text.encode()), "results")
    return len(lines) - keep


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON object as one line, whole or not at all
    (:func:`~distmb.core.atomic.append_whole`).

    Raises:
        OutputError: ``cannot write results PATH: REASON`` (a full disk, a quota, ...).
    """
    line = json.dumps(record, allow_nan=True) + "\n"
    append_whole(path, line.encode(), "results")
