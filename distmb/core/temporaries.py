"""Temporaries named after their writer, and the sweep that removes those of dead writers.

A writer puts what it writes beside its target ``NAME`` under the name
``.NAME.KIND-HOST-PID`` (:func:`temporary_path`): ``KIND`` says what it is (``tmp``: a file or
directory being written, renamed onto ``NAME`` once complete, as every atomic write of
:mod:`~distmb.core.atomic` and the partition writer's directory; ``old``: the partition an
``--overwrite`` moves aside, :mod:`distmb.partition.staging`), ``HOST`` and ``PID`` the
host name and process id of the writer.

A writer killed on the way (``SIGKILL``, a lost node) leaves its temporary behind, possibly
large. :func:`remove_stale_temporaries` removes those whose writer is gone: named after this
host and a process id that no longer exists here. A temporary named after another host is
never judged by this host's process table: its writer may still run there (a filesystem
shared by the nodes of a job). A process id reused since (another process has it now)
keeps a stale temporary until that process ends: the safe direction.

Versions before the host was part of the name wrote ``.NAME.KIND-PID``. Such a host-less
temporary is judged by this host's process table too (``hostless=True``), which is right for
a temporary of this host and wrong for a live writer of an older version on another host
writing into the same directory at the same time. A caller sweeps host-less names only where
no such writer can exist: it holds the directory (a checkpoint directory is swept after its
lock is taken: :mod:`~distmb.core.dirlock`; another run, whichever its host, is refused), or
the directory has one writer at a time by design; other callers pass ``hostless=False``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
from pathlib import Path

from distmb.core.machine import process_alive

#: Kind of a temporary being written (renamed onto its target once complete).
TMP_KIND = "tmp"
#: What every name of kind :data:`TMP_KIND` holds after its target's name (``.NAME.tmp-...``).
TMP_INFIX = f".{TMP_KIND}-"
#: Largest process id a name can carry (``pid_t`` is a signed 32-bit integer); a larger
#: number was written by no process, so the name is no temporary of this scheme.
MAX_PID = 2**31 - 1


def temporary_path(target: str | Path, kind: str = TMP_KIND, pid: int | None = None) -> Path:
    """``.NAME.KIND-HOST-PID`` beside ``target`` (``NAME``: its file name; ``HOST``: this
    host; ``PID``: ``pid``, by default this process's).

    Raises:
        ValueError: ``kind`` is not a short alphanumeric word.
    """
    _check_kind(kind)
    target = Path(target)
    writer = os.getpid() if pid is None else pid
    return target.parent / f".{target.name}.{kind}-{socket.gethostname()}-{writer}"


def remove_stale_temporaries(
    directory: str | Path,
    *,
    name: str | None = None,
    kind: str = TMP_KIND,
    hostless: bool = True,
) -> list[Path]:
    """Delete the temporaries of kind ``kind`` in ``directory`` whose writer is gone (module
    docstring): named after this host and a process id that is no longer alive here (this
    process's own writes in progress are kept). A directory is removed with everything in
    it; one that cannot be removed is left (the caller's write goes on).

    Args:
        directory: where the temporaries lie (beside their targets).
        name: only the temporaries of the target ``name``; None: of every target.
        kind: ``tmp``, ``old``, ... (the ``KIND`` of the name).
        hostless: also judge the host-less names of older versions (``.NAME.KIND-PID``) by
            this host's process ids: only where no writer on another host can be writing
            into ``directory`` now (module docstring).

    Returns:
        The removed paths, sorted.
    """
    _check_kind(kind)
    prefix = "." + ("*" if name is None else glob.escape(name)) + f".{kind}-"
    pattern = _name_pattern(name, kind)
    here = socket.gethostname()
    removed = []
    for path in sorted(Path(directory).glob(prefix + "*")):
        match = pattern.fullmatch(path.name)
        if match is None:
            continue
        host, pid = match["host"], int(match["pid"])
        if (host is None and not hostless) or host not in (None, here) or pid > MAX_PID:
            continue
        if not process_alive(pid) and _remove(path):  # this process's own is alive
            removed.append(path)
    return removed


def _name_pattern(name: str | None, kind: str) -> re.Pattern[str]:
    """``.NAME.KIND-HOST-PID`` or ``.NAME.KIND-PID`` (groups ``host``, None for the latter,
    and ``pid``); ``NAME`` is ``name``, or any non-empty name."""
    target = ".+" if name is None else re.escape(name)
    return re.compile(rf"\.{target}\.{re.escape(kind)}-(?:(?P<host>.+)-)?(?P<pid>[0-9]+)")


def _remove(path: Path) -> bool:
    """Remove ``path`` (a directory with its contents; a link itself, never its target);
    whether it is gone."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass  # left: another write may still succeed beside it
    return not path.is_symlink() and not path.exists()


def _check_kind(kind: str) -> None:
    """:class:`ValueError` unless ``kind`` is an ASCII alphanumeric word (it is parsed back
    out of names)."""
    if not (kind.isascii() and kind.isalnum()):
        raise ValueError(f"temporary kind must be an alphanumeric word like 'tmp', got {kind!r}")
