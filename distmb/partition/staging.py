"""The temporary siblings of a partition directory ``OUT``: ``.OUT.tmp-HOST-PID``, the partition
being written (renamed onto ``OUT`` once complete), and ``.OUT.old-HOST-PID``, the partition
an ``--overwrite`` replaces (deleted once the new one is in place).

A writer killed on the way (``SIGKILL``, a lost node) leaves its sibling behind, possibly
large. The next write to the same ``OUT`` removes the siblings of writers that are gone:
named after this host and a process id that no longer exists here (a sibling of another
host is left alone: its writer may still run there). A ``.old`` sibling is removed only
while ``OUT`` exists: otherwise it holds the only copy of the previous partition.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
from pathlib import Path

from distmb.core.machine import process_alive

#: Kinds of siblings: the partition being written, the one being replaced.
STAGING_KINDS = ("tmp", "old")


def staging_path(out: Path, kind: str, pid: int | None = None) -> Path:
    """``.OUT.KIND-HOST-PID`` beside ``out`` (``kind`` in :data:`STAGING_KINDS`; ``pid``:
    this process by default)."""
    return out.parent / f".{out.name}.{kind}-{socket.gethostname()}-{pid or os.getpid()}"


def _writer_of(suffix: str) -> tuple[str | None, int] | None:
    """``(host, pid)`` from a sibling's ``HOST-PID`` suffix; ``(None, pid)`` for the
    host-less ``PID`` of older versions; None for anything else."""
    if suffix.isdigit():
        return None, int(suffix)
    host, _, pid = suffix.rpartition("-")
    return (host, int(pid)) if host and pid.isdigit() else None


def remove_stale_staging(out: Path) -> list[Path]:
    """Delete the siblings of ``out`` whose writer is gone (module docstring); returns them.
    A sibling that cannot be deleted is left (the write goes on)."""
    here = socket.gethostname()
    removed = []
    for kind in STAGING_KINDS:
        if kind == "old" and not out.exists():
            continue
        prefix = f".{out.name}.{kind}-"
        for path in out.parent.glob(glob.escape(prefix) + "*"):
            writer = _writer_of(path.name[len(prefix) :])
            if writer is None:
                continue
            host, pid = writer
            if host not in (None, here) or pid == os.getpid() or process_alive(pid):
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            if not path.exists():
                removed.append(path)
    return removed
