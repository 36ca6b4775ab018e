"""Weight-gradient products of GraphSAGE's layers: one long reduction against its rows split.

A layer's weight gradient ``dW = dY^T X`` has a small output (``out x in``: 256 x 100 and
256 x 256 on the GPU benchmark's layers) and reduces over every row of the batch (about
113k in the input layer). On an H200 the benchmark's float32 profile spent about 105 ms an
epoch in cuBLAS's ``cutlass_80_simt_sgemm_*_align1`` kernels, which are not the 47-class
layer's (``docs/cuda.md``, "Where the time goes"); the guess is these products, which a tile
grid over a small output covers with few thread blocks. Splitting the rows into ``C`` chunks
(a batched product, then a sum over the chunks) gives cuBLAS ``C`` times the blocks.

Per shape ``(rows, in, out)`` and precision: ``torch.mm(dY.t(), X)`` against the split for
each ``--chunks`` value: the median milliseconds of ``--repeats`` runs (CUDA events on a
GPU, host clocks on the CPU), the kernels each ran (the profiler's names, on a GPU), and the
largest difference from a float64 product. Writes ``results/gemm_split.json`` on a GPU, or
``--out``; on the CPU it is a smoke test of the code (its times are not GPU figures).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from record import command_line

from distmb.cli.report import write_json

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: ``(rows, in, out)`` of the GPU benchmark's weight gradients: the input layer's
#: destinations (aggregate first, in = the 100 features), the middle layer's, and the top
#: layer's sources (project first, to the 47 classes).
SHAPES = ((113_000, 100, 256), (113_000, 256, 256), (16_000, 256, 256), (16_000, 256, 47))
#: Characters kept of a kernel's name.
KERNEL_NAME_CHARS = 80


def split_product(dy: torch.Tensor, x: torch.Tensor, chunks: int) -> torch.Tensor:
    """``dy.t() @ x`` (``dy``: float[rows, out], ``x``: float[rows, in]) with the rows cut
    into ``chunks`` equal pieces (a batched product, summed over the pieces) and the
    remainder (fewer than ``chunks`` rows) added by one more product: float[out, in]."""
    rows = dy.shape[0]
    piece = rows // chunks
    if piece == 0:
        return dy.t() @ x
    body = chunks * piece
    out = torch.bmm(
        dy[:body].view(chunks, piece, -1).transpose(1, 2), x[:body].view(chunks, piece, -1)
    ).sum(0)
    if body < rows:
        out.addmm_(dy[body:].t(), x[body:])
    return out


def median_ms(run: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """The median milliseconds of ``repeats`` calls of ``run`` after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernels_of(run: Callable[[], Any], device: torch.device) -> list[str]:
    """The names of the device kernels one call of ``run`` launches (none on the CPU)."""
    if device.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize(device)
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted({name[:KERNEL_NAME_CHARS] for name in names})


def measure_shape(
    rows: int, n_in: int, n_out: int, chunk_counts: list[int], device: torch.device, repeats: int
) -> list[dict[str, Any]]:
    """One record per variant (``chunks`` 1: ``torch.mm``) of one shape."""
    gen = torch.Generator().manual_seed(rows + n_in + n_out)
    dy = torch.randn(rows, n_out, generator=gen).to(device)
    x = torch.randn(rows, n_in, generator=gen).to(device)
    want = (dy.double().t() @ x.double()).cpu()
    records = []
    for chunks in [1, *chunk_counts]:

        def run(chunks: int = chunks) -> torch.Tensor:
            return dy.t() @ x if chunks == 1 else split_product(dy, x, chunks)

        error = (run().double().cpu() - want).abs().max().item()
        records.append(
            {
                "rows": rows,
                "in": n_in,
                "out": n_out,
                "chunks": chunks,
                "median_ms": round(median_ms(run, device, repeats), 4),
                "max_abs_error": error,
                "kernels": kernels_of(run, device),
            }
        )
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--chunks", type=lambda s: [int(c) for c in s.split(",")], default=[4, 16, 64])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--scale", type=float, default=1.0, help="rows of every shape times this")
    p.add_argument("--precisions", default="fp32,tf32", help="tf32: CUDA only")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    results = []
    for precision in args.precisions.split(","):
        if precision == "tf32" and device.type != "cuda":
            continue
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        for rows, n_in, n_out in SHAPES:
            for record in measure_shape(max(1, int(rows * args.scale)), n_in, n_out,
                                        args.chunks, device, args.repeats):  # fmt: skip
                record["precision"] = precision
                results.append(record)
                print(record, flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    out = args.out or (RESULTS / "gemm_split.json" if device.type == "cuda" else None)
    if out is None:
        print("not written: CPU run without --out")
        return 0
    machine = {"device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(device)
    write_json(out, {"benchmark": "gemm_split", "command": command_line(argv),
                     "machine": machine, "records": results})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
