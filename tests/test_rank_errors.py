"""Errors of a multi-rank run's set-up (:func:`distmb.cli.usage.agree_on_ranks`): one that
every rank meets alike is printed once, by rank 0; one that only some ranks meet is printed by
each of them, naming its rank; every rank exits with the same code, no rank waits."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_distributed import mpirun

from distmb.cli.usage import Outcome, UsageExit, agree_on_ranks
from distmb.core.errors import EXIT_BAD_INPUT, EXIT_OUTPUT_FAILED, InputError, OutputError

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
RUN = ["-m", "distmb.train", "--no-progress", "--layers", "2", "--fanout", "2,2", "--epochs", "1"]


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
