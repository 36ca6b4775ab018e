"""Work balance of the Triton CSR kernels (GAT's attention, SAGE's aggregation) on the GPU
benchmark's batches, counted on the CPU (no GPU needed).

Every one of those kernels runs one program per tile of ``ROWS`` rows (x a head x a feature
block) and loops ``for k in range(max_deg)``, ``max_deg`` the largest degree among the tile's
rows: a program holding a long row keeps its other lanes idle, and the launch waits for its
longest program. This script builds the benchmark's graph (``benchmarks/gpu.py``'s spec),
samples batches with its fan-outs (the C++ sampler, whose numbering the device sampler
repeats), and for every layer's block and every kernel that walks it counts:

- ``edges``: the loop iterations the rows need (the useful lane-iterations of one pass);
- ``lane_iterations``: ``ROWS * sum over programs of max_deg`` (what is issued), and
  ``ratio = lane_iterations / edges`` (1: no idle lane);
- ``longest``: the largest program ``max_deg`` (its serial loop length), ``mean``: the mean;
- ``makespan_steps``: a list-scheduling model of one launch: the grid's programs start in launch
  order (row tile fastest, then head, then feature block, as CUDA hands out blocks) on
  ``--slots`` concurrent program slots, each running ``passes * max_deg + 1`` steps (a
  step: one loop iteration, latency-bound); ``ideal_steps``: the same work with no idle
  lane and no tail (``passes * edges / ROWS`` + one step per program, spread over the
  slots; at least one program of the mean length); ``slowdown = makespan_steps /
  ideal_steps``, the launch's slowdown from imbalance under that model.

Each kernel is counted with the row order it launches with, ``natural`` (row ``i`` in tile
``i // ROWS``), and the kernels over the transposed CSR also with a hypothetical one,
``sorted``: rows by descending degree (tiles of similar degrees) in a one-dimensional grid
whose first programs are the longest tiles of every head and feature block (the estimate of
that change; the kernels do not do it).

Beside the counts, ``epoch_estimate`` puts the imbalance against the rest of each model's
work on the GPU: per epoch, the edge kernels' bytes (the loads and stores of every kernel
per edge and head; and a lower bound, one feature row per edge, head and kernel), the
matrix products' FLOPs and the element-wise passes over the wide tensors, at assumed H100
rates (:data:`GATHER_BYTES_PER_S`, :data:`GEMM_FLOP_PER_S`, :data:`DENSE_BYTES_PER_S`).

Usage::

    python benchmarks/gat_balance.py [--nodes 2.4e6] [--batches 3] [--out results/gat_balance.json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu import products_spec  # noqa: E402  (benchmarks/ is not a package)
from record import command_line  # noqa: E402

from distmb import _C  # noqa: E402
from distmb.data.datasets.synthetic import SyntheticConfig, generate  # noqa: E402
from distmb.nn.kernels.triton_aggregate import ROWS, block_f  # noqa: E402
from distmb.pipeline.sample.host import NeighborSampler  # noqa: E402

#: The benchmark's sizes (``benchmarks/gpu.py``'s defaults).
FANOUT = (5, 10, 15)
BATCH_SIZE = 1000
HIDDEN = 256
HEADS = 4
FEAT_DIM = 100
CLASSES = 47
#: Concurrent program slots of the makespan model: an H100's 132 SMs x 8 programs of 4 warps.
DEFAULT_SLOTS = 132 * 8
#: Steps a program spends outside its edge loop (loads of its rows, the stores).
PROGRAM_OVERHEAD = 1
#: Bytes of a float32 value and of an int64 index.
VALUE_BYTES = 4
INDEX_BYTES = 8
#: Assumed H100 rates of the time estimates: the edge kernels' effective bandwidth on row
#: gathers (HBM3 peak 3.35 TB/s) and float32 GEMM without tensor cores (peak 67 TFLOP/s).
GATHER_BYTES_PER_S = 2.0e12
GEMM_FLOP_PER_S = 50e12
#: Streaming rate of the element-wise passes (:func:`dense_bytes`).
DENSE_BYTES_PER_S = 2.8e12
#: Whole-tensor passes of :func:`dense_bytes`.
GAT_Z_PASSES = 12
DROPOUT_PASSES = 6
SAGE_OUT_PASSES = 16
#: Iterations of the benchmark's epoch.
ITERATIONS = 192


@dataclass(frozen=True)
class Kernel:
    """One launch over a block: which CSR it walks (``"dst"``: the block's, ``"src"``: its
    transposed one), the loop passes over each row's edges, the grid's copies per row tile
    (heads x feature blocks), the bytes it loads and stores per edge and head
    (:func:`gat_kernels`; cache hits included) and of those the one feature row an edge
    needs at least (a lower bound of its memory traffic), its heads, whether every
    destination adds its own edge (GAT's self loops) and the rows per program."""

    name: str
    csr: str
    passes: int
    copies: int
    edge_bytes: int
    row_bytes: int
    heads: int = 1
    self_edges: bool = False
    rows: int = ROWS


def gat_kernels(layer: int, layers: int) -> list[Kernel]:
    """GAT's edge-walking launches of ``layer`` (triton_gat.py; the scores kernel walks no
    edges). Per-head width ``dim``: ``HIDDEN`` below the last layer, ``CLASSES`` there.

    Bytes per edge and head, float32 values and int64 indices, read from the kernels' loads
    (every feature block's program reloads the edge's index and scalars; a feature row is
    split across the blocks): the forward reads ``cols`` and ``el`` in both passes and the
    source's ``z`` row in the second; the destination kernel reads ``cols``, ``el``, the
    destination's ``dout`` row and the source's ``z`` row in both passes (``_edge_dot``) and
    writes ``dpre``; the source kernel reads ``t_dst``, ``t_edges``, ``er``, ``m``, ``s``,
    ``dpre`` and the destination's ``dout`` row."""
    dim = CLASSES if layer == layers - 1 else HIDDEN
    f_blocks = -(-dim // block_f(dim))
    row = dim * VALUE_BYTES
    return [
        Kernel("gat_forward", "dst", 2, HEADS * f_blocks,
               f_blocks * 2 * (INDEX_BYTES + VALUE_BYTES) + row, row, HEADS, True),
        Kernel("gat_backward_dst", "dst", 2, HEADS,  # features looped inside the program
               2 * (INDEX_BYTES + VALUE_BYTES + 2 * row) + VALUE_BYTES, row, HEADS, True),
        Kernel("gat_backward_src", "src", 1, HEADS * f_blocks,
               f_blocks * (2 * INDEX_BYTES + 4 * VALUE_BYTES) + row, row, HEADS, True),
    ]  # fmt: skip


def sage_kernels(layer: int, layers: int) -> list[Kernel]:
    """SAGE's aggregation launches of ``layer`` (triton_layer.py): aggregate first where the
    layer widens or keeps its width (input 100 -> 256, 256 -> 256), project first where it
    narrows (256 -> 47); no backward aggregation in the input layer (the features need no
    gradient)."""
    d_in = FEAT_DIM if layer == 0 else HIDDEN
    d_out = CLASSES if layer == layers - 1 else HIDDEN
    width = d_out if d_out < d_in else d_in
    f_blocks = -(-width // block_f(width))
    row = width * VALUE_BYTES
    # Per edge: its column index per feature block and the column's row; the backward's
    # "mean" factor of the destination reads two entries of the forward's indptr.
    out = [Kernel("sage_forward", "dst", 1, f_blocks, f_blocks * INDEX_BYTES + row, row)]
    if layer > 0:
        out.append(
            Kernel("sage_backward", "src", 1, f_blocks, f_blocks * 3 * INDEX_BYTES + row, row)
        )
    return out


def gemm_flops(model: str, layer: int, layers: int, n_src: int, n_dst: int) -> float:
    """The layer's matrix products, forward and backward (weight gradients; the input
    gradient except in the input layer), in floating-point operations. GAT projects every
    source to ``HEADS x width``; SAGE multiplies the destinations' aggregation and own rows
    (aggregate first) or every source (project first, where the layer narrows)."""
    d_in = FEAT_DIM if layer == 0 else HIDDEN * (HEADS if model == "gat" else 1)
    d_out = CLASSES if layer == layers - 1 else HIDDEN
    products = 2 if layer == 0 else 3
    if model == "gat":
        return products * 2.0 * n_src * d_in * d_out * HEADS
    rows = n_dst if d_out >= d_in else n_src
    return products * 2.0 * (rows + n_dst) * d_in * d_out


def dense_bytes(model: str, layer: int, layers: int, n_src: int, n_dst: int) -> float:
    """Bytes of the layer's element-wise and reduction passes over its wide tensors, forward
    and backward (an estimate: each pass reads or writes the whole tensor once).

    GAT, over ``z`` [n_src, H, D]: the projection's write, the ReLU's read and write, the
    scores kernel's read; the source kernel's ``grad_z`` write, ``a_l``'s gradient as a
    product (read, write) and its sum (read), the ReLU's backward (two reads, a write), the
    bias gradient's sum (read): :data:`GAT_Z_PASSES` (three fewer without the ReLU, in the
    last layer); ``a_r``'s gradient, three passes over the destinations' rows; the output's
    dropout, :data:`DROPOUT_PASSES` over [n_dst, H * D] (not in the last layer). SAGE, over
    its output [n_dst, width]: :data:`SAGE_OUT_PASSES` (the aggregation's write, the
    products', the ReLU and dropout and their backward, the bias gradient)."""
    last = layer == layers - 1
    dim = CLASSES if last else HIDDEN
    if model == "gat":
        z = n_src * HEADS * dim * VALUE_BYTES
        dst = n_dst * HEADS * dim * VALUE_BYTES
        passes = GAT_Z_PASSES - (3 if last else 0)
        return passes * z + 3 * dst + (0 if last else DROPOUT_PASSES * dst)
    return SAGE_OUT_PASSES * n_dst * dim * VALUE_BYTES


def tile_max(deg: np.ndarray, order: np.ndarray | None, rows: int) -> np.ndarray:
    """int64[programs]: the largest degree of each program's ``rows`` rows, rows taken in
    ``order`` (None: 0, 1, ...)."""
    d = deg if order is None else deg[order]
    pad = (-d.size) % rows
    return np.concatenate([d, np.zeros(pad, d.dtype)]).reshape(-1, rows).max(axis=1)


def makespan(lengths: np.ndarray, slots: int) -> int:
    """Finish time of programs of ``lengths`` steps started in order on ``slots`` slots (each
    starts on the first slot free)."""
    if lengths.size <= slots:
        return int(lengths.max(initial=0))
    free = [int(x) for x in lengths[:slots]]
    heapq.heapify(free)
    for length in lengths[slots:].tolist():
        heapq.heapreplace(free, free[0] + length)
    return max(free)


def count(
    kernel: Kernel,
    deg: np.ndarray,
    order: np.ndarray | None,
    grid_1d: bool,
    slots: int,
    own_edges: int,
) -> dict[str, Any]:
    """The counts of the module docstring for one launch over rows of degrees ``deg``
    (``own_edges``: the destinations' self loops, which move bytes but add no loop step in
    the model), and its bytes moved."""
    tiles = tile_max(deg, order, kernel.rows)
    edges = int(deg.sum())
    issued = int(tiles.sum()) * kernel.rows
    steps = kernel.passes * tiles + PROGRAM_OVERHEAD
    # Launch order: row tile fastest, then the copies (head, feature block); with a
    # one-dimensional grid the copies of a tile are adjacent instead.
    launch = np.repeat(steps, kernel.copies) if grid_1d else np.tile(steps, kernel.copies)
    work = kernel.passes * edges / kernel.rows + PROGRAM_OVERHEAD * tiles.size
    # No launch ends before one program of the mean length, however few its programs.
    ideal = max(work * kernel.copies / slots, work / max(tiles.size, 1))
    span = makespan(launch, slots)
    return {
        "programs": int(tiles.size) * kernel.copies,
        "edges": edges,
        "bytes": kernel.edge_bytes * kernel.heads * (edges + own_edges),
        "row_bytes": kernel.row_bytes * kernel.heads * (edges + own_edges),
        "lane_iterations": issued,
        "ratio": round(issued / max(edges, 1), 3),
        "max_degree": int(deg.max(initial=0)),
        "longest": int(tiles.max(initial=0)),
        "mean": round(float(tiles.mean()) if tiles.size else 0.0, 3),
        "makespan_steps": span,
        "ideal_steps": round(ideal, 1),
        "slowdown": round(span / max(ideal, 1e-9), 3),
    }


def sorted_order(deg: np.ndarray) -> np.ndarray:
    """Rows by descending degree (ties in row order): the order a degree-sorted launch would
    take (each tile's rows of similar degrees, the longest tiles first). Not what the
    kernels do; counted as the estimate of that change."""
    return np.argsort(-deg, kind="stable")


def measure_block(block: Any, layer: int, layers: int, slots: int) -> dict[str, Any]:
    """Every kernel's counts over one block: in the kernels' order (``natural``) and, over
    the transposed CSR, in :func:`sorted_order` with a one-dimensional grid (``sorted``)."""
    indptr = block.indptr.numpy()
    indices = block.indices.numpy()
    deg = {"dst": np.diff(indptr), "src": np.bincount(indices, minlength=block.n_src)}
    out: dict[str, Any] = {"n_dst": block.n_dst, "n_src": block.n_src, "edges": indices.size}
    for model, kernels in (("gat", gat_kernels), ("sage", sage_kernels)):
        sizes = (layer, layers, block.n_src, block.n_dst)
        out[f"{model}_gemm_flops"] = gemm_flops(model, *sizes)
        out[f"{model}_dense_bytes"] = dense_bytes(model, *sizes)
        for k in kernels(layer, layers):
            own = block.n_dst if k.self_edges else 0
            entry = {"natural": count(k, deg[k.csr], None, False, slots, own)}
            if k.csr == "src":
                order = sorted_order(deg[k.csr])
                entry["sorted"] = count(k, deg[k.csr], order, True, slots, own)
            out[k.name] = entry
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=float, default=2.4e6)
    p.add_argument("--avg-degree", type=float, default=26.0)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--slots", type=int, default=DEFAULT_SLOTS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("results/gat_balance.json"))
    return p.parse_args(argv)


def summarise(batches: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per layer and kernel: the batches' mean of every count (per order)."""
    summary: dict[str, Any] = {}
    for layer in range(len(batches[0])):
        per_layer: dict[str, Any] = {}
        for name, entry in batches[0][layer].items():
            if not isinstance(entry, dict):
                per_layer[name] = float(np.mean([b[layer][name] for b in batches]))
                continue
            per_layer[name] = {
                order: {
                    key: round(float(np.mean([b[layer][name][order][key] for b in batches])), 3)
                    for key in entry[order]
                }
                for order in entry
            }
        summary[f"layer{layer}"] = per_layer
    return summary


def estimate(mean: dict[str, Any]) -> dict[str, Any]:
    """Per model, seconds per epoch (:data:`ITERATIONS` of the mean batch) at the assumed
    rates: the edge kernels' bytes at :data:`GATHER_BYTES_PER_S`, times their modelled
    slowdown from imbalance (``natural``) or without it (``balanced``), or in the
    ``sorted`` order where counted (and the lower bound: one feature row per edge, head
    and kernel, balanced); the matrix products at :data:`GEMM_FLOP_PER_S`; the element-wise
    passes (:func:`dense_bytes`) at :data:`DENSE_BYTES_PER_S`. Not counted: the loss, the
    optimizer, launch gaps."""
    out: dict[str, Any] = {}
    for model in ("gat", "sage"):
        edge = {"balanced": 0.0, "natural": 0.0, "sorted": 0.0}
        per_kernel: dict[str, float] = {}
        gemm = moved = rows = dense = 0.0
        for layer in mean.values():
            gemm += layer[f"{model}_gemm_flops"]
            dense += layer[f"{model}_dense_bytes"]
            for name, orders in layer.items():
                if not name.startswith(model + "_") or not isinstance(orders, dict):
                    continue
                moved += orders["natural"]["bytes"]
                rows += orders["natural"]["row_bytes"]
                seconds = orders["natural"]["bytes"] / GATHER_BYTES_PER_S
                edge["balanced"] += seconds
                edge["natural"] += seconds * orders["natural"]["slowdown"]
                edge["sorted"] += seconds * orders.get("sorted", orders["natural"])["slowdown"]
                per_kernel[name] = per_kernel.get(name, 0.0) + seconds * ITERATIONS
        out[model] = {
            "edge_kernels_gb_per_iteration": round(moved / 1e9, 2),
            "edge_kernels_row_gb_per_iteration": round(rows / 1e9, 2),
            "edge_kernels_rows_only_balanced_s": round(rows / GATHER_BYTES_PER_S * ITERATIONS, 2),
            "edge_kernels_s": {k: round(v * ITERATIONS, 2) for k, v in edge.items()},
            "edge_kernels_balanced_s_by_kernel": {k: round(v, 2) for k, v in per_kernel.items()},
            "gemm_tflop_per_iteration": round(gemm / 1e12, 3),
            "gemm_s": round(gemm / GEMM_FLOP_PER_S * ITERATIONS, 2),
            "dense_gb_per_iteration": round(dense / 1e9, 2),
            "dense_s": round(dense / DENSE_BYTES_PER_S * ITERATIONS, 2),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _C.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    # The edges do not depend on feat_dim (their own random streams): 4 columns save memory.
    spec = products_spec(args.nodes, args.avg_degree, 4, CLASSES, 0.08, args.seed)
    t0 = time.perf_counter()
    graph = generate(SyntheticConfig.from_spec(spec))
    n = graph.num_nodes
    print(f"graph: {n} vertices, {graph.indices.size} in-edges "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
    sampler = NeighborSampler(graph.indptr, graph.indices, n, n, FANOUT, args.seed)
    rng = np.random.default_rng(args.seed)
    train = np.asarray(graph.train_idx)
    batches = []
    for it in range(args.batches):
        seeds = np.sort(rng.choice(train, BATCH_SIZE, replace=False))
        blocks = sampler.sample(seeds, 0, it)
        batches.append(
            [measure_block(b, layer, len(blocks), args.slots) for layer, b in enumerate(blocks)]
        )
        print(f"batch {it}: {[(b.n_dst, b.n_src, b.num_edges) for b in blocks]}", flush=True)
    result = {
        "benchmark": "gat_balance",
        "figures": (
            "counts of the sampled batches (any machine gives the same); epoch_estimate: "
            "those counts at assumed H100 rates (its 'rates'), an estimate, not a measurement"
        ),
        "command": command_line(argv),
        "graph": {"spec": spec, "vertices": n, "in_edges": int(graph.indices.size)},
        "sizes": {
            "fanout": FANOUT,
            "batch_size": BATCH_SIZE,
            "hidden": HIDDEN,
            "heads": HEADS,
            "feat_dim": FEAT_DIM,
            "classes": CLASSES,
            "rows": ROWS,
        },
        "model": {"slots": args.slots, "program_overhead_steps": PROGRAM_OVERHEAD},
        "batches": batches,
        "mean": summarise(batches),
    }
    result["epoch_estimate"] = {
        "rates": {"gather_bytes_per_s": GATHER_BYTES_PER_S, "gemm_flop_per_s": GEMM_FLOP_PER_S,
                  "dense_bytes_per_s": DENSE_BYTES_PER_S, "iterations": ITERATIONS},
        **estimate(result["mean"]),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for layer, kernels in result["mean"].items():
        for name, orders in kernels.items():
            if not isinstance(orders, dict):
                continue
            for order, c in orders.items():
                print(f"{layer} {name:18s} {order:8s} edges {c['edges']:9.0f} "
                      f"ratio {c['ratio']:6.2f} max_deg {c['max_degree']:6.0f} "
                      f"longest {c['longest']:6.0f} mean {c['mean']:6.2f} "
                      f"slowdown {c['slowdown']:6.2f}")  # fmt: skip
    print(json.dumps(result["epoch_estimate"], indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
