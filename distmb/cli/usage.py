"""Usage errors of a multi-rank job, reported once.

Every rank of ``mpiexec -n P`` (or torchrun) parses the same command line, so a bad flag is
met by all of them at once. :func:`parse_on_ranks` parses and validates on every rank with
the output held back, agrees on the outcome in one small collective, and lets one rank (the
lowest that failed: rank 0 when every rank parses alike) print argparse's usage or the
``PROG: error: ...`` line; every rank then exits with that code without aborting the job
(:class:`UsageExit`), so P ranks print one message, not P.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from typing import Any, Protocol, TypeVar

from distmb.core.errors import DistmbError

T = TypeVar("T")


class Ranks(Protocol):
    """What :func:`parse_on_ranks` needs of the job's ranks: this rank and an all-gather
    (a :class:`~distmb.comm.RankGroup`, or mpi4py's ``MPI.COMM_WORLD``)."""

    @property
    def rank(self) -> int: ...

    def allgather(self, obj: Any) -> list[Any]: ...


class UsageExit(SystemExit):
    """Every rank leaves with the same code after a usage error (or ``--help``) that one rank
    has reported: nobody waits in a collective, so the job needs no abort."""


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
