"""Errors of a multi-rank run's set-up (``distmb.train``, ``distmb.predict``;
:func:`distmb.cli.usage.agree_on_ranks`): one that every rank meets alike is printed once, by
rank 0; one that only some ranks meet is printed by each of them, naming its rank; every rank
exits with the same code, no rank waits."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_distributed import mpirun

from distmb.cli.usage import Outcome, UsageExit, agree_on_ranks
from distmb.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_OUTPUT_FAILED,
    DistmbError,
    InputError,
    OutputError,
)

PROG = "prog"


class ScriptedRanks:
    """Rank ``rank`` of a job whose all-gather returns ``outcomes`` (every rank's, as each
    rank's :func:`agree_on_ranks` would contribute them); checks this rank's contribution."""

    def __init__(self, rank: int, outcomes: list[Outcome]) -> None:
        self.rank = rank
        self.outcomes = outcomes
        self.gathered = 0

    def allgather(self, obj: Any) -> list[Any]:
        assert obj == self.outcomes[self.rank]
        self.gathered += 1
        return list(self.outcomes)


def outcome_of(step: Callable[[], object]) -> Outcome:
    """What a rank running ``step`` contributes (an independent restatement)."""
    try:
        step()
    except InputError as exc:
        return (EXIT_BAD_INPUT, str(exc))
    except OutputError as exc:
        return (EXIT_OUTPUT_FAILED, str(exc))
    return None


def run_ranks(steps: list[Callable[[], object]], capsys) -> list[tuple[object, str, str]]:
    """Every rank's ``agree_on_ranks`` over its step: (result or exit code, stdout, stderr).
    Every rank's ``UsageExit`` carries the lowest failing rank's message."""
    outcomes = [outcome_of(step) for step in steps]
    first_failure = next((outcome for outcome in outcomes if outcome is not None), None)
    seen = []
    for rank, step in enumerate(steps):
        comm = ScriptedRanks(rank, outcomes)
        try:
            result: object = agree_on_ranks(comm, PROG, step)
        except UsageExit as exc:
            assert first_failure is not None and exc.message == first_failure[1]
            result = exc.code
        assert comm.gathered == 1
        out = capsys.readouterr()
        seen.append((result, out.out, out.err))
    return seen


def fail(error: Exception) -> Callable[[], object]:
    def step() -> object:
        raise error

    return step


def test_a_step_that_returns_everywhere_prints_nothing(capsys) -> None:
    seen = run_ranks([lambda: "a", lambda: "b"], capsys)
    assert seen == [("a", "", ""), ("b", "", "")]


def test_an_error_every_rank_meets_alike_is_printed_by_rank_0_alone(capsys) -> None:
    seen = run_ranks([fail(InputError("no such directory"))] * 3, capsys)
    assert seen == [
        (EXIT_BAD_INPUT, "", f"{PROG}: error: no such directory\n"),
        (EXIT_BAD_INPUT, "", ""),
        (EXIT_BAD_INPUT, "", ""),
    ]


def test_an_error_of_one_rank_is_printed_by_it_naming_it(capsys) -> None:
    seen = run_ranks([lambda: 1, fail(OutputError("cannot write x")), lambda: 3], capsys)
    assert seen == [
        (EXIT_OUTPUT_FAILED, "", ""),
        (EXIT_OUTPUT_FAILED, "", f"{PROG}: error: [rank 1] cannot write x\n"),
        (EXIT_OUTPUT_FAILED, "", ""),
    ]


def test_different_errors_are_printed_by_each_rank_with_the_lowest_ones_code(capsys) -> None:
    seen = run_ranks([lambda: 0, fail(InputError("b")), fail(OutputError("c"))], capsys)
    assert seen == [
        (EXIT_BAD_INPUT, "", ""),
        (EXIT_BAD_INPUT, "", f"{PROG}: error: [rank 1] b\n"),
        (EXIT_BAD_INPUT, "", f"{PROG}: error: [rank 2] c\n"),
    ]


def test_a_bug_propagates_before_the_all_gather() -> None:
    comm = ScriptedRanks(0, [None, None])
    with pytest.raises(ZeroDivisionError):
        agree_on_ranks(comm, PROG, lambda: 1 // 0)
    assert comm.gathered == 0  # the launcher aborts the job: nobody is told


# -- under a real mpiexec ------------------------------------------------------------------
#: Flags of a short run (the errors below come before any training).
TRAIN_FLAGS = ["--no-progress", "--layers", "2", "--fanout", "2,2", "--epochs", "1"]
RUN = ["-m", "distmb.train", *TRAIN_FLAGS]


def assert_one_error_line(proc: subprocess.CompletedProcess, line: str) -> None:
    """The job exited with the bad-input code, ``line`` its one error line, no abort, no
    traceback."""
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-2000:]
    assert proc.stderr.count(line) == 1, proc.stderr[-2000:]
    assert proc.stderr.count(": error: ") == 1, proc.stderr[-2000:]
    assert "Abort" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_a_missing_part_dir_is_printed_once_under_mpiexec(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    proc = mpirun(2, [*RUN, "--part-dir", str(missing)], timeout=120)
    assert_one_error_line(
        proc, f"distmb.train: error: {missing}: not a partition directory (no such directory)"
    )
    assert "[rank" not in proc.stderr, proc.stderr[-2000:]


def test_a_file_missing_from_one_part_is_printed_by_its_rank_under_mpiexec(
    tmp_path: Path,
) -> None:
    from distmb.data import load_dataset
    from distmb.partition import partition_graph

    parts = tmp_path / "parts"
    graph = load_dataset("synthetic:nodes=300,avg_degree=4,feat_dim=4,classes=2")
    partition_graph(graph, 2, parts, seed=0)
    (parts / "part-1" / "labels.npy").unlink()
    proc = mpirun(2, [*RUN, "--part-dir", str(parts)], timeout=120)
    assert_one_error_line(proc, f"distmb.train: error: [rank 1] {parts}/part-1/labels.npy: missing")


# -- distmb.predict: every refusal comes from a step that the ranks agree on -----------------
TINY = "synthetic:nodes=300,avg_degree=4,feat_dim=4,classes=2"
#: The same graph's size, with other features: a checkpoint of TINY is refused on it.
OTHER = TINY.replace("feat_dim=4", "feat_dim=8")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """The checkpoint file of one epoch on TINY, on one rank."""
    from distmb.cli.train import main as train_main
    from distmb.engine.checkpoint import CHECKPOINT_FILE

    ckpt = tmp_path_factory.mktemp("ckpt")
    argv = ["--dataset", TINY, "--threads", "1", *TRAIN_FLAGS, "--checkpoint-dir", str(ckpt)]
    assert train_main(argv) == 0
    return ckpt / CHECKPOINT_FILE


@pytest.fixture(scope="module")
def other_parts(tmp_path_factory) -> Path:
    """OTHER in 2 parts."""
    from distmb.data import load_dataset
    from distmb.partition import partition_graph

    parts = tmp_path_factory.mktemp("other") / "p2"
    partition_graph(load_dataset(OTHER), 2, parts, seed=0)
    return parts


class RecordingAgree:
    """An :class:`~distmb.engine.predict.Agree` that runs each step and records the message
    of the :class:`DistmbError` a step raised."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def __call__(self, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except DistmbError as exc:
            self.failures.append(str(exc))
            raise


class CountedRanks:
    """Rank ``rank`` of ``size`` whose collectives are counted and refused: a step that fails
    on this rank alone must fail before any (else the other ranks would wait in it)."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size, self.collectives = rank, size, 0

    def allgather(self, obj: Any) -> list[Any]:
        self.collectives += 1
        raise AssertionError("a collective in a step that fails")

    def barrier(self) -> None:
        self.allgather(None)


def refusal(agree: RecordingAgree, **kwargs: Any) -> str:
    """The message of ``predict(**kwargs)``'s refusal, after checking that it came from a
    step run through ``agree``."""
    from distmb.engine.predict import predict

    with pytest.raises(DistmbError) as info:
        predict(agree=agree, **kwargs)
    assert agree.failures == [str(info.value)]
    return str(info.value)


def test_predict_refuses_only_inside_agreed_steps(
    tiny_checkpoint: Path, other_parts: Path, tmp_path: Path
) -> None:
    out = tmp_path / "file"
    out.write_text("x")
    ckpt = str(tiny_checkpoint)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"checkpoint": tmp_path / "nope"}, "no such file or directory"),
        ({"checkpoint": ckpt, "out": out}, "exists and is not a directory"),
        ({"checkpoint": ckpt, "per_part": True}, "--per-part writes files"),
        ({"checkpoint": ckpt, "dataset": OTHER}, "was trained on 'synthetic' (300 vertices"),
        ({"checkpoint": ckpt, "part_dir": other_parts}, "has 2 parts; a single-rank run"),
    ]
    for kwargs, message in cases:
        assert message in refusal(RecordingAgree(), **kwargs)


def test_predict_on_one_ranks_bad_part_fails_before_any_collective(tiny_checkpoint, tmp_path):
    from distmb.data import load_dataset
    from distmb.partition import partition_graph

    parts = tmp_path / "parts"
    partition_graph(load_dataset(TINY), 2, parts, seed=0)
    (parts / "part-1" / "labels.npy").unlink()
    comm = CountedRanks(1, 2)
    message = refusal(RecordingAgree(), checkpoint=tiny_checkpoint, part_dir=parts, comm=comm)
    assert message.startswith(f"{parts}/part-1/labels.npy: missing")
    assert comm.collectives == 0


def test_a_checkpoint_of_another_graph_is_printed_once_by_predict_under_mpiexec(
    tiny_checkpoint: Path, other_parts: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    argv = ["-m", "distmb.predict", "--checkpoint", str(tiny_checkpoint)]
    proc = mpirun(2, [*argv, "--part-dir", str(other_parts), "--out", str(out)], timeout=120)
    assert_one_error_line(
        proc,
        f"distmb.predict: error: --checkpoint {tiny_checkpoint} was trained on 'synthetic' "
        f"(300 vertices, 4 features, 2 classes, sha256 ",
    )
    assert f"--part-dir {other_parts} is 'synthetic' (300 vertices, 8 features" in proc.stderr
    assert "[rank" not in proc.stderr, proc.stderr[-2000:]
    assert not (out / "predict.json").exists()
