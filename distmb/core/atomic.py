"""Files written atomically: a temporary file beside the target, fsync, rename, fsync of the
directory. A crash leaves the previous file (or none), never a half-written one; the run that
owns a directory removes the temporaries a killed writer left there. Checkpoints, cache
files, JSON and PNG results and partition stamps all go through :func:`write_atomic`; writers
that need a path (the memory-mapped arrays of ``distmb.predict``) through
:func:`atomic_path`; records appended to a file (``--results``) through :func:`append_whole`.
The temporary of ``NAME`` is ``.NAME.tmp-HOST-PID``
(:func:`~distmb.core.temporaries.temporary_path`); those of dead writers are removed by
:func:`~distmb.core.temporaries.remove_stale_temporaries`.

A write that fails (no space left, a quota, a read-only filesystem, an I/O error: any
:class:`OSError`) raises :class:`~distmb.core.errors.OutputError` naming what was written and
where, after removing the temporary file: the previous file is intact. This is the one place
where the command-line tools' "cannot write ..." errors come from."""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from distmb.core.errors import OutputError, output_error
from distmb.core.temporaries import temporary_path

#: What an output is called in the errors of :func:`write_atomic` when the caller names
#: nothing more precise (``"cannot write file PATH: ..."``).
DEFAULT_WHAT = "file"


def write_atomic(
    path: str | Path, write: Callable[[BinaryIO], None], what: str = DEFAULT_WHAT
) -> None:
    """``write`` into a temporary file beside ``path``, fsync, rename it to ``path``, then
    fsync the directory (so the rename itself survives a power loss): a crash leaves the
    previous file (or none), never a half-written one.

    Args:
        path: the file to write.
        write: writes the whole contents into the binary file object it is given.
        what: what the file is, for the error message (``"checkpoint"``, ``"plot"``).

    Raises:
        OutputError: ``cannot write WHAT PATH: REASON`` for any :class:`OSError` on the way,
            also one that ``write``'s library reported as another exception (``torch.save``
            turns a failed write into a ``RuntimeError``); ``path`` is left as it was.
    """
    with atomic_path(path, what) as tmp, open(tmp, "wb") as file:
        f = _RecordingFile(file)
        try:
            write(f)
        except OSError:
            raise
        except Exception as exc:
            if f.write_failure is None:
                raise
            raise f.write_failure from exc


class _RecordingFile(io.BufferedIOBase):
    """A binary file that keeps the :class:`OSError` of a failed write (:attr:`write_failure`)
    for writers whose library replaces it with another exception (``torch.save``). Writers
    see a plain file object: numpy writes through :meth:`write` rather than behind Python's
    back with ``tofile``, whose short write on a full disk has no ``errno``."""

    def __init__(self, file: BinaryIO) -> None:
        super().__init__()
        self._file = file
        self.write_failure: OSError | None = None

    def write(self, data) -> int:  # noqa: ANN001 - any bytes-like object, as file.write's
        try:
            return self._file.write(data)
        except OSError as exc:
            self.write_failure = exc
            raise

    def flush(self) -> None:
        if not self._file.closed:  # also called when this wrapper is collected
            self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._file.seekable()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()


@contextmanager
def atomic_path(path: str | Path, what: str = DEFAULT_WHAT) -> Iterator[Path]:
    """The temporary path beside ``path`` that the ``with`` block writes by name (for writers
    that need a path, e.g. ``np.lib.format.open_memmap``: see :func:`allocate`). When the
    block ends normally the file is fsynced, renamed to ``path`` and the directory fsynced;
    when it raises, the temporary file is removed and ``path`` is untouched.

    Raises:
        OutputError: ``cannot write WHAT PATH: REASON``: an :class:`OSError` in the block or
            while renaming the file into place.
    """
    path = Path(path)
    if path.exists() and not path.is_file():  # a device or a directory is never replaced
        raise OutputError(f"cannot write {what} {path}: exists and is not a regular file")
    tmp = temporary_path(path)
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            yield tmp
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            _fsync_directory(path.parent)
        except OSError as exc:
            raise output_error(what, path, exc) from exc
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # e.g. the filesystem turned read-only: nothing could be written either


def allocate(path: str | Path) -> None:
    """Allocate every block of the file ``path`` now (``posix_fallocate`` over its size), so
    that a full disk is an :class:`OSError` here rather than a ``SIGBUS`` at the first store
    through a memory map of a sparse file. A filesystem that cannot preallocate is left as
    it is.

    Raises:
        OSError: no space left (or a quota): the file cannot be filled.
    """
    if not hasattr(os, "posix_fallocate"):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size:
            os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    finally:
        os.close(fd)


def append_whole(path: str | Path, data: bytes, what: str = DEFAULT_WHAT) -> None:
    """Append ``data`` to ``path`` (created when missing) whole or not at all: after a failed
    or short write the file is cut back to its previous length, so a full disk never leaves
    half a record behind.

    Raises:
        OutputError: ``cannot write WHAT PATH: REASON``.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        raise output_error(what, path, exc) from exc
    try:
        size = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                written = os.write(fd, view)
                if written == 0:  # a regular file takes at least one byte, or fails
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
        except OSError as exc:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass  # nothing more to do: the error below names the file
            raise output_error(what, path, exc) from exc
    finally:
        os.close(fd)


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
