"""Ending a command on SIGINT (Ctrl-C) or SIGTERM: one line (``PROG: interrupted`` or
``PROG: terminated``), exit status ``128 + signal`` (130, 143), no traceback.

- **One process** (:func:`stop_signals_raise`): SIGINT raises :class:`KeyboardInterrupt` and
  SIGTERM :class:`Terminated` in the main thread, so the stack unwinds (``finally`` blocks
  remove their temporary files) and the command's error handling prints the line
  (:func:`distmb.core.errors.exit_on_user_error`).
- **One rank of several** (:func:`end_job_on_stop_signal`): unwinding cannot work there, because
  a rank inside a collective (``MPI_Allreduce``) runs no Python code until the collective
  returns, which it never does once a peer has left. A watcher thread wakes instead (the
  signal's C handler writes its number to a pipe, :func:`signal.set_wakeup_fd`, while the main
  thread may be blocked), writes the line and ends the process with the status, without
  unwinding; the launcher (MPICH's hydra, torchrun) then ends the other ranks. ``mpiexec``
  forwards Ctrl-C and SIGTERM to every rank: rank 0 writes the line at once, the other ranks
  wait :data:`LINE_GRACE_S` for the job to end first, so one line is written, rank 0's. A
  signal sent to one rank other than 0 alone is reported by that rank, after that wait
  (``PROG: interrupted (rank 1)``); under torchrun, which signals every worker itself and
  names the failed ranks, only rank 0 writes it. Files are written atomically
  (:mod:`distmb.core.atomic`), so results and checkpoints are whole or absent; a temporary
  file left by the exit is removed by the next run that writes into its directory.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

#: Exit status after SIGINT (Ctrl-C): ``128 + SIGINT``, the shell's convention.
EXIT_INTERRUPTED = 128 + signal.SIGINT
#: Exit status after SIGTERM: ``128 + SIGTERM``.
EXIT_TERMINATED = 128 + signal.SIGTERM

#: The signals that end a command: what its line says, and its exit status.
STOP_SIGNALS: dict[int, tuple[str, int]] = {
    signal.SIGINT: ("interrupted", EXIT_INTERRUPTED),
    signal.SIGTERM: ("terminated", EXIT_TERMINATED),
}

#: Seconds a rank other than 0 waits after a stop signal before it writes the line and ends
#: the job itself: the launcher forwards the signal to rank 0 as well, whose line comes first
#: and whose exit ends this rank.
LINE_GRACE_S = 0.5


#: Whether :func:`end_job_on_stop_signal`'s watcher runs in this process.
_watching = False
#: Set by the watcher once a stop signal has arrived (it is ending the process).
_stopping = threading.Event()


class Terminated(BaseException):
    """SIGTERM, raised in the main thread while :func:`stop_signals_raise` is in force (the
    counterpart of :class:`KeyboardInterrupt` for SIGINT; a ``BaseException``, so that no
    ``except Exception`` swallows it)."""


def stop_line(prog: str, signum: int, rank: int = 0) -> str:
    """The one line a command ends with: ``PROG: interrupted`` (SIGINT) or ``PROG:
    terminated`` (SIGTERM); a rank other than 0 adds itself (``(rank 2)``)."""
    name, _ = STOP_SIGNALS[signum]
    return f"{prog}: {name}" + (f" (rank {rank})" if rank else "")


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (SIGINT raises
    :class:`KeyboardInterrupt` as always). A no-op outside the main thread or where SIGTERM
    already has a handler of its own (:func:`end_job_on_stop_signal`'s, an embedding
    program's); the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The main thread's handler while the watcher thread ends the job."""


def end_job_on_stop_signal(
    prog: str, rank: int, grace_s: float = LINE_GRACE_S, *, lone_line: bool = True
) -> None:
    """From now on, SIGINT or SIGTERM ends this rank of a multi-rank job (module docstring):
    rank 0 writes :func:`stop_line` at once, another rank after ``grace_s`` seconds, then the
    process exits with :data:`EXIT_INTERRUPTED` or :data:`EXIT_TERMINATED` (``os._exit``: no
    unwinding, no ``MPI_Finalize``). Call it from the main thread; a second call does
    nothing.

    Args:
        lone_line: whether a rank other than 0 writes the line after ``grace_s`` (for a
            signal sent to it alone). False under torchrun, which signals every worker and
            waits for them, and names the ranks that failed itself: rank 0's line is the
            one line there.
    """
    global _watching
    if _watching:
        return
    _watching = True
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _ignore)  # the C handler still writes the number to the pipe
    watcher = threading.Thread(
        target=_watch,
        args=(read_fd, prog, rank, grace_s, lone_line),
        name="distmb-signals",
        daemon=True,
    )
    watcher.start()


def _watch(read_fd: int, prog: str, rank: int, grace_s: float, lone_line: bool) -> None:
    """The watcher thread: wait for a stop signal's number on ``read_fd``, then end."""
    while True:
        received = [n for n in os.read(read_fd, 64) if n in STOP_SIGNALS]
        if received:
            break
    signum = received[0]
    _stopping.set()
    if rank != 0:
        time.sleep(grace_s)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing more can be written to it
    if rank == 0 or lone_line:
        os.write(2, (stop_line(prog, signum, rank) + "\n").encode())
    os._exit(STOP_SIGNALS[signum][1])


def wait_if_stopping() -> None:
    """Block for good when a stop signal is ending this process (the watcher exits it): an
    error that the stop caused (a peer gone, a collective broken) is then not reported as
    one. Returns at once otherwise."""
    if _stopping.is_set():
        while True:
            time.sleep(1.0)
