"""Fused kernel benchmarks: fused C++ kernels vs PyTorch eager vs ``torch.compile``.

Sections (``--section``; ``all`` runs every registered one):

- ``update``: the GraphSAGE UPDATE ``Dropout(ReLU(h_neigh W_n^T + h_self W_s^T + b))``
  forward + backward at N in {5k, 50k, 400k} rows and C -> K in {100 -> 256, 256 -> 256,
  256 -> 47}: :func:`distmb.nn.kernels.cpu_update.sage_update` (custom blocked GEMM with the fused
  epilogue, the default) vs the eager PyTorch function the "torch" path of SAGEConv runs (two
  ``F.linear``, bias, ReLU, ``F.dropout``) vs ``torch.compile`` of that same function vs the
  design alternative "torch GEMM + fused C++ epilogue" (:func:`update_hybrid`); and the two
  ways to train it in bfloat16 (``--precision bf16`` on the CPU): the fused kernels under
  :func:`~distmb.nn.kernels.cpu_update.bf16_products` (products on bfloat16 operands summed
  in float32, float32 outputs; ``fused_bf16``) and the eager function under CPU bfloat16
  autocast (``torch_bf16``), each also as a speed-up over the float32 fused kernels.

- ``agg``: the fused AGG kernels (mean aggregation at fan-outs 5/10/15 and widths 100/256 on
  40k-destination blocks; GAT edge softmax + per-head weighted aggregation): kernel-level
  GB/s against the copy bandwidth measured in the same run, and end-to-end fused vs "torch"
  forward and forward + backward (see the section's comment for the bytes counted).

Implementations are timed round-robin within each repetition (so that load from other
processes hits them alike) and reported as medians; speed-ups are ratios of medians from the
same run. Results are merged into ``results/kernels.json`` (other sections' entries are kept)
and all sections are plotted into ``results/kernels.png``.

    python benchmarks/kernels.py --section update
    python benchmarks/kernels.py --section update --sizes 5000,50000 --reps 3 --no-compile
    python benchmarks/kernels.py --section update --no-bf16     # float32 implementations only
    python benchmarks/kernels.py --section agg --agg-threads 2 --reps 5
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from distmb import _C
from distmb.cli.report import save_figure, write_json
from distmb.core.machine import cpu_model
from distmb.core.plotting import reference_line
from distmb.nn.kernels import cpu_aggregate as fused_aggregate
from distmb.nn.kernels import cpu_update as fused_update
from distmb.nn.kernels.dispatch import get_kernels, set_kernels
from distmb.pipeline.sample import Block

RESULTS = Path(__file__).resolve().parents[1] / "results"
JSON_NAME, PNG_NAME = "kernels.json", "kernels.png"

# --------------------------------------------------------------------------- section "update"

#: Rows N of the UPDATE benchmark.
UPDATE_SIZES = (5_000, 50_000, 400_000)
#: (C, K): input and output width.
UPDATE_WIDTHS = ((100, 256), (256, 256), (256, 47))
#: Dropout probability of the benchmarked UPDATE (the models' default).
UPDATE_DROPOUT = 0.5
#: Repetitions per configuration (fewer from UPDATE_LARGE_N rows, where one takes seconds).
UPDATE_REPS, UPDATE_REPS_LARGE, UPDATE_LARGE_N = 7, 5, 200_000
#: Target: fused >= this speed-up over eager from UPDATE_TARGET_MIN_N rows, and not slower
#: than torch.compile.
UPDATE_TARGET_SPEEDUP, UPDATE_TARGET_MIN_N = 1.4, 50_000
#: The bfloat16 implementations (speed-ups also over "fused", the float32 kernels).
UPDATE_BF16 = ("fused_bf16", "torch_bf16")

UpdateFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, float], Tensor]


def update_eager(
    h_neigh: Tensor, h_self: Tensor, w_neigh: Tensor, w_self: Tensor, bias: Tensor, p: float
) -> Tensor:
    """The "torch" path of SAGEConv's UPDATE: float32[N, C] x2 -> float32[N, K]."""
    h = F.linear(h_neigh, w_neigh) + F.linear(h_self, w_self) + bias
    return F.dropout(torch.relu(h), p, training=True)


def update_fused(
    h_neigh: Tensor, h_self: Tensor, w_neigh: Tensor, w_self: Tensor, bias: Tensor, p: float
) -> Tensor:
    """The same UPDATE through :func:`distmb.nn.kernels.cpu_update.sage_update`."""
    return fused_update.sage_update([(h_neigh, w_neigh), (h_self, w_self)], bias, p=p)


def update_hybrid(
    h_neigh: Tensor, h_self: Tensor, w_neigh: Tensor, w_self: Tensor, bias: Tensor, p: float
) -> Tensor:
    """The design alternative: PyTorch's GEMMs (MKL) for both products, then the fused C++
    epilogue (bias + ReLU + dropout + gate bits; backward: gate + bias gradient in one pass)
    through the ``addend`` input of :func:`~distmb.nn.kernels.cpu_update.sage_update`."""
    pre = torch.addmm(F.linear(h_neigh, w_neigh), h_self, w_self.T)
    return fused_update.sage_update([], bias, addend=pre, p=p)


def update_fused_bf16(
    h_neigh: Tensor, h_self: Tensor, w_neigh: Tensor, w_self: Tensor, bias: Tensor, p: float
) -> Tensor:
    """:func:`update_fused` with its products on bfloat16 operands summed in float32
    (forward and backward: the autograd node keeps its forward's setting); float32 output."""
    with fused_update.bf16_products():
        return update_fused(h_neigh, h_self, w_neigh, w_self, bias, p)


def update_eager_bf16(
    h_neigh: Tensor, h_self: Tensor, w_neigh: Tensor, w_self: Tensor, bias: Tensor, p: float
) -> Tensor:
    """:func:`update_eager` under CPU bfloat16 autocast (``--precision bf16 --kernels torch``):
    the products take bfloat16 operands and give bfloat16 outputs, summed in bfloat16; the
    float32 bias promotes the sum, so the epilogue (bias, ReLU, dropout) and the output are
    float32, as in SAGEConv's "torch" path."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return update_eager(h_neigh, h_self, w_neigh, w_self, bias, p)


def _update_inputs(n: int, c: int, k: int, seed: int) -> tuple[list[Tensor], Tensor]:
    """([h_neigh, h_self, w_neigh, w_self, bias] requiring grad, grad_out float32[N, K])."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randn(n, c, generator=gen),
        torch.randn(n, c, generator=gen),
        torch.randn(k, c, generator=gen) * c**-0.5,
        torch.randn(k, c, generator=gen) * c**-0.5,
        torch.randn(k, generator=gen) * 0.1,
    ]
    return [t.requires_grad_(True) for t in tensors], torch.randn(n, k, generator=gen)


def _fwd_bwd_seconds(
    fn: UpdateFn, inputs: list[Tensor], grad: Tensor, p: float
) -> tuple[float, float]:
    """(forward, backward) wall seconds of one training step of ``fn``."""
    for t in inputs:
        t.grad = None
    t0 = time.perf_counter()
    out = fn(*inputs, p)
    t1 = time.perf_counter()
    out.backward(grad)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def _check_update(fns: dict[str, UpdateFn]) -> None:
    """Sanity check before timing: without dropout every float32 implementation agrees with
    eager; the bfloat16 ones agree with eager on the operands of the products rounded to
    bfloat16 (``fused_bf16`` to float32's tolerance: it sums in float32; ``torch_bf16`` to
    bfloat16's, its products' outputs being bfloat16, and not to float32's: autocast reached
    it)."""
    inputs, _ = _update_inputs(257, 37, 45, seed=0)
    want = update_eager(*inputs, 0.0)
    h_neigh, h_self, w_neigh, w_self, bias = (t.detach() for t in inputs)
    rounded = [t.bfloat16().float() for t in (h_neigh, h_self, w_neigh, w_self)]
    want_bf16 = update_eager(*rounded, bias, 0.0)
    for name, fn in fns.items():
        got = fn(*inputs, 0.0)
        if name == "torch_bf16":
            torch.testing.assert_close(got, want_bf16, rtol=2e-2, atol=2e-2, msg=name)
            assert not torch.allclose(got, want, rtol=1e-4, atol=1e-4), f"{name}: float32?"
        elif name == "fused_bf16":
            torch.testing.assert_close(got, want_bf16, rtol=1e-4, atol=1e-4, msg=name)
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=name)


def _compile_update() -> tuple[UpdateFn | None, str | None]:
    """A fresh ``torch.compile`` of :func:`update_eager`, or (None, why it failed)."""
    try:
        torch._dynamo.reset()
        compiled = torch.compile(update_eager, dynamic=False)
        inputs, grad = _update_inputs(64, 8, 8, seed=1)
        compiled(*inputs, UPDATE_DROPOUT).backward(grad)
        return compiled, None
    except Exception as exc:  # noqa: BLE001 - record any compiler failure in the results
        return None, f"{type(exc).__name__}: {exc}"[:500]


def run_update(args: argparse.Namespace) -> dict[str, Any]:
    """Time every (N, C, K) configuration; returns the section's JSON entry."""
    sizes = args.sizes or UPDATE_SIZES
    fns: dict[str, UpdateFn] = {
        "eager": update_eager,
        "fused": update_fused,
        "torch_gemm_fused_epilogue": update_hybrid,
    }
    if not args.no_bf16:
        fns.update(fused_bf16=update_fused_bf16, torch_bf16=update_eager_bf16)
    compile_error = None
    if not args.no_compile:
        compiled, compile_error = _compile_update()
        if compiled is not None:
            fns["compile"] = compiled
        else:
            print(f"torch.compile unavailable: {compile_error}")
    _check_update(fns)
    rows = []
    for n in sizes:
        for c, k in UPDATE_WIDTHS:
            rows.append(_time_update_config(n, c, k, fns, args))
    targets = _update_targets(rows)
    return {
        "description": "SAGE UPDATE Dropout(ReLU(h_n W_n^T + h_s W_s^T + b)) fwd + bwd, "
        f"dropout {UPDATE_DROPOUT}, float32 tensors; fused_bf16: the fused kernels' products "
        "on bfloat16 operands summed in float32 (bf16_products), torch_bf16: eager under CPU "
        "bfloat16 autocast; medians (ms), speed-ups vs eager and vs fused (float32)",
        "dropout": UPDATE_DROPOUT,
        "compile_error": compile_error,
        "bf16_native": fused_update.bf16_native(),
        "rows": rows,
        "targets": targets,
        "bf16_speedup_vs_fused": _bf16_speedups(rows),
    }


def _time_update_config(
    n: int, c: int, k: int, fns: dict[str, UpdateFn], args: argparse.Namespace
) -> dict[str, Any]:
    reps = args.reps or (UPDATE_REPS_LARGE if n >= UPDATE_LARGE_N else UPDATE_REPS)
    inputs, grad = _update_inputs(n, c, k, seed=n + c + k)
    compile_s = None
    if "compile" in fns:  # specialise for this shape; the first call compiles
        torch._dynamo.reset()
        fns = {**fns, "compile": torch.compile(update_eager, dynamic=False)}
        t0 = time.perf_counter()
        _fwd_bwd_seconds(fns["compile"], inputs, grad, UPDATE_DROPOUT)
        compile_s = time.perf_counter() - t0
    for fn in fns.values():  # warm-up
        _fwd_bwd_seconds(fn, inputs, grad, UPDATE_DROPOUT)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name].append(_fwd_bwd_seconds(fn, inputs, grad, UPDATE_DROPOUT))
    row: dict[str, Any] = {"n": n, "c": c, "k": k, "reps": reps, "compile_s": compile_s}
    for name, times in samples.items():
        row[name] = {
            "fwd_ms": 1e3 * statistics.median(f for f, _ in times),
            "bwd_ms": 1e3 * statistics.median(b for _, b in times),
            "total_ms": 1e3 * statistics.median(f + b for f, b in times),
        }
    base, fused = row["eager"]["total_ms"], row["fused"]["total_ms"]
    for name in samples:
        row[name]["speedup_vs_eager"] = base / row[name]["total_ms"]
        row[name]["speedup_vs_fused"] = fused / row[name]["total_ms"]
    flop = 2 * 2 * 3 * n * c * k  # 2 products, forward + 2 backward, 2 flop per FMA
    for name in ("fused", "fused_bf16"):
        if name in row:
            row[name]["gflops"] = flop / row[name]["total_ms"] / 1e6
    print(
        f"N={n:>7} {c:>3}->{k:<3} "
        + "  ".join(
            f"{name} {row[name]['total_ms']:8.1f} ms (x{row[name]['speedup_vs_eager']:.2f})"
            for name in samples
        )
    )
    del inputs, grad
    return row


def _bf16_speedups(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per bfloat16 implementation timed: the smallest, median and largest speed-up over the
    float32 fused kernels (fwd + bwd) across the configurations."""
    out = {}
    for name in UPDATE_BF16:
        speedups = [r[name]["speedup_vs_fused"] for r in rows if name in r]
        if speedups:
            out[name] = {
                "min": min(speedups),
                "median": statistics.median(speedups),
                "max": max(speedups),
            }
    return out


def _update_targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    large = [r for r in rows if r["n"] >= UPDATE_TARGET_MIN_N]
    min_speedup = min((r["fused"]["speedup_vs_eager"] for r in large), default=None)
    vs_compile = [r["compile"]["total_ms"] / r["fused"]["total_ms"] for r in rows if "compile" in r]
    return {
        "speedup_vs_eager_target": UPDATE_TARGET_SPEEDUP,
        "min_n": UPDATE_TARGET_MIN_N,
        "min_fused_speedup_at_min_n": min_speedup,
        "speedup_met": min_speedup is not None and min_speedup >= UPDATE_TARGET_SPEEDUP,
        "min_fused_vs_compile": min(vs_compile, default=None),
        "not_slower_than_compile": bool(vs_compile) and min(vs_compile) >= 1.0,
    }


def plot_update(ax: Any, section: dict[str, Any]) -> None:
    """Grouped bars: speed-up over eager of every implementation per configuration; the
    bfloat16 ones labelled with their speed-up over the float32 fused kernels."""
    rows = section["rows"]
    names = [
        name
        for name in ("fused", "torch_gemm_fused_epilogue", "compile", *UPDATE_BF16)
        if any(name in r for r in rows)
    ]
    labels = [f"{r['n'] // 1000}k\n{r['c']}->{r['k']}" for r in rows]
    width = 0.8 / max(1, len(names))
    top = 0.0
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(rows))]
        ys = [r[name]["speedup_vs_eager"] if name in r else 0.0 for r in rows]
        bars = ax.bar(xs, ys, width, label=name)
        top = max(top, *ys)
        if name in UPDATE_BF16:
            vs_fused = [f"x{r[name]['speedup_vs_fused']:.2f}" if name in r else "" for r in rows]
            ax.bar_label(bars, vs_fused, fontsize=6, rotation=90, padding=2)
    ax.set_ylim(0, 1.15 * max(top, UPDATE_TARGET_SPEEDUP))  # room for the labels
    reference_line(ax, 1.0, "1x (as fast as eager)", color="black", linestyle="-")
    reference_line(ax, UPDATE_TARGET_SPEEDUP, f"target {UPDATE_TARGET_SPEEDUP:g}x", color="red")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("speed-up vs eager (fwd + bwd)")
    title = f"SAGE UPDATE fwd+bwd, dropout {section['dropout']} (median, same run)"
    if any(name in names for name in UPDATE_BF16):
        native = "AVX512-BF16" if section.get("bf16_native") else "portable C++"
        title += f"; bf16 bars labelled x fused float32 (fused_bf16: {native})"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)


# --------------------------------------------------------------------------- section "agg"
#
# The fused AGG kernels (csrc/kernels/aggregate.cpp, aggregate_gat.cpp) on synthetic blocks of
# realistic size: n_dst destinations, fan-outs 5/10/15, n_src = min(fanout * n_dst, cap) sources,
# every source used at least once and the remaining edges drawn from a power law over the sources,
# 20 % of the destinations with fewer edges than the fan-out; widths 100 and 256. Mean aggregation
# is timed
#
# - at kernel level (distmb._C into preallocated outputs, transposed CSR prebuilt), as achieved
#   bandwidth against the copy bandwidth measured in the same run (an OpenMP copy kernel and
#   np.copyto of 1 GiB, read + write bytes). Bytes counted: the forward reads one source row
#   per edge (gathered, whether or not it hits a cache), the indices and row pointers and
#   writes the output rows; the backward reads one output-gradient row per edge, the
#   transposed CSR and the per-destination factor per edge and writes every source's row
#   ("compulsory" variants count every distinct row once: repeated rows may hit the caches);
# - end to end through distmb.nn.aggregate.aggregate (allocation, autograd and the transposed
#   CSR rebuilt every step, as for a freshly sampled block), fused vs "torch".
#
# GAT attention (logits -> edge softmax -> per-head weighted aggregation, forward + backward) is
# timed end to end fused vs "torch", both as GATConv composes it (PyTorch logits, edge_softmax,
# weighted_aggregate) and with the fused logits + softmax of attention_softmax, plus the
# weighted-aggregation kernels' bandwidth. Variants are timed round-robin per repetition.

#: Fan-outs and widths of the AGG configurations.
AGG_FANOUTS, AGG_WIDTHS = (5, 10, 15), (100, 256)
#: Destinations per block and cap on its sources.
AGG_N_DST, AGG_SRC_CAP = 40_000, 400_000
#: Exponent a of the power law p(source rank r) ~ (r + 1)^-a of the repeated sources.
AGG_POWER_LAW = 0.8
#: Fraction of destinations with fewer edges than the fan-out.
AGG_PARTIAL_ROWS = 0.2
#: Repetitions (after one warm-up) when --reps is not given.
AGG_REPS = 7
#: Bytes of each array of the copy-bandwidth measurement.
AGG_COPY_BYTES = 1 << 30
#: Target: kernel-level fwd + bwd bandwidth at this fraction of the measured copy bandwidth.
AGG_TARGET_COPY_FRACTION = 0.6
#: The aggregator timed (its backward also reads the per-destination factors).
AGG_KIND = "mean"
#: GAT attention: heads, width per head, fan-out, LeakyReLU slope.
GAT_HEADS, GAT_DIM, GAT_FANOUT, GAT_SLOPE = 4, 64, 10, 0.2
_F32, _I64, _GB = 4, 8, 1e9

# distmb.nn re-exports the function ``aggregate``, which shadows the module attribute.
_agg = importlib.import_module("distmb.nn.aggregate")


def _agg_round_robin(
    variants: dict[str, Callable[[], object]], reps: int
) -> dict[str, dict[str, float]]:
    """One warm-up, then ``reps`` repetitions each running every variant once (order
    alternating); median / p10 / p90 / min milliseconds per variant. On a shared machine the
    multi-threaded medians include waits for descheduled OpenMP threads; the minima are
    closer to the uncontended cost."""
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(1 + reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            variants[name]()
            if rep > 0:
                times[name].append(1e3 * (time.perf_counter() - t0))
    return {
        n: {
            "median_ms": round(float(np.median(t)), 3),
            "p10_ms": round(float(np.percentile(t, 10)), 3),
            "p90_ms": round(float(np.percentile(t, 90)), 3),
            "min_ms": round(float(np.min(t)), 3),
        }
        for n, t in times.items()
    }


def _agg_gbps(n_bytes: float, ms: float) -> float:
    return round(n_bytes / (ms * 1e-3) / _GB, 2)


def _agg_block(n_dst: int, fanout: int, src_cap: int, seed: int) -> Block:
    """A synthetic sampled block (see the section comment)."""
    rng = np.random.default_rng(seed)
    n_src = max(n_dst, min(fanout * n_dst, src_cap))
    deg = np.full(n_dst, fanout, np.int64)
    partial = rng.random(n_dst) < AGG_PARTIAL_ROWS
    deg[partial] = rng.integers(1, fanout + 1, int(partial.sum()))
    n_edges = int(deg.sum())
    popularity = (np.arange(n_src) + 1.0) ** -AGG_POWER_LAW
    covering = rng.permutation(n_src)[: min(n_src, n_edges)]
    repeats = rng.choice(n_src, n_edges - covering.size, p=popularity / popularity.sum())
    indices = np.concatenate([covering, repeats])
    rng.shuffle(indices)
    indptr = np.zeros(n_dst + 1, np.int64)
    np.cumsum(deg, out=indptr[1:])
    return Block(
        n_dst,
        n_src,
        0,
        torch.from_numpy(indptr),
        torch.from_numpy(indices.astype(np.int64)),
        torch.arange(n_src, dtype=torch.int64),
    )


def _agg_fresh(block: Block) -> Block:
    """The same block as a new object: no cached transposed CSR, like a freshly sampled one."""
    return Block(block.n_dst, block.n_src, block.n_halo, block.indptr, block.indices, block.src_ids)


def _agg_copy_bandwidth(reps: int) -> dict[str, Any]:
    """STREAM-like copy of AGG_COPY_BYTES, GB/s counting read + write bytes."""
    n = AGG_COPY_BYTES // _F32
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)  # touched: no page faults are timed
    stats = _agg_round_robin(
        {"omp_copy": lambda: _C.stream_copy(src, dst), "np_copyto": lambda: np.copyto(dst, src)},
        reps,
    )
    return {
        "array_bytes": AGG_COPY_BYTES,
        **{f"{k}_gbps": _agg_gbps(2 * AGG_COPY_BYTES, v["median_ms"]) for k, v in stats.items()},
        **{f"{k}_gbps_best": _agg_gbps(2 * AGG_COPY_BYTES, v["min_ms"]) for k, v in stats.items()},
        "timings": stats,
    }


def _agg_traffic(block: Block, width: int) -> tuple[int, int]:
    """Bytes the mean-aggregation forward and backward kernels move."""
    e, n_dst, n_src, row = block.num_edges, block.n_dst, block.n_src, width * _F32
    fwd = e * row + n_dst * row + e * _I64 + (n_dst + 1) * _I64
    bwd = e * row + n_src * row + e * (_I64 + _F32) + (n_src + n_dst + 2) * _I64
    return fwd, bwd


def _agg_compulsory(block: Block, width: int) -> tuple[int, int]:
    """Bytes the forward and backward move if every distinct row is read from memory once
    (repeated rows hit the caches): a lower bound of the DRAM traffic."""
    row = width * _F32
    used_src = int(torch.unique(block.indices).numel())
    used_dst = int((block.indptr[1:] > block.indptr[:-1]).sum())
    fwd_b, bwd_b = _agg_traffic(block, width)
    e = block.num_edges
    return fwd_b - (e - used_src) * row, bwd_b - (e - used_dst) * row


def _agg_config(block: Block, width: int, reps: int) -> dict[str, Any]:
    """Kernel-level bandwidth and end-to-end fused vs torch times of one block and width."""
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(block.n_src, width, generator=gen)
    xg = x.clone().requires_grad_(True)
    g = torch.randn(block.n_dst, width, generator=gen)
    out, grad_x = torch.empty(block.n_dst, width), torch.empty(block.n_src, width)
    indptr, indices = block.indptr.numpy(), block.indices.numpy()
    t = fused_aggregate.block_transpose(block)
    kernel = _agg_round_robin(
        {
            "forward": lambda: _C.aggregate_forward(
                indptr, indices, block.n_src, x.numpy(), width, AGG_KIND, out.numpy()
            ),
            "backward": lambda: _C.aggregate_backward(
                indptr,
                t.indptr.numpy(),
                t.dst.numpy(),
                g.numpy(),
                width,
                AGG_KIND,
                grad_x.numpy(),
            ),
            "transpose": lambda: _C.block_transpose(indptr, indices, block.n_src),
        },
        reps,
    )

    def forward(kernels: str) -> Callable[[], None]:
        def run() -> None:
            set_kernels(kernels)
            with torch.no_grad():
                _agg.aggregate(block, x, AGG_KIND)

        return run

    def step(kernels: str) -> Callable[[], None]:
        def run() -> None:
            set_kernels(kernels)
            xg.grad = None
            _agg.aggregate(_agg_fresh(block), xg, AGG_KIND).backward(g)

        return run

    e2e = _agg_round_robin(
        {
            "fused_fwd": forward("fused"),
            "torch_fwd": forward("torch"),
            "fused_fwd_bwd": step("fused"),
            "torch_fwd_bwd": step("torch"),
        },
        reps,
    )
    fwd_b, bwd_b = _agg_traffic(block, width)
    fwd_c, bwd_c = _agg_compulsory(block, width)
    fwd_ms, bwd_ms = kernel["forward"]["median_ms"], kernel["backward"]["median_ms"]
    return {
        "width": width,
        "n_dst": block.n_dst,
        "n_src": block.n_src,
        "edges": block.num_edges,
        "forward_bytes": fwd_b,
        "backward_bytes": bwd_b,
        "kernel": kernel,
        "kernel_forward_gbps": _agg_gbps(fwd_b, fwd_ms),
        "kernel_backward_gbps": _agg_gbps(bwd_b, bwd_ms),
        "kernel_fwd_bwd_gbps": _agg_gbps(fwd_b + bwd_b, fwd_ms + bwd_ms),
        "compulsory_forward_bytes": fwd_c,
        "compulsory_backward_bytes": bwd_c,
        "kernel_fwd_bwd_compulsory_gbps": _agg_gbps(fwd_c + bwd_c, fwd_ms + bwd_ms),
        "kernel_fwd_bwd_gbps_best": _agg_gbps(
            fwd_b + bwd_b, kernel["forward"]["min_ms"] + kernel["backward"]["min_ms"]
        ),
        "end_to_end": e2e,
        "speedup_fwd": round(e2e["torch_fwd"]["median_ms"] / e2e["fused_fwd"]["median_ms"], 2),
        "speedup_fwd_bwd": round(
            e2e["torch_fwd_bwd"]["median_ms"] / e2e["fused_fwd_bwd"]["median_ms"], 2
        ),
    }


def _agg_gat(block: Block, reps: int) -> dict[str, Any]:
    """GAT attention fwd + bwd, fused vs torch, and the weighted-aggregation kernels."""
    heads, dim = GAT_HEADS, GAT_DIM
    gen = torch.Generator().manual_seed(dim)
    z = torch.randn(block.n_src, heads, dim, generator=gen).requires_grad_(True)
    el = torch.randn(block.n_src, heads, generator=gen).requires_grad_(True)
    er = torch.randn(block.n_dst, heads, generator=gen).requires_grad_(True)
    g = torch.randn(block.n_dst, heads, dim, generator=gen)
    dst = block.dst_of_edges()

    def attention(kernels: str, fused_logits: bool) -> Callable[[], None]:
        def run() -> None:
            set_kernels(kernels)
            b = _agg_fresh(block)
            for p in (z, el, er):
                p.grad = None
            if fused_logits:
                alpha = _agg.attention_softmax(b, el, er, GAT_SLOPE)
            else:  # as GATConv composes it
                scores = F.leaky_relu(
                    el.index_select(0, b.indices) + er.index_select(0, dst), GAT_SLOPE
                )
                alpha = _agg.edge_softmax(b, scores)
            _agg.weighted_aggregate(b, alpha, z).backward(g)

        return run

    e2e = _agg_round_robin(
        {
            "fused": attention("fused", False),
            "torch": attention("torch", False),
            "fused_attention_softmax": attention("fused", True),
        },
        reps,
    )
    indptr, indices = block.indptr.numpy(), block.indices.numpy()
    t = fused_aggregate.block_transpose(block)
    w = torch.rand(block.num_edges, heads, generator=gen)
    zd = z.detach()
    out, grad_z = torch.empty(block.n_dst, heads, dim), torch.empty(block.n_src, heads, dim)
    grad_w = torch.empty(block.num_edges, heads)
    kernel = _agg_round_robin(
        {
            "weighted_forward": lambda: _C.weighted_aggregate_forward(
                indptr, indices, block.n_src, w.numpy(), zd.numpy(), heads, dim, out.numpy()
            ),
            "weighted_backward": lambda: _C.weighted_aggregate_backward(
                t.indptr.numpy(),
                t.edges.numpy(),
                t.dst.numpy(),
                w.numpy(),
                zd.numpy(),
                g.numpy(),
                block.n_dst,
                heads,
                dim,
                grad_z.numpy(),
                grad_w.numpy(),
            ),
        },
        reps,
    )
    e, row, wb = block.num_edges, heads * dim * _F32, block.num_edges * heads * _F32
    fwd_b = e * row + wb + block.n_dst * row + e * _I64 + (block.n_dst + 1) * _I64
    bwd_b = e * row + 2 * block.n_src * row + 2 * wb + 2 * e * _I64 + (block.n_src + 1) * _I64
    torch_ms = e2e["torch"]["median_ms"]
    return {
        "heads": heads,
        "dim": dim,
        "fanout": GAT_FANOUT,
        "n_dst": block.n_dst,
        "n_src": block.n_src,
        "edges": e,
        "end_to_end": e2e,
        "speedup": round(torch_ms / e2e["fused"]["median_ms"], 2),
        "speedup_attention_softmax": round(
            torch_ms / e2e["fused_attention_softmax"]["median_ms"], 2
        ),
        "kernel": kernel,
        "kernel_weighted_forward_gbps": _agg_gbps(fwd_b, kernel["weighted_forward"]["median_ms"]),
        "kernel_weighted_backward_gbps": _agg_gbps(bwd_b, kernel["weighted_backward"]["median_ms"]),
    }


def run_agg(args: argparse.Namespace) -> dict[str, Any]:
    """Every thread count of --agg-threads: copy bandwidth, AGG configurations, GAT."""
    reps = args.reps or AGG_REPS
    kernels_before = get_kernels()
    threads_before = (_C.get_num_threads(), torch.get_num_threads())
    records = []
    try:
        for threads in args.agg_threads:
            _C.set_num_threads(threads)
            torch.set_num_threads(threads)  # the "torch" path gets the same cores
            copy = _agg_copy_bandwidth(reps)
            print(
                f"[agg] {threads} thread(s): copy {copy['omp_copy_gbps']} GB/s (OpenMP), "
                f"{copy['np_copyto_gbps']} GB/s (np.copyto)",
                flush=True,
            )
            configs = []
            for fanout in AGG_FANOUTS:
                block = _agg_block(args.agg_n_dst, fanout, args.agg_src_cap, seed=fanout)
                for width in AGG_WIDTHS:
                    rec = {"fanout": fanout, **_agg_config(block, width, reps)}
                    rec["kernel_fwd_bwd_copy_fraction"] = round(
                        rec["kernel_fwd_bwd_gbps"] / copy["omp_copy_gbps"], 3
                    )
                    rec["kernel_fwd_bwd_copy_fraction_best"] = round(
                        rec["kernel_fwd_bwd_gbps_best"] / copy["omp_copy_gbps_best"], 3
                    )
                    configs.append(rec)
                    print(
                        f"[agg]   fanout {fanout:2d} width {width}: kernel fwd "
                        f"{rec['kernel_forward_gbps']} bwd {rec['kernel_backward_gbps']} GB/s "
                        f"({rec['kernel_fwd_bwd_copy_fraction']:.0%} of copy; best "
                        f"{rec['kernel_fwd_bwd_copy_fraction_best']:.0%}; distinct rows only "
                        f"{rec['kernel_fwd_bwd_compulsory_gbps']} GB/s), transpose "
                        f"{rec['kernel']['transpose']['median_ms']} ms; fused vs torch: fwd "
                        f"x{rec['speedup_fwd']}, fwd+bwd x{rec['speedup_fwd_bwd']}",
                        flush=True,
                    )
            block = _agg_block(args.agg_n_dst, GAT_FANOUT, args.agg_src_cap, seed=GAT_FANOUT)
            gat = _agg_gat(block, reps)
            print(
                f"[agg]   GAT H={GAT_HEADS} D={GAT_DIM}: fwd+bwd fused vs torch x{gat['speedup']}"
                f" (x{gat['speedup_attention_softmax']} with attention_softmax); weighted "
                f"kernel fwd {gat['kernel_weighted_forward_gbps']} bwd "
                f"{gat['kernel_weighted_backward_gbps']} GB/s",
                flush=True,
            )
            records.append({"threads": threads, "copy": copy, "configs": configs, "gat": gat})
    finally:
        set_kernels(kernels_before)
        _C.set_num_threads(threads_before[0])
        torch.set_num_threads(threads_before[1])
    return {
        "description": f"AGG ({AGG_KIND}) and GAT attention, fused C++ vs torch; kernel-level "
        "GB/s vs the copy bandwidth of the same run; medians (ms)",
        "kind": AGG_KIND,
        "n_dst": args.agg_n_dst,
        "src_cap": args.agg_src_cap,
        "power_law_exponent": AGG_POWER_LAW,
        "partial_row_fraction": AGG_PARTIAL_ROWS,
        "reps": reps,
        "target_copy_fraction": AGG_TARGET_COPY_FRACTION,
        "records": records,
    }


def plot_agg(ax: Any, section: dict[str, Any]) -> None:
    """Kernel bandwidth vs copy, fused/torch speed-ups and GAT times (most threads)."""
    rec = max(section["records"], key=lambda r: r["threads"])
    configs = rec["configs"]
    labels = [f"f{c['fanout']} w{c['width']}" for c in configs]
    xs = np.arange(len(configs))
    ax.axis("off")
    panels = [ax.inset_axes([0.0 + i * 0.35, 0.12, 0.28, 0.78]) for i in range(3)]
    bw, sp, gat = panels
    copy = rec["copy"]["omp_copy_gbps"]
    for i, key in enumerate(("forward", "backward", "fwd_bwd")):
        bw.bar(xs + (i - 1) * 0.27, [c[f"kernel_{key}_gbps"] for c in configs], 0.27, label=key)
    bw.axhline(copy, color="black", linewidth=0.8, label=f"copy {copy:g}")
    bw.axhline(
        copy * section["target_copy_fraction"],
        color="red",
        linestyle="--",
        linewidth=0.8,
        label=f"{section['target_copy_fraction']:.0%} of copy",
    )
    bw.set_xticks(xs, labels, fontsize=6, rotation=45)
    bw.set_ylabel("GB/s (kernel)")
    bw.set_title(f"AGG {section['kind']}, {rec['threads']} thr", fontsize=8)
    bw.legend(fontsize=5)
    sp.bar(xs - 0.2, [c["speedup_fwd"] for c in configs], 0.4, label="fwd")
    sp.bar(xs + 0.2, [c["speedup_fwd_bwd"] for c in configs], 0.4, label="fwd+bwd")
    reference_line(sp, 1.0, "1x (as fast as torch)", color="black", linestyle="-")
    sp.set_xticks(xs, labels, fontsize=6, rotation=45)
    sp.set_ylabel("speed-up fused / torch")
    sp.set_title("AGG end to end", fontsize=8)
    sp.legend(fontsize=6)
    e2e = rec["gat"]["end_to_end"]
    names = list(e2e)
    gat.bar(np.arange(len(names)), [e2e[n]["median_ms"] for n in names], color="tab:purple")
    gat.set_xticks(np.arange(len(names)), [n.replace("_", "\n", 1) for n in names], fontsize=6)
    gat.set_ylabel("ms fwd+bwd (median)")
    gat.set_title(f"GAT attention H={rec['gat']['heads']} D={rec['gat']['dim']}", fontsize=8)


# --------------------------------------------------------------------------- driver


class Section(NamedTuple):
    """A benchmark section: ``run(args) -> JSON entry`` and ``plot(ax, entry)``."""

    run: Callable[[argparse.Namespace], dict[str, Any]]
    plot: Callable[[Any, dict[str, Any]], None]


#: Registered sections, in the order ``all`` runs them.
SECTIONS: dict[str, Section] = {
    "update": Section(run_update, plot_update),
    "agg": Section(run_agg, plot_agg),
}


def environment() -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "threads": _C.get_num_threads(),
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [name for name in SECTIONS if name in results]
    if not present:
        return
    fig, axes = plt.subplots(
        len(present), 1, figsize=(10, 4 * len(present)), squeeze=False, layout="constrained"
    )
    for ax, name in zip(axes[:, 0], present, strict=True):
        SECTIONS[name].plot(ax, results[name])
    save_figure(fig, path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=[*SECTIONS, "all"], default="all")
    parser.add_argument(
        "--sizes",
        type=lambda s: tuple(int(v) for v in s.split(",")),
        default=None,
        help="comma-separated row counts (default: the section's own)",
    )
    parser.add_argument("--reps", type=int, default=None, help="repetitions per configuration")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument(
        "--no-bf16", action="store_true", help="update: skip the bfloat16 implementations"
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--agg-threads",
        type=lambda s: sorted({int(v) for v in s.split(",")}),
        default=sorted({1, os.cpu_count() or 1}),
        help="agg: comma-separated OpenMP thread counts (default: 1 and all cores)",
    )
    parser.add_argument("--agg-n-dst", type=int, default=AGG_N_DST, help="agg: destinations")
    parser.add_argument("--agg-src-cap", type=int, default=AGG_SRC_CAP, help="agg: source cap")
    args = parser.parse_args()

    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out_dir / JSON_NAME
    results = json.loads(json_path.read_text()) if json_path.exists() else {}
    selected = list(SECTIONS) if args.section == "all" else [args.section]
    for name in selected:
        print(f"== section {name}")
        env = environment()
        entry = SECTIONS[name].run(args)
        env["loadavg_end"] = os.getloadavg()[0]
        results[name] = {"environment": env, **entry}
        write_json(json_path, results, indent=2)
    write_plot(results, args.out_dir / PNG_NAME)
    print(f"wrote {json_path} and {args.out_dir / PNG_NAME}")


if __name__ == "__main__":
    main()
