"""User-facing errors and the one-line error reporting of the command-line tools."""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import TypeVar

from distmb.core.signals import STOP_SIGNALS, Terminated, stop_line, stop_signals_raise

#: Exit status of a command-line tool that rejects its input (argparse uses the same).
EXIT_BAD_INPUT = 2
#: Exit status of a command-line tool that cannot write an output (a full disk, a quota, a
#: read-only filesystem, an I/O error): sysexits.h's ``EX_IOERR``.
EXIT_OUTPUT_FAILED = 74


class DistmbError(Exception):
    """Base class of errors the CLIs report as one line (no traceback) and exit with
    :attr:`exit_code`."""

    exit_code = EXIT_BAD_INPUT


class InputError(DistmbError, ValueError):
    """A dataset file, flag or argument is missing, malformed or inconsistent.

    The message names the file or flag and states what was expected.
    """


class PartitionError(InputError):
    """A partition directory is missing, incomplete, corrupt or of another format version."""


class OutputError(DistmbError, OSError):
    """An output cannot be written: no space left, a quota, a read-only filesystem, an I/O
    error. The message names what was written and where (:func:`output_error`); the
    writers leave the previous file intact and no temporary file behind
    (:mod:`distmb.core.atomic`). Also an :class:`OSError`, so that a caller for whom the
    write is optional (a verification stamp, a loader's cache) may still ignore it."""

    exit_code = EXIT_OUTPUT_FAILED


def output_error(what: str, path: str | os.PathLike[str], exc: OSError) -> OutputError:
    """The :class:`OutputError` of ``exc`` met while writing ``what`` (``"checkpoint"``,
    ``"results"``, ...) to ``path``: ``cannot write checkpoint ckpt/checkpoint.pt: No space
    left on device``. An :class:`OutputError` already is one and is returned unchanged."""
    if isinstance(exc, OutputError):
        return exc
    reason = exc.strerror or str(exc) or type(exc).__name__
    return OutputError(f"cannot write {what} {os.fspath(path)}: {reason}")


F = TypeVar("F", bound=Callable[..., int | None])


def exit_on_user_error(prog: str) -> Callable[[F], F]:
    """Decorate a CLI ``main``: a :class:`DistmbError` becomes ``prog: error: msg`` (exit
    :attr:`~DistmbError.exit_code`); Ctrl-C and SIGTERM become ``prog: interrupted`` (exit
    130) and ``prog: terminated`` (exit 143), after the stack unwound
    (:mod:`distmb.core.signals`)."""

    def wrap(main: F) -> F:
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                with stop_signals_raise():
                    return main(*args, **kwargs)
            except DistmbError as exc:
                print(f"{prog}: error: {exc}", file=sys.stderr)
                raise SystemExit(exc.exit_code) from None
            except (KeyboardInterrupt, Terminated) as exc:
                signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM
                print(stop_line(prog, signum), file=sys.stderr)
                raise SystemExit(STOP_SIGNALS[signum][1]) from None

        return run  # type: ignore[return-value]

    return wrap
