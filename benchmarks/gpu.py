"""The one-GPU benchmark: epoch split, sampling, host->device bytes, cache, bandwidth.

On a products-shaped synthetic graph (default 2.4M vertices, ~62M in-edges, 100 float32
features, 47 classes, 8 % training vertices; GraphSAGE 3 layers, hidden 256, fan-out 5,10,15,
batch 1000):

1. **Epoch time and its split** (:class:`distmb.engine.Trainer` on the GPU path): the last of
   ``--epochs`` epochs' wall time and its phases: sample and feature movement (the
   BatchLoader's stages; with ``--prefetch`` > 0 they overlap the compute), compute (forward
   + backward + optimizer), plus the device cache's hit rate and host->device bytes of that
   epoch. One run per ``--kernels`` value with ``--device-cache-percent`` of the rows in the
   device cache (``cache10/fused`` ...; on CUDA also ``cache10/triton/graphs``, with
   ``--cuda-graphs``, and ``cache10/triton/graphs/match``, with ``--match-reorder`` too;
   ``cache10/triton/graphs/float16`` per ``--feature-dtypes``: the host rows and the cache
   in two bytes a value, the same rows cached; ``.../float16/programs264`` per
   ``--gather-programs-per-sm``: its gather capped at that many programs a multiprocessor),
   then the whole table on the device (``table/triton/graphs/prefetch2/float16`` too) with
   ``--prefetch 0`` and with ``--prefetch`` (``table/triton/prefetch0`` ...: triton where it
   is among ``--kernels``, the GPU configuration), the same with ``--cuda-graphs`` and (triton
   only) with ``--compile`` (``table/triton/compile/prefetch0``: its compilations and their
   seconds, the first epoch apart from the steady ones), and GAT (4
   heads) on the whole table with each ``--kernels`` (``gat/table/fused/prefetch2``, the
   PyTorch ops on CUDA, and ``gat/table/triton/prefetch2``, the Triton attention kernel),
   on CUDA also with ``--cuda-graphs`` (``gat/table/triton/graphs/prefetch2``).
2. **Precision sweep** (``"precision_sweep"``): the whole-table run once per ``--precisions``
   value, with its test accuracy (exact layer-wise inference; ``--no-accuracy`` skips it),
   on CUDA with ``--cuda-graphs`` (not fp16; each model's fastest configuration) and for
   GAT too (but fp32, a training run; ``gat/table/triton/graphs/prefetch2``):
   what TF32 and bf16 buy against what they cost; the **C++ path** on the same machine's CPU
   cores (``"cpp_baseline"``: same model, epochs and seed; its epoch time and the test
   accuracy the sweep's are read against).
3. **Profile** (``"profile"``): one whole-table epoch (``--prefetch 0``) under torch.profiler
   (``benchmarks/gpu_profile.py``): kernel launches and host synchronisations per
   iteration, kernel time and GPU busy (on CPU tensors the counts are 0); on CUDA also with
   ``--cuda-graphs`` (``"profile_graphs"``) and with ``--cuda-graphs --prefetch``
   (``"profile_prefetch"``: the configuration users run, the loader's kernels beside the
   step's; GPU busy is the union of all kernels' intervals, so overlap counts once), and
   GAT's graphed epoch (``"profile_gat"``, ``--cuda-graphs --prefetch 0 --precision``: its
   kernels by their time, the projection's matrix product, the attention kernels, ReLU and
   dropout). The goals read the fastest of GraphSAGE's profiles; GAT's fastest epoch is
   recorded beside them, with no goal.
4. **Sampling throughput** (sampled edges per second): the device sampler against the C++
   sampler on the same machine and seeds (``benchmarks/gpu_sampling.py``'s configurations).
5. **Host->device bytes per epoch** with and without Match-Reorder and **device-cache hit
   rate** per policy at 5, 10 and 20 % of the features (``benchmarks/gpu_features.py``'s
   cache part; device-independent counts).
6. **Launches and host syncs per iteration** (``"launches_per_iteration"``): the CPU
   proxies of :mod:`distmb.engine.op_census` (ATen ops by stage, sync-prone ops, host reads,
   device waits; docs/cuda.md), also in the CPU smoke test.
7. **Zero-copy gather bandwidth** against the pinned host->device copy bandwidth (CUDA only;
   ``benchmarks/gpu_features.py``'s bandwidth part).

``--device cuda`` (default where torch sees a GPU) is the benchmark. ``--device cpu`` runs the
same code on CPU tensors (``--sampler device``) as a smoke test: its times are **not GPU
figures** (the JSON says so in ``"figures"``). Records the device name, driver and the torch,
CUDA and Triton versions. Writes ``results/gpu.json`` + ``.png`` only when run on a GPU, or
to ``--out`` (then ``--out`` with ``.png``) when given.

    python benchmarks/gpu.py                                   # the issue's size, on a GPU
    python benchmarks/gpu.py --quick --device cpu --out /tmp/gpu.json   # smoke test
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_features  # noqa: E402  (benchmarks/ is not a package)
import gpu_profile  # noqa: E402
import gpu_sampling  # noqa: E402
from record import command_line  # noqa: E402

from distmb import _C  # noqa: E402
from distmb.cli.report import save_figure, write_json  # noqa: E402
from distmb.config.constants import PRECISIONS  # noqa: E402
from distmb.config.train import (  # noqa: E402
    DEFAULT_FANOUT,
    DEFAULT_SUPERBATCH,
    TrainConfig,
    precision_problem,
)
from distmb.core.plotting import bar_axis, panels  # noqa: E402
from distmb.data.datasets.synthetic import SyntheticConfig, generate  # noqa: E402
from distmb.data.local import LocalGraph  # noqa: E402
from distmb.engine import Trainer  # noqa: E402
from distmb.engine.op_census import census_epoch  # noqa: E402
from distmb.pipeline.features.storage import STORAGE_DTYPES  # noqa: E402

RESULTS = HERE.parent / "results"
#: ``--quick``: a graph and a run small enough for a CPU smoke test of every part.
QUICK = {"nodes": 10_000, "avg_degree": 10.0, "feat_dim": 16, "hidden": 32, "epochs": 1,
         "batches": 3, "warmup": 1, "repeats": 3, "superbatch": 4, "batch_size": 500}  # fmt: skip
#: The bar panels' axis ends, as a multiple of the longest bar: room for legends and labels.
HEADROOM = 1.35
#: The benchmark's parts (``--parts``), in the order they run; ``"bandwidth"`` is sized by
#: ``"cache"``'s mean inputs per batch, so it needs that part.
PARTS = (
    "training", "precision_sweep", "cpp_baseline", "profile", "profile_graphs",
    "profile_prefetch", "profile_gat", "launches_per_iteration", "sampling", "cache", "bandwidth",
)  # fmt: skip
#: The profiles of GraphSAGE, whose fastest the goals read (``"profile_gat"`` is GAT's).
SAGE_PROFILES = ("profile", "profile_graphs", "profile_prefetch")
#: The goals, checked in the record: epoch seconds with the feature table on the device and
#: with the device cache over zero-copy host rows; device sampler against the C++ one; GPU
#: busy (kernel-covered fraction of the epoch); host syncs and launches per iteration.
EPOCH_GOAL_TABLE_S = 0.5
EPOCH_GOAL_CACHE_S = 0.8
SAMPLING_GOAL = 10.0
BUSY_GOAL = 0.8
SYNCS_GOAL = 2.0
LAUNCHES_GOAL = 60.0
#: ``--device-cache-percent`` of the whole-table runs: every row in device memory.
WHOLE_TABLE_PERCENT = 100.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cuda = torch.cuda.is_available()
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if cuda else "cpu")
    p.add_argument("--quick", action="store_true", help=f"small run: {QUICK}")
    p.add_argument("--nodes", type=float, default=2.4e6)
    p.add_argument("--avg-degree", type=float, default=26.0, help="in-edges ~ nodes x this")
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--classes", type=int, default=47)
    p.add_argument("--train-fraction", type=float, default=0.08)
    p.add_argument("--fanout", type=str, default=",".join(map(str, DEFAULT_FANOUT)))
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2, help="the last one is reported")
    p.add_argument(
        "--kernels", type=str, default=None,
        help="comma-separated --kernels values, one training run each (default: fused, "
        "plus triton on CUDA)",
    )  # fmt: skip
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="of the training runs and the profile")  # fmt: skip
    p.add_argument("--precisions", type=str, default=None,
                   help="comma-separated, the precision sweep (default: fp32,tf32,bf16 on "
                   "CUDA, fp32,bf16 on the CPU)")  # fmt: skip
    p.add_argument("--no-accuracy", action="store_true",
                   help="the precision sweep without its test accuracies")  # fmt: skip
    p.add_argument("--device-cache-percent", type=float, default=10.0)
    p.add_argument("--match-reorder", action="store_true", help="in the training runs")
    p.add_argument(
        "--feature-dtypes", type=str, default="float16",
        help="comma-separated --feature-dtype values (of float16, bfloat16; '' for none): one "
        "more device-cache run each, in the cache runs' fastest configuration, the host rows "
        "and the cache in that dtype (the cache holds the same rows)",
    )  # fmt: skip
    p.add_argument(
        "--gather-programs-per-sm", type=str, default="2",
        help="comma-separated programs per multiprocessor ('' for none; CUDA only): one more "
        "device-cache run each, as the first --feature-dtypes run (else the graphs run), its "
        "sync-free gather capped at that many programs a multiprocessor "
        "(DeviceFeatures.gather_programs), so that the training step's kernels find room "
        "beside a gather waiting on PCIe",
    )  # fmt: skip
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--superbatch", type=int, default=DEFAULT_SUPERBATCH)
    p.add_argument("--presample-epochs", type=int, default=1)
    p.add_argument("--batches", type=int, default=20, help="sampling part: measured batches")
    p.add_argument("--warmup", type=int, default=3, help="sampling part: unmeasured batches")
    p.add_argument("--repeats", type=int, default=20, help="bandwidth part: medians of")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="JSON path (PNG beside it)")
    p.add_argument(
        "--parts", type=str, default=",".join(PARTS),
        help="comma-separated parts to run, the others recorded as skipped (default: all): "
        "a short GPU lease can leave out the device-independent cache part (and bandwidth, "
        "which it sizes)",
    )  # fmt: skip
    args = p.parse_args(argv)
    unknown = [name for name in args.parts.split(",") if name not in PARTS]
    if unknown:
        p.error(f"--parts: {', '.join(unknown)} not among {', '.join(PARTS)}")
    args.parts = set(args.parts.split(","))
    if args.quick:
        for key, value in QUICK.items():
            if p.get_default(key) == getattr(args, key):  # flags given explicitly win
                setattr(args, key, value)
    if args.device == "cuda" and not cuda:
        p.error(f"--device cuda: torch {torch.__version__} sees no GPU; --device cpu is the "
                "CPU smoke test")  # fmt: skip
    if args.kernels is None:
        args.kernels = "fused,triton" if args.device == "cuda" else "fused"
    if args.precisions is None:
        args.precisions = "fp32,tf32,bf16" if args.device == "cuda" else "fp32,bf16"
    for precision in args.precisions.split(","):
        if precision not in PRECISIONS:
            p.error(f"--precisions: {precision!r} is not one of {PRECISIONS}")
    args.feature_dtypes = [d for d in args.feature_dtypes.split(",") if d]
    try:
        args.gather_programs_per_sm = [int(v) for v in args.gather_programs_per_sm.split(",") if v]
    except ValueError:
        p.error(f"--gather-programs-per-sm: integers expected, got {args.gather_programs_per_sm!r}")
    if any(v < 1 for v in args.gather_programs_per_sm):
        p.error("--gather-programs-per-sm: values must be >= 1")
    for dtype in args.feature_dtypes:
        if dtype not in STORAGE_DTYPES or dtype == "float32":
            p.error(f"--feature-dtypes: {dtype!r} is not one of float16, bfloat16")
    args.fanouts = [int(f) for f in args.fanout.split(",")]  # gpu_sampling's name
    return args


def machine(device: str) -> dict[str, Any]:
    """gpu_sampling's facts, plus the driver (nvidia-smi) and CUDA build on a GPU."""
    facts = gpu_sampling.machine()
    facts["threads"] = int(_C.get_num_threads())
    if device == "cuda":
        facts["cuda"] = torch.version.cuda
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            facts["driver"] = out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError) as exc:
            facts["driver"] = f"unknown ({type(exc).__name__})"
    return facts


def make_trainer(
    args: argparse.Namespace,
    graph,
    kernels: str,
    *,
    cache_percent: float,
    prefetch: int,
    precision: str,
    epochs: int | None = None,
    model: str = "sage",
    cuda_graphs: bool = False,
    compile_model: bool = False,
    match_reorder: bool | None = None,
    feature_dtype: str = "float32",
    gather_programs: int | None = None,
) -> Trainer:
    """A Trainer on the GPU path: ``model`` with ``cache_percent`` of the rows in the device
    cache (the whole table: policy ``degree``, no pre-sampling needed), ``--cuda-graphs``
    when ``cuda_graphs``, ``--compile`` when ``compile_model``, ``--match-reorder`` when
    ``match_reorder`` (None: ``args``'), the table stored in ``feature_dtype``
    (``--feature-dtype``; the cache's MiB sized so that it holds the same rows whatever the
    dtype), the device cache's sync-free gather capped at ``gather_programs`` programs
    (``DeviceFeatures.gather_programs``), the rest from ``args``."""
    match_reorder = args.match_reorder if match_reorder is None else match_reorder
    row_bytes = graph.features.shape[1] * STORAGE_DTYPES[feature_dtype].itemsize
    whole = cache_percent >= WHOLE_TABLE_PERCENT
    cache_mb = graph.num_nodes * min(cache_percent, 100.0) / 100 * row_bytes / 2**20
    config = TrainConfig(
        layers=len(args.fanouts), fanout=tuple(args.fanouts), hidden=args.hidden,
        batch_size=args.batch_size, epochs=epochs or args.epochs, seed=args.seed,
        progress=False, device=args.device, sampler="device", kernels=kernels, model=model,
        precision=precision, device_cache_mb=cache_mb * (1.01 if whole else 1.0),
        device_cache_policy="degree" if whole else "presc",
        match_reorder=match_reorder, prefetch=prefetch, superbatch=args.superbatch,
        presample_epochs=args.presample_epochs, threads=args.threads, cuda_graphs=cuda_graphs,
        compile=compile_model, feature_dtype=feature_dtype,
    )  # fmt: skip
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    if gather_programs is not None:
        trainer.parts.device_stages.device_cache.gather_programs = gather_programs
    return trainer


def run_name(
    kernels: str,
    cache_percent: float,
    prefetch: int,
    model: str = "sage",
    graphs: bool = False,
    compiled: bool = False,
    match: bool = False,
    feature_dtype: str = "float32",
    gather_programs: int | None = None,
) -> str:
    """``table/fused/prefetch0`` or ``cache10/triton`` (the ``--prefetch`` of the cache runs;
    ``cache10/triton/graphs`` with ``--cuda-graphs``, ``.../match`` with Match-Reorder),
    prefixed by the model when it is not GraphSAGE (``gat/table/triton/prefetch2``), with
    ``graphs/`` before the prefetch for ``--cuda-graphs`` (``table/triton/graphs/prefetch0``)
    and ``compile/`` for ``--compile`` (``table/triton/compile/prefetch0``), then the
    ``--feature-dtype`` where it is not float32 (``cache10/triton/graphs/float16``) and a
    gather's cap on its programs (``.../float16/programs264``)."""
    prefix = "" if model == "sage" else f"{model}/"
    stored = "" if feature_dtype == "float32" else f"/{feature_dtype}"
    stored += "" if gather_programs is None else f"/programs{gather_programs}"
    if cache_percent >= WHOLE_TABLE_PERCENT:
        step = "graphs/" if graphs else "compile/" if compiled else ""
        return f"{prefix}table/{kernels}/{step}prefetch{prefetch}{stored}"
    suffix = ("/graphs" if graphs else "") + ("/match" if match else "")
    return f"{prefix}cache{cache_percent:g}/{kernels}{suffix}{stored}"


def run_settings(
    args: argparse.Namespace,
    kernels: str,
    *,
    cache_percent: float | None = None,
    prefetch: int | None = None,
    precision: str | None = None,
    model: str = "sage",
    cuda_graphs: bool = False,
    compile_model: bool = False,
    match_reorder: bool | None = None,
    feature_dtype: str = "float32",
    gather_programs: int | None = None,
) -> dict[str, Any]:
    """A run's settings, those given over ``args``' (the options of :func:`training_part`),
    and its name (:func:`run_name`; ``/match`` where its Match-Reorder is
    not ``args``'): the head of its record, and of its failure's."""
    cache_percent = args.device_cache_percent if cache_percent is None else cache_percent
    prefetch = args.prefetch if prefetch is None else prefetch
    match = args.match_reorder if match_reorder is None else match_reorder
    name = run_name(kernels, cache_percent, prefetch, model, cuda_graphs, compile_model,
                    match and not args.match_reorder, feature_dtype, gather_programs)  # fmt: skip
    return {
        "name": name,
        "model": model,
        "cuda_graphs": cuda_graphs,
        "compile": compile_model,
        "kernels": kernels,
        "precision": args.precision if precision is None else precision,
        "prefetch": prefetch,
        "match_reorder": match,
        "feature_dtype": feature_dtype,
        "gather_programs": gather_programs,
        "cache_percent": cache_percent,
    }


def training_part(
    args: argparse.Namespace, graph, kernels: str, *, accuracy: bool = False, **options: Any
) -> dict[str, Any]:
    """Train ``--epochs`` epochs on the GPU path; the last epoch's time split (and the test
    accuracy when ``accuracy``). ``options``: :func:`run_settings`' (unset ones come from
    ``args``). With ``compile_model`` (``--compile``) also the compilations, their seconds,
    and the first epoch (which compiles) apart from the steady ones (the median of the
    others)."""
    run = run_settings(args, kernels, **options)
    cache_percent, precision = run.pop("cache_percent"), run["precision"]
    t0 = time.perf_counter()
    trainer = make_trainer(args, graph, kernels, cache_percent=cache_percent,
                           prefetch=run["prefetch"], precision=precision, model=run["model"],
                           cuda_graphs=run["cuda_graphs"], compile_model=run["compile"],
                           match_reorder=run["match_reorder"],
                           feature_dtype=run["feature_dtype"],
                           gather_programs=run["gather_programs"])  # fmt: skip
    setup_s = time.perf_counter() - t0
    epochs = [trainer.train_epoch(e) for e in range(args.epochs)]
    last = epochs[-1]
    stages = trainer.parts.device_stages
    cache = stages.features.counters() if stages is not None else {}
    compute = last["fwd"] + last["bwd"] + last["opt"]
    record = {
        **run,
        "setup_s": round(setup_s, 2),
        "epoch_times_s": [r["epoch_time"] for r in epochs],
        "epoch_s": last["epoch_time"],
        "sample_s": last["sample"],
        "feature_movement_s": last["gather"],
        "compute_s": round(compute, 4),
        "load_wait_s": last["load_wait"],
        "iterations": last["iterations"],
        "loss": round(last["loss"], 4),
        "device_cache_percent": min(cache_percent, 100.0),
        "device_cache_hit_rate": round(cache["hits"] / max(cache["lookups"], 1), 4)
        if cache else None,
        "h2d_bytes": cache.get("bytes_h2d"),
    }  # fmt: skip
    if trainer.graphed is not None:
        record["graph_captures"] = trainer.graphed.captures
        record["graph_replays"] = trainer.graphed.replays
    if trainer.compiled is not None:
        times = record["epoch_times_s"]
        record["compiles"] = trainer.compiled.compiles
        record["compile_s"] = round(trainer.compiled.compile_s, 2)  # the calls that compiled
        record["first_epoch_s"] = times[0]
        record["steady_epoch_s"] = float(np.median(times[1:])) if len(times) > 1 else None
    if accuracy:
        t0 = time.perf_counter()
        record["test_acc"] = round(trainer.evaluate()["test_acc"], 4)
        record["evaluate_s"] = round(time.perf_counter() - t0, 2)
    print(f"train [{record['name']}, {precision}]: {record}", flush=True)
    return record


def training_runs(args: argparse.Namespace, graph) -> list[dict[str, Any]]:
    """One run per ``--kernels`` with the device cache (on CUDA also with ``--cuda-graphs``,
    :func:`profiled_kernels`, and with ``--match-reorder`` too), then the whole table with
    ``--prefetch 0`` and with ``--prefetch`` (:func:`profiled_kernels`: triton on CUDA, the
    GPU configuration), the same with ``--cuda-graphs`` and with ``--compile`` (triton
    only), then GAT (``--heads`` 4) on the whole table with each ``--kernels`` (on CUDA the
    PyTorch ops and the Triton attention kernel), and on CUDA GAT with ``--cuda-graphs`` at
    ``--prefetch`` (:func:`profiled_kernels`: its fastest configuration). A run that fails is
    recorded as such (:func:`guarded_run`) and the others still run."""
    kernels = args.kernels.split(",")
    runs = [guarded_run(args, graph, k) for k in kernels]
    table_kernels = profiled_kernels(args)
    cuda = args.device == "cuda"
    if cuda:  # the device cache with --cuda-graphs (the step and sampler)
        runs.append(guarded_run(args, graph, table_kernels, cuda_graphs=True))
        if not args.match_reorder:  # and with Match-Reorder: fewer host rows a batch
            runs.append(
                guarded_run(args, graph, table_kernels, cuda_graphs=True, match_reorder=True)
            )
    for dtype in args.feature_dtypes:  # two-byte host rows: half the bytes a missed row moves
        runs.append(guarded_run(args, graph, table_kernels, cuda_graphs=cuda, feature_dtype=dtype))
    if cuda:  # the gather capped, to leave multiprocessors to the training step's kernels
        sms = torch.cuda.get_device_properties(args.device).multi_processor_count
        dtype = args.feature_dtypes[0] if args.feature_dtypes else "float32"
        for per_sm in args.gather_programs_per_sm:
            runs.append(
                guarded_run(
                    args,
                    graph,
                    table_kernels,
                    cuda_graphs=True,
                    feature_dtype=dtype,
                    gather_programs=per_sm * sms,
                )
            )
    table = {"cache_percent": WHOLE_TABLE_PERCENT}
    for prefetch in dict.fromkeys((0, args.prefetch)):
        runs.append(guarded_run(args, graph, table_kernels, prefetch=prefetch, **table))
    for prefetch in dict.fromkeys((0, args.prefetch)):
        runs.append(
            guarded_run(args, graph, table_kernels, prefetch=prefetch, cuda_graphs=True, **table)
        )
    for dtype in args.feature_dtypes:  # the table in two bytes: half the gather's reads
        runs.append(
            guarded_run(args, graph, table_kernels, cuda_graphs=True, feature_dtype=dtype, **table)
        )
    if table_kernels == "triton":  # --compile: the Triton layers only
        runs.append(
            guarded_run(args, graph, table_kernels, prefetch=0, compile_model=True, **table)
        )
    runs += [guarded_run(args, graph, k, model="gat", **table) for k in kernels]
    if cuda:  # GAT in its fastest configuration, as GraphSAGE's graphed table runs
        runs.append(guarded_run(args, graph, table_kernels, model="gat", cuda_graphs=True, **table))
    return runs


def guarded_run(args: argparse.Namespace, graph, kernels: str, **options: Any) -> dict[str, Any]:
    """:func:`training_part`, or where it fails (a step that cannot be captured, a graph that
    does not compile, a kernel that does not build) a record of the failure (``"failed"``:
    the error's type and message), so that the benchmark's other parts still run."""
    try:
        return training_part(args, graph, kernels, **options)
    except Exception as exc:  # noqa: BLE001 - recorded, and the benchmark goes on
        options.pop("accuracy", None)  # not a setting of the run
        run = run_settings(args, kernels, **options)
        record = {key: run[key] for key in ("name", "model", "cuda_graphs", "compile", "precision")}
        record["failed"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        print(f"train [{record['name']}]: failed: {record['failed']}", flush=True)
        return record


def precision_part(args: argparse.Namespace, graph) -> list[dict[str, Any]]:
    """The whole-table run per ``--precisions`` value, with its test accuracy, with the GPU
    configuration's kernels (:func:`profiled_kernels`); on CUDA also GAT per precision but
    fp32 (its fp32 run is among the training runs). On CUDA both models run with
    ``--cuda-graphs`` (their fastest configuration, where the matrix products' share of the
    time is largest; an eager epoch is bound by launches, so a precision barely shows
    there), except in fp16, whose gradient scaler a replayed graph cannot run. GAT's
    projections, of every source to ``heads x hidden`` columns, are most of its arithmetic,
    so TF32 and bf16 matter to it more than to GraphSAGE. On the CPU the layers run
    ``--kernels torch`` (CPU bf16 autocast reaches those only); a precision this device
    cannot run is recorded with the reason."""
    kernels = profiled_kernels(args) if args.device == "cuda" else "torch"
    models = ("sage", "gat") if args.device == "cuda" else ("sage",)
    records = []
    for model in models:
        for precision in args.precisions.split(","):
            if model == "gat" and precision == "fp32":
                continue
            problem = precision_problem(precision, args.device)
            if problem:
                records.append({"precision": precision, "model": model, "skipped": problem})
                continue
            # Each model's fastest configuration (--cuda-graphs refuses fp16's scaler).
            graphed = args.device == "cuda" and precision != "fp16"
            records.append(
                guarded_run(
                    args,
                    graph,
                    kernels,
                    cache_percent=WHOLE_TABLE_PERCENT,
                    precision=precision,
                    accuracy=not args.no_accuracy,
                    model=model,
                    cuda_graphs=graphed,
                )
            )
    return records


def cpp_baseline_part(args: argparse.Namespace, graph) -> dict[str, Any]:
    """The C++ path on this machine's CPU cores (``--device cpu --sampler cpp``, the fused
    kernels, ``--threads``): the same model, batches per epoch, epochs and seed as the
    precision sweep's runs, its epoch time and its test accuracy (the sweep's accuracies
    are read against it: other random choices, the same distribution)."""
    config = TrainConfig(
        layers=len(args.fanouts), fanout=tuple(args.fanouts), hidden=args.hidden,
        batch_size=args.batch_size, epochs=args.epochs, seed=args.seed, progress=False,
        device="cpu", sampler="cpp", threads=args.threads,
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    setup_s = time.perf_counter() - t0
    epochs = [trainer.train_epoch(e) for e in range(args.epochs)]
    record: dict[str, Any] = {
        "name": "cpp/cpu",
        "kernels": trainer.parts.kernels,
        "threads": int(_C.get_num_threads()),
        "setup_s": round(setup_s, 2),
        "epoch_times_s": [r["epoch_time"] for r in epochs],
        "epoch_s": epochs[-1]["epoch_time"],
        "loss": round(epochs[-1]["loss"], 4),
    }
    if not args.no_accuracy:
        t0 = time.perf_counter()
        record["test_acc"] = round(trainer.evaluate()["test_acc"], 4)
        record["evaluate_s"] = round(time.perf_counter() - t0, 2)
    print(f"cpp baseline: {record}", flush=True)
    return record


def profiled_kernels(args: argparse.Namespace) -> str:
    """The ``--kernels`` value the profile and the census run: ``triton`` where it is among
    ``--kernels`` (the GPU configuration: its aggregation kernels), else the first."""
    kernels = args.kernels.split(",")
    return "triton" if "triton" in kernels else kernels[0]


def profile_part(
    args: argparse.Namespace,
    graph,
    cuda_graphs: bool = False,
    prefetch: int = 0,
    model: str = "sage",
) -> dict[str, Any]:
    """One whole-table epoch of ``model`` (``prefetch``, :func:`profiled_kernels`,
    ``--cuda-graphs`` when ``cuda_graphs``, ``--precision``) under torch.profiler after a
    warm-up epoch: launches, syncs, kernel time and GPU busy, and the kernels that took the
    most time (``benchmarks/gpu_profile.py``); named as :func:`run_name` names the run
    (``gat/table/triton/graphs/prefetch0``)."""
    kernels = profiled_kernels(args)
    trainer = make_trainer(args, graph, kernels, cache_percent=WHOLE_TABLE_PERCENT,
                           prefetch=prefetch, precision=args.precision, epochs=2,
                           model=model, cuda_graphs=cuda_graphs)  # fmt: skip
    trainer.train_epoch(0)
    record = {
        "name": run_name(kernels, WHOLE_TABLE_PERCENT, prefetch, model, graphs=cuda_graphs),
        "model": model,
        "precision": args.precision,
        # The eager epoch's ops by input shape: which product runs which kernel.
        **gpu_profile.profile_epoch(
            lambda: trainer.train_epoch(1), trainer.device, shapes=not cuda_graphs
        ),
    }
    print(f"profile: {record}", flush=True)
    return record


def launches_part(args: argparse.Namespace, graph) -> dict[str, Any]:
    """The CPU proxies of launches and syncs (:mod:`distmb.engine.op_census`): ATen ops,
    launches, sync-prone ops, host reads and device waits per iteration of one epoch after a
    warm-up one, in the profile's configuration (the whole table on the device,
    :func:`profiled_kernels`) on the loader's synchronous path (``--prefetch 0``). On a GPU
    they sit beside the profile's measured launches and syncs; ``"graphs"``: the same with
    ``--cuda-graphs`` (its ``launches_graphed``: the launches outside the graph plus one
    replay per iteration). On the CPU the layers run
    ``--kernels torch`` (``fused`` would run the C++ kernels, whose work the census does not
    see), or ``triton`` when asked for (under the interpreter)."""
    kernels = profiled_kernels(args)
    if args.device == "cpu" and kernels != "triton":
        kernels = "torch"
    record: dict[str, Any] = {"kernels": kernels}
    for graphs in (False, True):
        try:
            trainer = make_trainer(args, graph, kernels, cache_percent=WHOLE_TABLE_PERCENT,
                                   prefetch=0, precision=args.precision, epochs=2,
                                   cuda_graphs=graphs)  # fmt: skip
            trainer.train_epoch(0)
            census = census_epoch(trainer, 1)
        except Exception as exc:  # noqa: BLE001 - a failed capture is recorded
            record["graphs"] = {"failed": f"{type(exc).__name__}: {exc}"}
            continue
        counts = {**census.per_iteration(), "top_ops_per_epoch": census.top_ops}
        if graphs:  # --cuda-graphs: launches_graphed is what the GPU launches
            record["graphs"] = counts
        else:
            record.update(counts)
        print(f"launches{' (--cuda-graphs)' if graphs else ''}: {census.per_iteration()}",
              flush=True)  # fmt: skip
    return record


def sampling_part(args: argparse.Namespace, graph) -> list[dict[str, Any]]:
    """gpu_sampling's interleaved timing of every sampler configuration this device runs; a
    device configuration that fails is recorded with its error (``"failed"``)."""
    samplers = {
        name: s
        for name, s in gpu_sampling.configurations(args, graph).items()
        if name == "cpp" or name.split("/")[1] == args.device
    }
    failures: dict[str, str] = {}
    seconds, edges = gpu_sampling.interleaved(args, graph, samplers, failures)
    if "cpp" in failures:  # the baseline
        raise RuntimeError(f"the C++ sampler failed: {failures['cpp']}")
    base = np.median(np.asarray(edges["cpp"]) / np.asarray(seconds["cpp"]))
    records: list[dict[str, Any]] = []
    for name in samplers:
        if name in failures:
            records.append({"sampler": name, "failed": failures[name]})
            print(f"sampling: {name} failed: {failures[name]}", flush=True)
            continue
        rec = {"sampler": name, **gpu_sampling.summary(seconds[name], edges[name])}
        rec["speedup_vs_cpp"] = round(float(rec["edges_per_s"] / base), 3)
        records.append(rec)
        print(f"sampling: {rec}", flush=True)
    return records


def measured(result: dict[str, Any], key: str) -> Any:
    """``result[key]``, or None where that part failed, was skipped or did not run."""
    value = result.get(key)
    if isinstance(value, dict) and ("failed" in value or "skipped" in value):
        return None
    return value


def trained_runs(result: dict[str, Any], key: str = "training") -> list[dict[str, Any]]:
    """The runs of part ``key`` (``"training"`` or ``"precision_sweep"``) that trained: not
    failed, nor skipped (a precision the device cannot run)."""
    return [r for r in measured(result, key) or [] if "epoch_s" in r]


def failed_parts(result: dict[str, Any]) -> list[str]:
    """The parts, training runs and samplers that failed (their keys and names)."""
    names = [key for key, value in result.items() if isinstance(value, dict) and "failed" in value]
    for key in ("training", "precision_sweep"):
        runs = result.get(key)
        if isinstance(runs, list):
            names += [f"{key}:{r['name']}" for r in runs if "failed" in r]
    sampling = result.get("sampling")
    if isinstance(sampling, list):
        names += [f"sampling:{r['sampler']}" for r in sampling if "failed" in r]
    return names


def goals(result: dict[str, Any]) -> dict[str, str]:
    """The goals against what this run measured (GPU runs only): GraphSAGE's epochs, and
    the fastest of its profiles (:data:`SAGE_PROFILES`) for GPU busy, syncs and launches;
    GAT's fastest epoch (training or precision sweep, any precision) recorded, with no goal
    to meet."""
    if result["figures"] != "gpu":
        return {"note": "CPU smoke test: no goal applies"}
    out = {}
    training = trained_runs(result)
    sage = [r for r in training if r.get("model", "sage") == "sage"]
    table = [r["epoch_s"] for r in sage if r["name"].startswith("table/")]
    cached = [r for r in sage if not r["name"].startswith("table/")]
    if table:
        out["epoch_table"] = (
            f"epoch, table on the device <= {EPOCH_GOAL_TABLE_S} s: {min(table):.2f} s"
        )
    if cached:
        best = min(cached, key=lambda r: r["epoch_s"])
        out["epoch_cache"] = (
            f"epoch, device cache <= {EPOCH_GOAL_CACHE_S} s: {best['epoch_s']:.2f} s "
            f"({best['name']})"
        )
    swept_all = trained_runs(result, "precision_sweep")
    swept = [r for r in swept_all if r.get("model", "sage") == "sage"]
    if swept:  # the precision sweep's table runs: the goal at another precision
        best = min(swept, key=lambda r: r["epoch_s"])
        out["epoch_table_any_precision"] = (
            f"epoch, table on the device, any precision <= {EPOCH_GOAL_TABLE_S} s: "
            f"{best['epoch_s']:.2f} s ({best['precision']}, {best['name']})"
        )
    gat = [
        r
        for r in training + swept_all
        if r.get("model", "sage") == "gat" and r["name"].startswith("gat/table/")
    ]
    if gat:  # no goal set for GAT: its fastest epoch, any precision, beside GraphSAGE's
        best = min(gat, key=lambda r: r["epoch_s"])
        out["gat_epoch"] = (
            f"GAT epoch, table on the device, fastest (recorded, no goal): "
            f"{best['epoch_s']:.2f} s ({best['precision']}, {best['name']})"
        )
    baseline = measured(result, "cpp_baseline")
    accurate = [r for r in swept if "test_acc" in r]
    if baseline and "test_acc" in baseline and accurate:
        out["accuracy"] = (
            f"test accuracy, C++ path {baseline['test_acc']:.4f}; GPU path "
            + ", ".join(f"{r['precision']} {r['test_acc']:.4f}" for r in accurate)
        )
    # GraphSAGE's profiles only (not "profile_gat"): the goals are GraphSAGE's.
    profiles = [measured(result, key) for key in SAGE_PROFILES]
    profiles = [p for p in profiles if p]
    profile = min(profiles, key=lambda p: p["wall_s"]) if profiles else None  # the fastest
    if profile:
        out["profiled"] = f"the profile of {profile['name']}"
        out["busy"] = f"GPU busy >= {BUSY_GOAL:.0%}: {profile['gpu_busy']:.0%}"
        out["syncs"] = f"syncs/iteration <= {SYNCS_GOAL:g}: {profile['syncs_per_iteration']}"
        out["launches"] = (
            f"launches/iteration <= {LAUNCHES_GOAL:g}: {profile['launches_per_iteration']}"
        )
    sampling = [r for r in measured(result, "sampling") or [] if "failed" not in r]
    device_rates = [r["speedup_vs_cpp"] for r in sampling if r["sampler"] != "cpp"]
    if device_rates:
        out["sampling"] = f"GPU sampling >= {SAMPLING_GOAL:.0f}x C++: {max(device_rates):.1f}x"
    bandwidth = result.get("bandwidth", {})
    if "goal" in bandwidth:
        out["gather"] = bandwidth["goal"]
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """Four panels: epoch split per run (the precision sweep's other precisions too),
    sampling edges/s, h2d bytes (plain, Match, Match-Reorder) and hit rate per policy and
    cache size (marked as not measured where the cache part did not run). Bars are linear from zero
    (:func:`~distmb.core.plotting.bar_axis`); the epoch panel says when its stacked phases
    overlap (their sum exceeds the epoch)."""
    fig, (ax_epoch, ax_sample, ax_bytes, ax_hit) = panels(4, max_columns=2)
    label = "" if result["figures"] == "gpu" else " (CPU smoke test, not a GPU figure)"
    fig.suptitle(machine_title(result["machine"]) + label, fontsize="medium")
    # The precision sweep's runs at other precisions beside the training runs (fp32).
    sweep = trained_runs(result, "precision_sweep")
    training = trained_runs(result) + [r for r in sweep if r.get("precision", "fp32") != "fp32"]
    if training:
        draw_epochs(ax_epoch, training)
    sampling = measured(result, "sampling")
    if sampling:
        draw_sampling(ax_sample, sampling)
    cache = measured(result, "cache")
    if cache:
        draw_cache(ax_bytes, ax_hit, cache["runs"])
    else:
        for ax in (ax_bytes, ax_hit):
            ax.set_axis_off()
            ax.text(0.5, 0.5, "cache part:\nnot measured in this run", ha="center",
                    fontsize="small", transform=ax.transAxes)  # fmt: skip
    save_figure(fig, path)


def machine_title(facts: dict[str, Any]) -> str:
    """``NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130, Triton
    3.6.0, 16 cores``: the figure's machine (the CPU's name where there is no GPU)."""
    parts = [facts.get("gpu") or facts.get("cpu", "unknown machine")]
    for key, name in (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"),
                      ("triton", "Triton")):  # fmt: skip
        if facts.get(key):
            parts.append(f"{name} {facts[key]}")
    parts.append(f"{facts.get('cpus', '?')} cores")
    return ", ".join(parts)


def draw_epochs(ax, training: list[dict[str, Any]]) -> None:
    """Each run's last epoch as horizontal stacked phases (sample, features, compute), its
    wall time as a dot; the title says when the phases overlap (their sum exceeds the
    epoch: with ``--prefetch`` sampling and features run beside the compute)."""
    # The first run at the top; a precision other than fp32 named after the run.
    names = [
        r["name"] if r.get("precision", "fp32") == "fp32" else f"{r['name']} {r['precision']}"
        for r in training
    ][::-1]
    rows = training[::-1]
    left = np.zeros(len(rows))
    for key, name in (("sample_s", "sample"), ("feature_movement_s", "features"),
                      ("compute_s", "compute")):  # fmt: skip
        values = np.array([r[key] for r in rows])
        ax.barh(names, values, left=left, label=name)
        left += values
    epochs = np.array([r["epoch_s"] for r in rows])
    ax.scatter(epochs, names, color="k", label="epoch", zorder=3)
    for y, epoch in enumerate(epochs):
        ax.annotate(f"{epoch:.2f} s", (max(left[y], epoch), y), xytext=(4, -3),
                    textcoords="offset points", fontsize="small")  # fmt: skip
    title = "last epoch's phases"
    if (left > epochs).any():
        title += "\nphases overlap (prefetch): their sum exceeds the epoch (dot)"
    ax.set_title(title, fontsize="medium")
    ax.set(xlabel="seconds")
    ax.tick_params(axis="y", labelsize="small")
    bar_axis(ax, axis="x", end=HEADROOM * 1.15 * max(left.max(), epochs.max()))
    ax.legend(fontsize="small", ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.12))


def draw_sampling(ax, sampling: list[dict[str, Any]]) -> None:
    """Sampled edges per second per sampler, linear from zero, labelled with the ratio to
    the C++ sampler (a configuration that failed is left out)."""
    sampling = [r for r in sampling if "failed" not in r]
    rates = [r["edges_per_s"] for r in sampling]
    bars = ax.barh([r["sampler"] for r in sampling], rates)
    ax.bar_label(bars, [f"{r['speedup_vs_cpp']:.1f}x C++" for r in sampling],
                 padding=3, fontsize="small")  # fmt: skip
    ax.set(title="sampled edges / s", xlabel="edges / s")
    bar_axis(ax, axis="x", end=HEADROOM * max(rates))


def draw_cache(ax_bytes, ax_hit, runs: list[dict[str, Any]]) -> None:
    """Host->device GB per epoch (plain, Match, Match-Reorder) of the PreSC cache, and the
    hit rate per policy and cache size."""
    presc = [r for r in runs if r["policy"] == "presc"]
    x = np.arange(len(presc))
    for i, (key, name) in enumerate((("h2d_bytes_plain", "plain"), ("h2d_bytes_match", "Match"),
                                     ("h2d_bytes_match_reorder", "Match-Reorder"))):  # fmt: skip
        ax_bytes.bar(x + (i - 1) * 0.27, [r[key] / 1e9 for r in presc], 0.27, label=name)
    ax_bytes.set(title="host->device GB / epoch (presc)", xticks=x,
                 xticklabels=[f"{r['cache_percent']} %" for r in presc])  # fmt: skip
    bar_axis(ax_bytes, end=HEADROOM * max(r["h2d_bytes_plain"] / 1e9 for r in presc))
    ax_bytes.legend(fontsize="small", ncols=3)
    for policy in gpu_features.POLICIES:
        mine = [r for r in runs if r["policy"] == policy]
        ax_hit.plot([r["cache_percent"] for r in mine], [r["hit_rate"] for r in mine],
                    marker="o", label=policy)  # fmt: skip
    ax_hit.set(title="device cache hit rate", xlabel="% of feature rows cached", ylim=(0, 1))
    ax_hit.legend(fontsize="small")


def products_spec(
    nodes: float, avg_degree: float, feat_dim: int, classes: int, train_fraction: float, seed: int
) -> str:
    """The benchmark graph's synthetic spec (``SyntheticConfig.from_spec``): products-shaped,
    half the vertices for testing."""
    return (
        f"shape=products,nodes={int(nodes)},avg_degree={avg_degree},feat_dim={feat_dim},"
        f"classes={classes},train_fraction={train_fraction},test_fraction=0.5,seed={seed}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _C.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    spec = products_spec(args.nodes, args.avg_degree, args.feat_dim, args.classes,
                         args.train_fraction, args.seed)  # fmt: skip
    t0 = time.perf_counter()
    graph = generate(SyntheticConfig.from_spec(spec))
    print(f"graph: {graph.num_nodes} vertices, {graph.indices.size} in-edges "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)  # fmt: skip
    on_gpu = args.device == "cuda"
    result: dict[str, Any] = {
        "benchmark": "gpu",
        "figures": "gpu" if on_gpu else "cpu smoke test: not GPU figures",
        "command": command_line(argv),
        "machine": machine(args.device),
        "dataset": f"synthetic:{spec}",
        "graph": {
            "nodes": graph.num_nodes,
            "in_edges": int(graph.indices.size),
            "feat_dim": args.feat_dim,
            "classes": args.classes,
        },  # fmt: skip
        "model": {
            "model": "sage",
            "layers": len(args.fanouts),
            "hidden": args.hidden,
            "fanout": args.fanouts,
            "batch_size": args.batch_size,
        },  # fmt: skip
    }
    out = args.out if args.out is not None else (RESULTS / "gpu.json" if on_gpu else None)

    def part(key: str, measure: Callable[[], Any]) -> None:
        """``result[key] = measure()``, or where it raises, a record of the failure (the
        other parts still run), or where ``--parts`` leaves it out, a record saying so; the
        JSON so far is written after each part, so that a run stopped at its time limit
        keeps what it measured."""
        if key not in args.parts:
            result[key] = {"skipped": "not among --parts"}
            return
        try:
            result[key] = measure()
        except Exception as exc:  # noqa: BLE001 - recorded, and the benchmark goes on
            traceback.print_exc()
            result[key] = {"failed": f"{type(exc).__name__}: {exc}"}
            print(f"{key}: failed: {result[key]['failed']}", flush=True)
        if out is not None:
            write_json(out, result)

    part("training", lambda: training_runs(args, graph))
    part("precision_sweep", lambda: precision_part(args, graph))
    part("cpp_baseline", lambda: cpp_baseline_part(args, graph))
    part("profile", lambda: profile_part(args, graph))
    if on_gpu:
        part("profile_graphs", lambda: profile_part(args, graph, cuda_graphs=True))
        part(
            "profile_prefetch",
            lambda: profile_part(args, graph, cuda_graphs=True, prefetch=args.prefetch),
        )
        part("profile_gat", lambda: profile_part(args, graph, cuda_graphs=True, model="gat"))
    part("launches_per_iteration", lambda: launches_part(args, graph))
    part("sampling", lambda: sampling_part(args, graph))
    part("cache", lambda: gpu_features.cache_part(args, graph))
    if on_gpu and measured(result, "cache") is not None:
        rows = int(result["cache"]["mean_inputs_per_batch"])
        part("bandwidth", lambda: gpu_features.bandwidth_part(args, graph, rows))
    elif on_gpu:
        result["bandwidth"] = {"skipped": "no cache part to size the gather by"}
    else:
        result["bandwidth"] = {"skipped": "zero-copy bandwidth needs CUDA"}
    result["goals"] = goals(result)
    print(f"goals: {result['goals']}")
    if out is None:
        print("not written: CPU run without --out (results/gpu.json holds GPU figures only)")
        return 0
    write_json(out, result)
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    failed = failed_parts(result)
    if failed:
        print(f"failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
