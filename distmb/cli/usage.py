"""Errors of a multi-rank job that every rank meets, reported once.

Every rank of ``mpiexec -n P`` (or torchrun) parses the same command line, so a bad flag is
met by all of them at once. :func:`parse_on_ranks` parses and validates on every rank with
the output held back, agrees on the outcome in one small collective, and lets one rank (the
lowest that failed: rank 0 when every rank parses alike) print argparse's usage or the
``PROG: error: ...`` line; every rank then exits with that code without aborting the job
(:class:`UsageExit`), so P ranks print one message, not P.

The steps of a run's set-up that follow (checking the outputs, opening the partition,
resolving the device) go through :func:`agree_on_ranks`: each step runs on every rank, one
all-gather of "who failed, with which message" follows it, and the outcome decides who
prints. A failure that every rank met with the same message (the same flags, the same
shared directory) is printed once, by rank 0, as ``PROG: error: MESSAGE``; otherwise (one
rank's part file is missing, a node-local path differs) each rank that failed prints its own
line, ``PROG: error: [rank i] MESSAGE``. Either way every rank knows of the failure and
exits with the same code (the lowest failing rank's), without ``MPI_Abort``. Errors after
the set-up, in training, are one rank's: :func:`distmb.cli.launch.run_on_ranks` prints them
naming the rank and aborts the job.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from distmb.core.errors import DistmbError

if TYPE_CHECKING:
    from distmb.engine.predict import Agree

T = TypeVar("T")


class Ranks(Protocol):
    """What :func:`parse_on_ranks` needs of the job's ranks: this rank and an all-gather
    (a :class:`~distmb.comm.RankGroup`, or mpi4py's ``MPI.COMM_WORLD``)."""

    @property
    def rank(self) -> int: ...

    def allgather(self, obj: Any) -> list[Any]: ...


class UsageExit(SystemExit):
    """Every rank leaves with the same code after an error that every rank knows of and that
    has been reported (a usage error or ``--help``: :func:`parse_on_ranks`; a failed set-up
    step: :func:`agree_on_ranks`): nobody waits in a collective, so the job needs no
    abort.

    Args:
        code: the exit code, the same on every rank.
        message: the error line's message that every rank knows of (after a failed set-up
            step: the lowest failing rank's, without the ``PROG: error:`` prefix), or None.
    """

    def __init__(self, code: int | str | None, message: str | None = None) -> None:
        super().__init__(code)
        self.message = message


def parse_on_ranks(comm: Ranks, prog: str, parse: Callable[[], T]) -> T:
    """``parse()`` on every rank (argparse and the checks that need no data), reported once.

    Args:
        comm: the job's ranks; every rank calls this together (one all-gather).
        prog: the command, as its error lines name it (``prog: error: ...``).
        parse: parses and validates the command line; raises ``SystemExit`` (argparse's
            usage errors and ``--help``) or a :class:`DistmbError` (a bad value).

    Returns:
        What ``parse`` returned, when it returned on every rank.

    Raises:
        UsageExit: ``parse`` failed (or printed ``--help``) on some rank: the lowest such
            rank has printed its output and message, and every rank exits with its code.
    """
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    result: Any = None
    try:
        with redirect_stdout(out), redirect_stderr(err):
            result = parse()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            err.write(exc.code + "\n")
    except DistmbError as exc:
        err.write(f"{prog}: error: {exc}\n")
        code = exc.exit_code
    outcomes = comm.allgather(None if code is None else (code, out.getvalue(), err.getvalue()))
    failed = [(rank, outcome) for rank, outcome in enumerate(outcomes) if outcome is not None]
    if not failed:
        if comm.rank == 0:  # what a successful parse printed (nothing, as a rule)
            sys.stdout.write(out.getvalue())
            sys.stderr.write(err.getvalue())
        return result
    reporter, (first_code, text_out, text_err) = failed[0]
    if comm.rank == reporter:
        sys.stdout.write(text_out)
        sys.stdout.flush()
        sys.stderr.write(text_err)
        sys.stderr.flush()
    raise UsageExit(first_code)


#: What one rank reports of a set-up step to the others: None when the step returned, else
#: ``(exit code, message)`` of its :class:`DistmbError`.
Outcome = tuple[int, str] | None


def agree_on_ranks(comm: Ranks, prog: str, step: Callable[[], T]) -> T:
    """``step()`` on every rank, its :class:`DistmbError` reported once if every rank met the
    same one, else by each rank that met it (module docstring).

    ``step`` must not leave any rank waiting in a collective: it has none, or every rank
    reaches each of its collectives and the errors after them are decided from their
    results (so every rank raises them alike). A step that may fail on one rank before a
    collective would pair that collective with this function's all-gather on the others.

    Args:
        comm: the job's ranks; every rank calls this together (one all-gather).
        prog: the command, as its error lines name it (``prog: error: ...``).
        step: one step of the set-up; raises a :class:`DistmbError` on failure. Any other
            exception propagates at once (a bug: :func:`~distmb.cli.launch.run_on_ranks`
            prints its traceback and aborts the job).

    Returns:
        What ``step`` returned, when it returned on every rank.

    Raises:
        UsageExit: ``step`` failed on some rank; every rank raises it, with the exit code of
            the lowest failing rank, after the failure has been printed.
    """
    outcome: Outcome = None
    result: Any = None
    try:
        result = step()
    except DistmbError as exc:
        outcome = (exc.exit_code, str(exc))
    report_outcomes(comm.rank, prog, comm.allgather(outcome))
    return result


def agree_on(comm: Ranks, prog: str) -> Agree:
    """Runs each set-up step it is given through :func:`agree_on_ranks` on ``comm``'s ranks,
    its failure reported as ``prog``'s: ``agree_on(comm, prog)(step)``."""

    def agree(step: Callable[[], T]) -> T:
        return agree_on_ranks(comm, prog, step)

    return agree


def report_outcomes(rank: int, prog: str, outcomes: list[Outcome]) -> None:
    """Print ``rank``'s share of the failures in ``outcomes`` (every rank's, in rank order) and
    raise :class:`UsageExit`; nothing when no rank failed.

    One failure that every rank met alike is printed by rank 0 alone, without a rank; any
    other failure by the rank that met it, naming it.

    Raises:
        UsageExit: with the exit code and message of the lowest failing rank, on every rank.
    """
    failed = [outcome for outcome in outcomes if outcome is not None]
    if not failed:
        return
    shared = len(failed) == len(outcomes) and len(set(failed)) == 1
    mine = outcomes[rank]
    if shared and rank == 0:
        sys.stderr.write(f"{prog}: error: {failed[0][1]}\n")
    elif not shared and mine is not None:
        sys.stderr.write(f"{prog}: error: [rank {rank}] {mine[1]}\n")
    sys.stderr.flush()
    raise UsageExit(failed[0][0], failed[0][1])
