"""User-facing errors and the one-line error reporting of the command-line tools."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

#: Exit status of a command-line tool that rejects its input (argparse uses the same).
EXIT_BAD_INPUT = 2


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


F = TypeVar("F", bound=Callable[..., int | None])


def exit_on_user_error(prog: str) -> Callable[[F], F]:
    """Decorate a CLI ``main``: a :class:`DistmbError` becomes ``prog: error: msg``, exit 2."""

    def wrap(main: F) -> F:
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except DistmbError as exc:
                print(f"{prog}: error: {exc}", file=sys.stderr)
                raise SystemExit(exc.exit_code) from None
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                raise SystemExit(130) from None

        return run  # type: ignore[return-value]

    return wrap
