"""Time and peak memory of loading OGB's binary layout (``ogb:DIR`` with ``raw/data.npz``).

Writes a papers100M-shaped directory (random directed edges, float32 features, float32
labels with NaN, ``split/time``) with ``np.savez_compressed`` as OGB ships it, then, each in
a fresh process that samples its own anonymous resident memory (``RssAnon``, memory-mapped
file pages excluded) every 20 ms:

- ``cold``: the first ``load_ogb`` (streams data.npz into the cache, builds the CSR);
- ``warm``: a second ``load_ogb`` (cache hit: edges and features memory-mapped);
- ``csr-new`` / ``csr-old``: ``build_in_csr`` alone on the cached, memory-mapped edges with
  this checkout's ``_C`` and with another build (``--old-so``, e.g. main's before the
  in-place compaction).

Writes ``results/ogb_npz_load.json``.

    python benchmarks/ogb_npz_load.py --nodes 4000000 --edges 50000000 \\
        --old-so ../main-before/distmb/_C.cpython-311-x86_64-linux-gnu.so
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from record import command_line

from distmb.cli.report import write_json
from distmb.core.machine import cpu_model

RESULTS = Path(__file__).resolve().parents[1] / "results"

#: Runs in a child process: sample RssAnon while ``ACTION`` runs; print one JSON line.
_CHILD = r"""
import json, sys, threading, time
import numpy as np
peak = [0]
done = threading.Event()
def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss_anon())
        time.sleep(0.02)
base = rss_anon()
t = threading.Thread(target=sample, daemon=True); t.start()
action, root, so = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
if action == "load":
    from distmb.data.datasets.ogb import load_ogb
    g = load_ogb(root)
    extra = {"in_edges": g.num_edges, "notes": [n for n in g.notes if "cache" in n][:1]}
else:
    import importlib.util
    spec = importlib.util.spec_from_file_location("_C", so)
    C = importlib.util.module_from_spec(spec); spec.loader.exec_module(C)
    src = np.load(root + "/distmb-cache/src.npy", mmap_mode="r")
    dst = np.load(root + "/distmb-cache/dst.npy", mmap_mode="r")
    n = int(np.load(root + "/distmb-cache/labels.npy", mmap_mode="r").shape[0])
    indptr, indices, loops, dups = C.build_in_csr(src, dst, n, True, True)
    extra = {"in_edges": int(indices.size), "duplicates": int(dups)}
wall = time.perf_counter() - t0
done.set(); t.join()
peak[0] = max(peak[0], rss_anon())
print(json.dumps({"wall_s": round(wall, 2), "base_anon_gib": round(base / 2**30, 3),
                  "peak_anon_gib": round(peak[0] / 2**30, 3), **extra}))
"""


def make_dataset(root: Path, nodes: int, edges: int, feat_dim: int, seed: int) -> dict:
    """A papers100M-shaped binary-layout directory; returns its sizes."""
    rng = np.random.default_rng(seed)
    (root / "raw").mkdir(parents=True)
    edge_index = rng.integers(0, nodes, (2, edges), dtype=np.int64)
    features = rng.standard_normal((nodes, feat_dim), dtype=np.float32)
    t0 = time.perf_counter()
    np.savez_compressed(
        root / "raw" / "data.npz",
        edge_index=edge_index,
        node_feat=features,
        num_nodes_list=np.array([nodes]),
        num_edges_list=np.array([edges]),
    )
    del edge_index, features
    labels = np.full((nodes, 1), np.nan, dtype=np.float32)
    labelled = rng.choice(nodes, nodes // 70, replace=False)  # papers100M: ~1.4 % labelled
    labels[labelled, 0] = rng.integers(0, 172, labelled.size)
    np.savez_compressed(root / "raw" / "node-label.npz", node_label=labels)
    for name, part in zip(("train", "valid", "test"), np.array_split(labelled, 3), strict=True):
        path = root / "split" / "time" / f"{name}.csv.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.write("\n".join(map(str, part.tolist())) + "\n")
    return {
        "nodes": nodes,
        "edges": edges,
        "feat_dim": feat_dim,
        "edge_index_gib": round(16 * edges / 2**30, 3),
        "features_gib": round(4 * nodes * feat_dim / 2**30, 3),
        "data_npz_gib": round((root / "raw" / "data.npz").stat().st_size / 2**30, 3),
        "write_s": round(time.perf_counter() - t0, 1),
    }


def run_child(action: str, root: Path, so: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    cmd = [sys.executable, "-c", _CHILD, action, str(root), so]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{action} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=4_000_000)
    p.add_argument("--edges", type=int, default=50_000_000)
    p.add_argument("--feat-dim", type=int, default=16)
    p.add_argument("--old-so", default=None, help="another build of distmb/_C to compare")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    p.add_argument("--out", type=Path, default=RESULTS / "ogb_npz_load.json")
    args = p.parse_args()
    import distmb._C as current

    with tempfile.TemporaryDirectory(prefix="distmb-ogbnpz-", dir=args.workdir) as tmp:
        root = Path(tmp) / "ogbn_papers_shaped"
        dataset = make_dataset(root, args.nodes, args.edges, args.feat_dim, seed=0)
        print(json.dumps(dataset), flush=True)
        runs = {}
        for action, so in (("cold", ""), ("warm", ""), ("csr-new", current.__file__)) + (
            (("csr-old", args.old_so),) if args.old_so else ()
        ):
            runs[action] = run_child("load" if action in ("cold", "warm") else "csr", root, so)
            print(action, json.dumps(runs[action]), flush=True)
    result = {
        "benchmark": "ogb_npz_load",
        "command": command_line(),
        "machine": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "2"),
            "platform": platform.platform(),
        },
        "dataset": dataset,
        "runs": runs,
    }
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
