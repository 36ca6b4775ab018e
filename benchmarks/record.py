"""What every benchmark writes beside its numbers: the command that repeats the run, as a reader
of the repository would type it (``python benchmarks/NAME.py ARGS``, paths relative to the
repository root, never this machine's checkout or interpreter)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

#: The repository root (this file is ``benchmarks/record.py``).
REPO = Path(__file__).resolve().parents[1]


def command_line(argv: list[str] | None = None, script: str | None = None) -> str:
    """``python <script relative to the repository> <args>`` of this process.

    Args:
        argv: the arguments after the script (default: ``sys.argv[1:]``).
        script: the script's path (default: ``sys.argv[0]``); made relative to the repository
            when it lies inside it, else reduced to its file name.
    """
    path = Path(script if script is not None else sys.argv[0]).resolve()
    try:
        shown = path.relative_to(REPO).as_posix()
    except ValueError:
        shown = path.name
    args = sys.argv[1:] if argv is None else argv
    return " ".join(shlex.quote(a) for a in ["python", shown, *args])
