"""Files written atomically: a temporary file beside the target, fsync, rename, fsync of the
directory. A crash leaves the previous file (or none), never a half-written one; the run that
owns a directory removes the temporaries a killed writer left there. Checkpoints, cache
files, JSON and PNG results and partition stamps all go through :func:`write_atomic`; writers
that need a path (the memory-mapped arrays of ``distmb.cli.predict``) through
:func:`atomic_path`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

#: Infix of the temporary files :func:`write_atomic` renames into place (``.NAME.tmp-PID``).
TMP_INFIX = ".tmp-"


def write_atomic(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """``write`` into a temporary file beside ``path``, fsync, rename it to ``path``, then
    fsync the directory (so the rename itself survives a power loss): a crash leaves the
    previous file (or none), never a half-written one."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            write(f)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """The temporary path beside ``path`` that the ``with`` block writes by name (for writers
    that need a path, e.g. ``np.lib.format.open_memmap``). When the block ends normally the
    file is fsynced, renamed to ``path`` and the directory fsynced; when it raises, the
    temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}{TMP_INFIX}{os.getpid()}"
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_directory(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def _fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be
    opened, e.g. on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def remove_stale_temporaries(directory: str | Path) -> list[Path]:
    """Delete the temporary files a killed writer left in ``directory`` (``.NAME.tmp-PID``
    whose process is gone); returns them. Called by the run that owns the directory."""
    removed = []
    for path in Path(directory).glob(f".*{TMP_INFIX}*"):
        pid = path.name.rsplit(TMP_INFIX, 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
