"""Fused kernel benchmarks: fused C++ kernels vs PyTorch eager vs ``torch.compile``.

Sections (``--section``; ``all`` runs every registered one):

- ``update``: the GraphSAGE UPDATE ``Dropout(ReLU(h_neigh W_n^T + h_self W_s^T + b))``
  forward + backward at N in {5k, 50k, 400k} rows and C -> K in {100 -> 256, 256 -> 256,
  256 -> 47}: :func:`distmb.nn.fused_update.sage_update` (custom blocked GEMM with the fused
  epilogue, the default) vs the eager PyTorch function the "torch" path of SAGEConv runs (two
  ``F.linear``, bias, ReLU, ``F.dropout``) vs ``torch.compile`` of that same function vs the
  design alternative "torch GEMM + fused C++ epilogue" (:func:`update_hybrid`).

Implementations are timed round-robin within each repetition (so that load from other
processes hits them alike) and reported as medians; speed-ups are ratios of medians from the
same run. Results are merged into ``results/kernels.json`` (other sections' entries are kept)
and all sections are plotted into ``results/kernels.png``.

    python benchmarks/kernels.py --section update
    python benchmarks/kernels.py --section update --sizes 5000,50000 --reps 3 --no-compile
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from distmb import _C
from distmb.nn import fused_update

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
UPDATE_REPS, UPDATE_REPS_LARGE, UPDATE_LARGE_N = 7, 3, 200_000
#: Target: fused >= this speed-up over eager from UPDATE_TARGET_MIN_N rows, and not slower
#: than torch.compile.
UPDATE_TARGET_SPEEDUP, UPDATE_TARGET_MIN_N = 1.4, 50_000

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
    """The same UPDATE through :func:`distmb.nn.fused_update.sage_update`."""
    return fused_update.sage_update([(h_neigh, w_neigh), (h_self, w_self)], bias, p=p)


def update_hybrid(
    h_neigh: Tensor, h_self: Tensor, w_neigh: Tensor, w_self: Tensor, bias: Tensor, p: float
) -> Tensor:
    """The design alternative: PyTorch's GEMMs (MKL) for both products, then the fused C++
    epilogue (bias + ReLU + dropout + gate bits; backward: gate + bias gradient in one pass)
    through the ``addend`` input of :func:`~distmb.nn.fused_update.sage_update`."""
    pre = torch.addmm(F.linear(h_neigh, w_neigh), h_self, w_self.T)
    return fused_update.sage_update([], bias, addend=pre, p=p)


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
    """Sanity check before timing: without dropout every implementation agrees."""
    inputs, _ = _update_inputs(257, 37, 45, seed=0)
    want = update_eager(*inputs, 0.0)
    for name, fn in fns.items():
        torch.testing.assert_close(fn(*inputs, 0.0), want, rtol=1e-4, atol=1e-4, msg=name)


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
        f"dropout {UPDATE_DROPOUT}, float32; medians (ms) and speed-ups vs eager",
        "dropout": UPDATE_DROPOUT,
        "compile_error": compile_error,
        "rows": rows,
        "targets": targets,
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
    base = row["eager"]["total_ms"]
    for name in samples:
        row[name]["speedup_vs_eager"] = base / row[name]["total_ms"]
    flop = 2 * 2 * 3 * n * c * k  # 2 products, forward + 2 backward, 2 flop per FMA
    row["fused"]["gflops"] = flop / row["fused"]["total_ms"] / 1e6
    print(
        f"N={n:>7} {c:>3}->{k:<3} "
        + "  ".join(
            f"{name} {row[name]['total_ms']:8.1f} ms (x{row[name]['speedup_vs_eager']:.2f})"
            for name in samples
        )
    )
    del inputs, grad
    return row


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
    """Grouped bars: speed-up over eager of every implementation per configuration."""
    rows = section["rows"]
    names = [
        name
        for name in ("fused", "torch_gemm_fused_epilogue", "compile")
        if any(name in r for r in rows)
    ]
    labels = [f"{r['n'] // 1000}k\n{r['c']}->{r['k']}" for r in rows]
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(rows))]
        ys = [r[name]["speedup_vs_eager"] if name in r else 0.0 for r in rows]
        ax.bar(xs, ys, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(UPDATE_TARGET_SPEEDUP, color="red", linestyle="--", linewidth=0.8, label="target")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("speed-up vs eager (fwd + bwd)")
    ax.set_title(f"SAGE UPDATE fwd+bwd, dropout {section['dropout']} (median, same run)")
    ax.legend(fontsize=8)


# --------------------------------------------------------------------------- driver


class Section(NamedTuple):
    """A benchmark section: ``run(args) -> JSON entry`` and ``plot(ax, entry)``."""

    run: Callable[[argparse.Namespace], dict[str, Any]]
    plot: Callable[[Any, dict[str, Any]], None]


#: Registered sections, in the order ``all`` runs them.
SECTIONS: dict[str, Section] = {"update": Section(run_update, plot_update)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "threads": _C.get_num_threads(),
        "torch_threads": torch.get_num_threads(),
        "cpu": _cpu_model(),
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
    fig, axes = plt.subplots(len(present), 1, figsize=(10, 4 * len(present)), squeeze=False)
    for ax, name in zip(axes[:, 0], present, strict=True):
        SECTIONS[name].plot(ax, results[name])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
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
        json_path.write_text(json.dumps(results, indent=2) + "\n")
    write_plot(results, args.out_dir / PNG_NAME)
    print(f"wrote {json_path} and {args.out_dir / PNG_NAME}")


if __name__ == "__main__":
    main()
