"""Check a GPU node: what a cluster admin runs on a new node, and what we run whenever a GPU
is at hand. Every log and JSON goes into one folder, with a summary of every step.

    make gpu-check                                    # = python benchmarks/gpu_check.py
    make gpu-check GPU_CHECK_ARGS="--out DIR --quick" # the Makefile passes the flags on
    python benchmarks/gpu_check.py --out DIR --quick  # smaller benchmarks (a few minutes)
    python benchmarks/gpu_check.py --dry-run          # the steps and commands; runs nothing
    python benchmarks/gpu_check.py --no-gpu           # as without a GPU (CI tests this)
    python benchmarks/gpu_check.py --versions         # print the versions, then exit
    # a short lease: the build and the cuda tests, then parts of the benchmark, each capped
    python benchmarks/gpu_check.py --only build,versions,pytest-cuda --timeout-s 200 --out A
    python benchmarks/gpu_check.py --only gpu-benchmark --no-build --timeout-s 420 --out B \
        --benchmark-args "--parts training,precision_sweep,profile_graphs --no-accuracy"

The steps, one after another, each with a timeout (a step that fails or times out is
recorded and the next one runs):

1. ``build``: the extension in place, the sources compiled in parallel (``MAX_JOBS`` =
   ``--jobs``, default one per core; setup.py's ``ParallelCompile``);
2. ``versions``: the device, driver, CUDA, cuDNN, NCCL, torch and Triton versions
   (``nvidia-smi`` and torch), also written to ``versions.json``;
3. ``pytest-cuda``: ``pytest -m cuda`` (in parallel with pytest-xdist where installed);
4. ``gpu-benchmark``: ``benchmarks/gpu.py --device cuda`` (``gpu.json``, ``gpu.png``);
5. ``partition``, ``train-2ranks-mpi``, ``train-2ranks-torch``: a small graph in 2 parts,
   trained by ``mpiexec -n 2 python -m distmb.train --device cuda`` with ``--comm mpi``, then
   ``--comm torch``; on a node with one GPU NCCL refuses two ranks on it, and the torch step
   checks that refusal (its error line) instead;
6. ``out-of-core``: ``benchmarks/out_of_core.py`` on a small graph, its ``--device cuda``
   variant where it has one, else its host variant with the page cache dropped first where
   ``/proc/sys/vm/drop_caches`` is writable;
7. ``nccl-world1``: ``tests/test_nccl.py`` under ``pytest -m cuda``: NCCL at world size 1
   under ``torchrun``.

Without a GPU (or with ``--no-gpu``) the steps that need one are skipped with a "no GPU"
note. The folder (``--out``, default ``gpu-check-HOST-DATE``) holds ``NN-STEP.log`` per step
(its command first), the steps' JSON, ``summary.txt`` and ``summary.json`` (each step's
status, exit code and wall time; rewritten after every step). Exit status: 0 when no step
failed or timed out (skipped steps do not fail), 1 otherwise, 2 for bad flags.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: Exit code recorded for a step stopped at its timeout (as coreutils' ``timeout``).
TIMEOUT_EXIT = 124
#: Exit code recorded for a step whose program does not exist (as a shell's).
NOT_FOUND_EXIT = 127
#: Seconds a timed-out step gets between SIGTERM and SIGKILL.
KILL_GRACE_S = 10.0
#: The note of a step skipped for want of a GPU.
NO_GPU = "skipped: no GPU (torch sees none, or --no-gpu)"
#: The small graph of the two-rank runs.
SMALL_GRAPH = "synthetic:nodes=20000,avg_degree=10,feat_dim=32,classes=8"
#: What ``python -m distmb.train`` says when ranks share a GPU and ``--comm torch`` is asked.
SHARED_GPU_REFUSAL = "NCCL allows one rank per GPU"
#: The page-cache switch written before the host out-of-core benchmark.
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
#: Most pytest-xdist workers sharing the GPU (more gain little: the cuda tests are short).
PYTEST_WORKERS = 6
#: Seconds one cuda test may take (pytest-timeout, where installed).
TEST_TIMEOUT_S = 300
#: The NCCL test run on its own (``pytest-cuda`` leaves it out).
NCCL_TEST = "tests/test_nccl.py"


@dataclass
class Step:
    """One command of the check.

    Attributes:
        name: the step's name (log file, summary).
        command: argv, run in the repository root.
        timeout_s: wall seconds before the step is stopped (SIGTERM, then SIGKILL).
        env: variables added to the environment.
        skip: why the step is not run, or None.
        requires: a step that must have passed first (else this one is skipped).
        expect_error: the step passes when its command fails with this text in its output
            (a refusal that is the documented behaviour), not when it succeeds.
        before: called just before the command; returns a note for the summary, or None.
    """

    name: str
    command: list[str]
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    skip: str | None = None
    requires: str | None = None
    expect_error: str | None = None
    before: Callable[[], str | None] | None = None

    @property
    def shown(self) -> str:
        """The command as a shell line, its added variables first."""
        return " ".join([*(f"{k}={v}" for k, v in self.env.items()), *self.command])


@dataclass
class Outcome:
    """What became of one step: ``status`` is ``ok``, ``failed``, ``timeout``, ``skipped``
    or ``planned`` (``--dry-run``); ``exit_code`` is None when the command did not run."""

    name: str
    status: str
    exit_code: int | None
    wall_s: float
    log: str | None
    note: str
    command: str


FAILED = ("failed", "timeout")


# ---- running ---------------------------------------------------------------------------------


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the step's process group (mpiexec's ranks too), SIGKILL after a grace."""
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(step: Step, log: Path, env: dict[str, str]) -> Outcome:
    """Run ``step`` with its output (stdout and stderr) in ``log``, the command on the
    first line; never raises for the command's failure, timeout or absence."""
    shown = step.shown
    notes = []
    if step.before is not None:
        note = step.before()
        if note:
            notes.append(note)
    start = time.monotonic()
    with log.open("w") as out:
        out.write(f"$ {shown}\n")
        out.flush()
        try:
            proc = subprocess.Popen(
                step.command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                env={**env, **step.env}, start_new_session=True,
            )  # fmt: skip
        except FileNotFoundError:
            notes.append(f"command not found: {step.command[0]}")
            return Outcome(step.name, "failed", NOT_FOUND_EXIT, 0.0, log.name,
                           "; ".join(notes), shown)  # fmt: skip
        try:
            code = proc.wait(timeout=step.timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            notes.append(f"stopped after its timeout of {step.timeout_s:.0f} s")
            return Outcome(step.name, "timeout", TIMEOUT_EXIT, time.monotonic() - start,
                           log.name, "; ".join(notes), shown)  # fmt: skip
    wall = time.monotonic() - start
    status = "ok" if code == 0 else "failed"
    if step.expect_error is not None:
        refused = code != 0 and step.expect_error in log.read_text(errors="replace")
        status = "ok" if refused else "failed"
        notes.append(
            f"expected to stop with {step.expect_error!r}: "
            + ("it did" if refused else "it did not")
        )
    return Outcome(step.name, status, code, wall, log.name, "; ".join(notes), shown)


def run_steps(steps: list[Step], out: Path, env: dict[str, str], dry_run: bool = False,
              header: dict[str, Any] | None = None) -> list[Outcome]:  # fmt: skip
    """Run ``steps`` in order (each whatever became of the ones before, unless it
    ``requires`` one that did not pass), logs in ``out``; the summary is rewritten after
    every step, so a check that is killed leaves the steps it finished."""
    outcomes: list[Outcome] = []
    passed: set[str] = set()
    for i, step in enumerate(steps, start=1):
        shown = step.shown
        skip = step.skip
        if skip is None and step.requires is not None and step.requires not in passed:
            skip = f"skipped: {step.requires} did not pass"
        if skip is not None:
            outcome = Outcome(step.name, "skipped", None, 0.0, None, skip, shown)
        elif dry_run:
            outcome = Outcome(step.name, "planned", None, 0.0, None, "--dry-run", shown)
        else:
            print(f"[{i}/{len(steps)}] {step.name}: {shown}", flush=True)
            outcome = run_step(step, out / f"{i:02d}-{step.name}.log", env)
        if outcome.status in ("ok", "planned"):
            passed.add(step.name)
        outcomes.append(outcome)
        print(summary_line(outcome), flush=True)
        write_summary(out, outcomes, header or {})
    return outcomes


def summary_line(o: Outcome) -> str:
    code = "-" if o.exit_code is None else str(o.exit_code)
    return f"{o.name:<20} {o.status:<8} exit {code:>4} {o.wall_s:8.1f} s  {o.note}".rstrip()


def write_summary(out: Path, outcomes: list[Outcome], header: dict[str, Any]) -> None:
    """``summary.json`` (the header, every outcome, the count of failed steps) and
    ``summary.txt`` (one line per step)."""
    failed = sum(o.status in FAILED for o in outcomes)
    steps = [{**asdict(o), "wall_s": round(o.wall_s, 1)} for o in outcomes]
    record = {**header, "failed": failed, "steps": steps}
    (out / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [f"{k}: {v}" for k, v in header.items()]
    lines += ["", f"{'step':<20} {'status':<8} {'exit code':>9} {'wall':>10}  note"]
    lines += [summary_line(o) for o in outcomes]
    lines += ["", f"{failed} of {len(outcomes)} steps failed"]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")


def exit_status(outcomes: list[Outcome]) -> int:
    """0 when no step failed or timed out, else 1."""
    return int(any(o.status in FAILED for o in outcomes))


# ---- the versions ----------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    """The machine, the GPU(s), driver, CUDA, cuDNN, NCCL, torch and Triton versions."""
    import torch

    facts: dict[str, Any] = {
        "host": socket.gethostname(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError:
        facts["triton"] = None
    if facts["gpus"]:
        facts["devices"] = [
            {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
             "capability": f"{p.major}.{p.minor}"}
            for p in map(torch.cuda.get_device_properties, range(facts["gpus"]))
        ]  # fmt: skip
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    smi = shutil.which("nvidia-smi")
    if smi is None:
        facts["driver"] = None
        facts["nvidia_smi"] = "nvidia-smi not found"
        return facts
    query = subprocess.run(
        [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    lines = query.stdout.strip().splitlines()
    facts["driver"] = lines[0].split(",")[1].strip() if query.returncode == 0 and lines else None
    full = subprocess.run([smi], capture_output=True, text=True, timeout=60, check=False)
    facts["nvidia_smi"] = (full.stdout + full.stderr).strip()
    return facts


def print_versions(path: Path | None) -> int:
    facts = versions()
    for key, value in facts.items():
        if key != "nvidia_smi":
            print(f"{key}: {value}")
    print(facts["nvidia_smi"])
    if path is not None:
        path.write_text(json.dumps(facts, indent=2) + "\n")
    return 0


# ---- the plan --------------------------------------------------------------------------------


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _mpiexec() -> str:
    """The launcher beside this Python (the mpich wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else (shutil.which("mpiexec") or "mpiexec")


def drop_page_cache() -> str:
    """Write back and drop the page cache where this process may; a note either way."""
    if not os.access(DROP_CACHES, os.W_OK):
        return f"page cache not dropped ({DROP_CACHES} is not writable)"
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError as exc:  # e.g. /proc/sys mounted read-only in a container
        return f"page cache not dropped ({DROP_CACHES}: {exc.strerror})"
    return "page cache dropped"


def out_of_core_has_device_variant() -> bool:
    """Whether ``benchmarks/out_of_core.py`` takes ``--device`` (its GPU variant)."""
    return '"--device"' in (HERE / "out_of_core.py").read_text()


def plan(args: argparse.Namespace, gpus: int, out: Path) -> list[Step]:
    """The steps on a node with ``gpus`` GPUs (0: the GPU steps are skipped)."""
    py, cores = sys.executable, args.jobs
    no_gpu = None if gpus else NO_GPU
    work = out / "work"
    pytest = [py, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    if _importable("xdist"):
        workers = max(1, min(PYTEST_WORKERS, cores // 2))
        pytest += ["-n", str(workers), "--dist", "loadfile"]
    if _importable("pytest_timeout"):
        pytest += ["--timeout", str(TEST_TIMEOUT_S)]
    train = [
        "-m", "distmb.train", "--part-dir", str(work / "p2"), "--device", "cuda",
        "--epochs", "2", "--threads", str(max(1, cores // 2)), "--no-progress",
    ]  # fmt: skip
    mpiexec = [_mpiexec(), "-n", "2", py]
    ooc = [py, "benchmarks/out_of_core.py", "--sizes", "10", "--epochs", "2", "--batches",
           "20", "--nodes", "50000" if args.quick else "200000", "--workdir", str(work / "ooc"),
           "--out", str(out / "out_of_core.json")]  # fmt: skip
    device_ooc = out_of_core_has_device_variant()
    if device_ooc:
        ooc += ["--device", "cuda"]
    bench = [py, "benchmarks/gpu.py", "--device", "cuda", "--threads", str(cores),
             "--out", str(out / "gpu.json")] + (["--quick"] if args.quick else [])  # fmt: skip
    bench += shlex.split(args.benchmark_args)
    return [
        Step("build", [py, "setup.py", "build_ext", "--inplace"], 900,
             env={"MAX_JOBS": str(args.jobs)},
             skip="skipped: --no-build" if args.no_build else None),
        Step("versions", [py, str(Path(__file__).resolve()), "--versions",
                          "--versions-json", str(out / "versions.json")], 120),
        Step("pytest-cuda", [*pytest, "--ignore", NCCL_TEST, "--junitxml",
                             str(out / "pytest-cuda.xml")], 1800, skip=no_gpu),
        Step("gpu-benchmark", bench, 1200, skip=no_gpu),
        Step("partition", [py, "-m", "distmb.partition", "--dataset", SMALL_GRAPH, "--parts",
                           "2", "--out", str(work / "p2"), "--overwrite", "--quiet"], 600,
             skip=no_gpu),
        Step("train-2ranks-mpi", [*mpiexec, *train, "--comm", "mpi", "--results",
                                  str(out / "train-2ranks-mpi.jsonl")], 900,
             skip=no_gpu, requires="partition"),
        Step("train-2ranks-torch", [*mpiexec, *train, "--comm", "torch", "--results",
                                    str(out / "train-2ranks-torch.jsonl")], 900,
             skip=no_gpu, requires="partition",
             expect_error=None if gpus >= 2 else SHARED_GPU_REFUSAL),
        Step("out-of-core", ooc, 1800, skip=no_gpu,
             before=None if device_ooc else drop_page_cache),
        Step("nccl-world1", [*pytest, NCCL_TEST, "--junitxml", str(out / "nccl.xml")], 900,
             skip=no_gpu),
    ]  # fmt: skip


#: The steps' names, in order (``--only``).
STEP_NAMES = ("build", "versions", "pytest-cuda", "gpu-benchmark", "partition",
              "train-2ranks-mpi", "train-2ranks-torch", "out-of-core", "nccl-world1")  # fmt: skip


# ---- the command -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=None,
                   help="the folder of every log and JSON (new, or empty); default "
                   "gpu-check-HOST-DATE")  # fmt: skip
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="compile jobs and benchmark threads (default: one per core)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="smaller benchmark graphs")
    p.add_argument("--no-build", action="store_true", help="use the extension as built")
    p.add_argument("--no-gpu", action="store_true", help="skip every step that needs a GPU")
    p.add_argument("--dry-run", action="store_true",
                   help="write the summary of the steps as on a GPU node; run nothing")  # fmt: skip
    p.add_argument("--benchmark-args", default="",
                   help="more flags for benchmarks/gpu.py, one string (e.g. \"--parts "
                   "training,profile_graphs --no-accuracy\": a short GPU lease)")  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=None,
                   help="every step's timeout, seconds (default: each step's own, "
                   "2-30 min)")  # fmt: skip
    p.add_argument("--only", default=None,
                   help=f"comma-separated steps to run, of {','.join(STEP_NAMES)}")  # fmt: skip
    p.add_argument("--keep-work", action="store_true",
                   help="keep OUT/work (the partitions the steps write)")  # fmt: skip
    p.add_argument("--versions", action="store_true", help="print the versions and exit")
    p.add_argument("--versions-json", type=Path, default=None, help="with --versions")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs: expected a positive number of jobs, got {args.jobs}")
    if args.timeout_s is not None and args.timeout_s <= 0:
        p.error(f"--timeout-s: expected a positive number of seconds, got {args.timeout_s}")
    try:
        shlex.split(args.benchmark_args)
    except ValueError as exc:
        p.error(f"--benchmark-args: {exc} in {args.benchmark_args!r}")
    if args.only is not None:
        args.only = args.only.split(",")
        unknown = sorted(set(args.only) - set(STEP_NAMES))
        if unknown:
            p.error(f"--only: unknown step(s) {','.join(unknown)}; expected some of "
                    f"{','.join(STEP_NAMES)}")  # fmt: skip
    if args.out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        args.out = Path(f"gpu-check-{socket.gethostname()}-{stamp}")
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        p.error(f"--out {args.out}: expected a new or empty folder")
    return args


def gpus_seen(no_gpu: bool) -> int:
    if no_gpu:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.versions:
        return print_versions(args.versions_json)
    gpus = gpus_seen(args.no_gpu)
    # A dry run shows the steps of a GPU node, whatever this machine has.
    planned = max(gpus, 1) if args.dry_run and not args.no_gpu else gpus
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    steps = plan(args, planned, out.resolve())
    if args.only is not None:
        steps = [s for s in steps if s.name in args.only]
    if args.timeout_s is not None:
        steps = [replace(s, timeout_s=args.timeout_s) for s in steps]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
    header = {
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "gpus": gpus,
        "mode": "dry run" if args.dry_run else ("no GPU" if not gpus else "GPU"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
    }
    print(f"gpu check: {header['mode']}, {gpus} GPU(s), logs in {out}", flush=True)
    outcomes = run_steps(steps, out, env, dry_run=args.dry_run, header=header)
    if not args.keep_work:
        shutil.rmtree(out / "work", ignore_errors=True)
    print((out / "summary.txt").read_text(), end="")
    return exit_status(outcomes)


if __name__ == "__main__":
    sys.exit(main())
