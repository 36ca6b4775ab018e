"""An output directory held by one run: an advisory lock (``flock``) on a lock file in it.

A run takes the lock of its ``--checkpoint-dir`` before it looks inside and keeps it until it
ends; a second run (another process, here or on another node of a shared filesystem that
supports ``flock``) on the same directory is refused with one line naming the holder, whose
process id, host and start time the lock file records. The kernel releases the lock when
its process ends, however it ends (a crash, ``SIGKILL``), so the lock file a dead run leaves
behind locks nothing: only a held lock refuses. One process may hold a directory several
times (a run built twice in one Python session); it is released when the process ends, or
by :func:`release_directory`.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from distmb.core.errors import InputError, output_error

#: Name of the lock file inside a held directory.
LOCK_FILE = ".distmb.lock"

#: ``errno`` values of a lock held by another process.
_HELD_ERRNOS = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)

#: Directories this process holds: resolved path -> the open lock file's descriptor.
_held: dict[Path, int] = {}


class DirectoryInUse(InputError):
    """Another live process holds the directory (:func:`hold_directory`)."""


def hold_directory(directory: str | Path, flag: str) -> bool:
    """Take ``directory``'s lock for this process (a no-op when it already holds it).

    Args:
        directory: an existing directory.
        flag: the option that named it, for the error (``"--checkpoint-dir"``).

    Returns:
        True when the directory is held; False when its filesystem has no ``flock``
        (``ENOLCK``, ``EOPNOTSUPP``, ...): the run goes on unprotected.

    Raises:
        DirectoryInUse: another process holds it: ``FLAG DIR is in use by another run (pid
            P on host H, since T)``.
    """
    key = Path(directory).resolve()
    if key in _held:
        return True
    path = key / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise InputError(f"{flag} {directory}: cannot create {LOCK_FILE} ({exc})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _read_holder(fd)
        os.close(fd)
        if exc.errno in _HELD_ERRNOS:
            raise DirectoryInUse(
                f"{flag} {directory} is in use by another run ({holder}); wait for it to end, "
                "or give this run another directory"
            ) from None
        return False
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError as exc:  # a full disk: one line now, not at the first checkpoint
        os.close(fd)
        raise output_error("lock file", path, exc) from exc
    _held[key] = fd
    return True


def release_directory(directory: str | Path) -> None:
    """Release this process's hold on ``directory`` (nothing when it holds none). The lock
    file stays: without a holder it locks nothing."""
    fd = _held.pop(Path(directory).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor releases the flock


def _read_holder(fd: int) -> str:
    """``pid P on host H, since T`` from an open lock file (``holder unknown`` while the
    holder has not written it yet, or when it is not ours)."""
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode())
        return f"pid {record['pid']} on host {record['host']}, since {record['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def _now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
