"""benchmarks/gpu_check.py, the GPU node check, on a machine without a GPU: the folder, the
summary and the exit code of a run whose GPU steps are skipped, of a dry run, and of steps
that fail, time out or do not exist (the run goes on and exits non-zero)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402  (benchmarks/ is not a package)

#: The steps that need a GPU.
GPU_STEPS = set(gpu_check.STEP_NAMES) - {"build", "versions"}


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_no_gpu_run_skips_the_gpu_steps_and_passes(tmp_path):
    out = tmp_path / "check"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--no-gpu", "--no-build",
         "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = summary(out)
    assert record["mode"] == "no GPU" and record["gpus"] == 0 and record["failed"] == 0
    steps = {s["name"]: s for s in record["steps"]}
    assert list(steps) == list(gpu_check.STEP_NAMES)
    assert steps["build"]["status"] == "skipped" and "--no-build" in steps["build"]["note"]
    assert steps["versions"]["status"] == "ok" and steps["versions"]["exit_code"] == 0
    for name in GPU_STEPS:
        assert steps[name]["status"] == "skipped" and "no GPU" in steps[name]["note"], name
    # One folder: the versions step's log and JSON, and the summaries; nothing else.
    assert sorted(p.name for p in out.iterdir()) == [
        "02-versions.log", "summary.json", "summary.txt", "versions.json"
    ]  # fmt: skip
    versions = json.loads((out / "versions.json").read_text())
    assert versions["gpus"] == 0 and versions["torch"]
    text = (out / "summary.txt").read_text()
    assert all(name in text for name in gpu_check.STEP_NAMES)
    assert "0 of 9 steps failed" in text and text in proc.stdout


def test_dry_run_plans_every_step_of_a_gpu_node_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "plan"
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 0
    record = summary(out)
    assert record["mode"] == "dry run"
    statuses = {s["name"]: s["status"] for s in record["steps"]}
    assert statuses == {name: "planned" for name in gpu_check.STEP_NAMES}
    commands = {s["name"]: s["command"] for s in record["steps"]}
    assert commands["build"].startswith(f"MAX_JOBS={os.cpu_count()} ")
    assert commands["build"].endswith("setup.py build_ext --inplace")
    assert "-m cuda" in commands["pytest-cuda"] and "--ignore tests/test_nccl.py" in commands[
        "pytest-cuda"
    ]  # fmt: skip
    assert "-n 2" in commands["train-2ranks-mpi"] and "--comm mpi" in commands["train-2ranks-mpi"]
    assert "--comm torch" in commands["train-2ranks-torch"]
    assert "--device cuda" in commands["gpu-benchmark"]
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "summary.txt"]


def test_a_short_lease_passes_benchmark_flags_and_caps_every_step(tmp_path, monkeypatch):
    out = tmp_path / "plan"
    lease = "--parts 'training,profile_gat' --no-accuracy"
    argv = ["--dry-run", "--out", str(out), "--only", "pytest-cuda,gpu-benchmark",
            "--timeout-s", "420", "--benchmark-args", lease]  # fmt: skip
    seen: list[gpu_check.Step] = []
    run_steps = gpu_check.run_steps

    def record(steps, *rest, **options):
        seen.extend(steps)
        return run_steps(steps, *rest, **options)

    monkeypatch.setattr(gpu_check, "run_steps", record)
    assert gpu_check.main(argv) == 0
    assert [s.name for s in seen] == ["pytest-cuda", "gpu-benchmark"]
    assert {s.timeout_s for s in seen} == {420.0}  # every step's own timeout replaced
    steps = summary(out)["steps"]
    bench = next(s["command"] for s in steps if s["name"] == "gpu-benchmark")
    assert bench.endswith("--parts training,profile_gat --no-accuracy")


def test_failed_timed_out_and_missing_steps_do_not_stop_the_run(tmp_path):
    py = sys.executable
    steps = [
        gpu_check.Step("fails", [py, "-c", "print('boom'); raise SystemExit(3)"], 60),
        gpu_check.Step("hangs", [py, "-c", "import time; time.sleep(60)"], 1),
        gpu_check.Step("missing", ["no-such-program-for-gpu-check"], 60),
        gpu_check.Step("after-fails", [py, "-c", "pass"], 60, requires="fails"),
        gpu_check.Step(
            "refused",
            [py, "-c", "raise SystemExit('NCCL allows one rank')"],
            60,
            expect_error="NCCL allows one rank",
        ),  # fmt: skip
        gpu_check.Step("not-refused", [py, "-c", "pass"], 60, expect_error="NCCL"),
        gpu_check.Step("passes", [py, "-c", "print('fine')"], 60, env={"X_GPU_CHECK": "1"}),
    ]
    start = time.monotonic()
    outcomes = gpu_check.run_steps(steps, tmp_path, dict(os.environ))
    assert time.monotonic() - start < 30  # the hanging step was stopped at its timeout
    got = {o.name: (o.status, o.exit_code) for o in outcomes}
    assert got == {
        "fails": ("failed", 3),
        "hangs": ("timeout", gpu_check.TIMEOUT_EXIT),
        "missing": ("failed", gpu_check.NOT_FOUND_EXIT),
        "after-fails": ("skipped", None),
        "refused": ("ok", 1),
        "not-refused": ("failed", 0),
        "passes": ("ok", 0),
    }
    assert gpu_check.exit_status(outcomes) == 1
    assert gpu_check.exit_status([o for o in outcomes if o.status == "ok"]) == 0
    log = (tmp_path / "01-fails.log").read_text().splitlines()
    assert log[0].startswith("$ ") and "raise SystemExit(3)" in log[0] and log[1] == "boom"
    record = summary(tmp_path)
    assert record["failed"] == 4 and [s["name"] for s in record["steps"]] == [s.name for s in steps]
    assert "4 of 7 steps failed" in (tmp_path / "summary.txt").read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "build,nope"], "--only: unknown step(s) nope"),
        (["--jobs", "0"], "--jobs: expected a positive number"),
        (["--timeout-s", "0"], "--timeout-s: expected a positive number of seconds"),
        (["--benchmark-args", "--parts 'a"], "--benchmark-args: No closing quotation"),
    ],
)
def test_bad_flags_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_check.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_used_output_folder_is_refused(tmp_path, capsys):
    (tmp_path / "old.log").write_text("x")
    with pytest.raises(SystemExit) as exc:
        gpu_check.parse_args(["--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "expected a new or empty folder" in capsys.readouterr().err
