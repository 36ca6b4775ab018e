"""A watchdog for collectives: a rank that went quiet aborts the job instead of hanging it.

Without it, a stopped rank (``SIGSTOP``, a wedged node, a lost network link) leaves every
other rank waiting inside a collective forever, spinning at 100 % CPU: MPI has no timeout.

How it works (one :class:`CollectiveWatchdog` per rank, multi-rank runs only):

- Every rank's watchdog thread sends a tiny **heartbeat** to every peer every
  ``heartbeat_s`` seconds on its own duplicated communicator (a side channel that works while
  the main thread sits in a collective; it needs ``MPI_THREAD_MULTIPLE``). A heartbeat carries
  how many watched collectives the sender has entered, whether it is waiting in one now, and
  its epoch and iteration. When the training loop moves on (:meth:`CollectiveWatchdog.at`),
  a heartbeat goes out at once (at most one per :data:`MIN_HEARTBEAT_S`), so the peers know
  where a rank was when it went quiet even when epochs are shorter than the period.
- The main thread marks each watched collective (:meth:`CollectiveWatchdog.watch`, used by
  :class:`distmb.comm.MpiGroup` itself, so call sites stay as they are).
- When this rank has waited in one collective longer than the **deadline**, the larger of
  ``--collective-timeout`` and :data:`SLOWEST_ITERATION_FACTOR` times the slowest healthy
  iteration seen so far, the watchdog looks at its peers: a peer whose last heartbeat is older
  than the deadline **went quiet** (stopped, or its node or link is gone), and the job is
  aborted (``MPI_Abort``, exit code :data:`WATCHDOG_EXIT_CODE`) with one line naming it. Peers
  that still send heartbeats are alive: a rank that is merely slow (a long evaluation, a
  checkpoint on a slow file system) is reported with a warning, never killed.

The lowest-numbered rank that still hears nothing from the quiet ones prints and aborts; the
others abort :data:`FOLLOWER_GRACE_HEARTBEATS` heartbeats later if the job is still alive.
Where MPI gives less than ``MPI_THREAD_MULTIPLE`` no heartbeats can be sent: the watchdog then
aborts any wait longer than the deadline and says it cannot tell which rank went quiet.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

#: Seconds a collective of a torchrun job may wait for a peer before it fails the job
#: (:class:`distmb.comm.TorchGroup`; torch's own default). Long, because every rank
#: waits in one while rank 0 partitions ``--dataset``: a rank that *dies* ends the job at
#: once (torchrun stops the others), this bounds only one that stops without dying.
TORCHRUN_TIMEOUT_S = 1800.0

#: Default of ``--collective-timeout`` (seconds).
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0

__all__ = [
    "DEFAULT_COLLECTIVE_TIMEOUT_S",
    "CollectiveWatchdog",
    "PeerState",
    "Verdict",
    "deadline",
    "heartbeat_period",
    "judge",
]

#: The deadline is at least this many times the slowest iteration seen so far.
SLOWEST_ITERATION_FACTOR = 10.0
#: Heartbeats per deadline: a peer must miss this many in a row to be called quiet.
HEARTBEATS_PER_DEADLINE = 10
#: Bounds of the heartbeat period, in seconds.
MIN_HEARTBEAT_S = 0.05
MAX_HEARTBEAT_S = 10.0
#: Heartbeats a rank that is not the reporter waits, past the deadline, for the reporter's
#: abort before it aborts the job itself.
FOLLOWER_GRACE_HEARTBEATS = 3
#: Heartbeats still unsent to a peer (its process stopped receiving) after which no more
#: are queued to it.
MAX_PENDING_PER_PEER = 64
#: Exit code of a job the watchdog aborts.
WATCHDOG_EXIT_CODE = 75
#: Seconds between printing the abort line and ``MPI_Abort``: the launcher forwards a rank's
#: stderr through its proxies, and an abort racing that forward loses the line (seen under
#: load with MPICH's hydra).
ABORT_LINE_GRACE_S = 0.5
#: Tag of heartbeat messages on the watchdog's own communicator.
HEARTBEAT_TAG = 7001
#: Fields of a heartbeat: int64[HEARTBEAT_FIELDS].
HEARTBEAT_FIELDS = 5
#: ``entered`` field of the last message a rank sends when its watchdog stops.
GOODBYE = -1
#: Epoch or iteration not known yet (before the first training iteration).
UNKNOWN = -1


def heartbeat_period(timeout_s: float) -> float:
    """Seconds between heartbeats for a ``timeout_s`` deadline (clamped)."""
    return min(MAX_HEARTBEAT_S, max(MIN_HEARTBEAT_S, timeout_s / HEARTBEATS_PER_DEADLINE))


def deadline(timeout_s: float, slowest_iteration_s: float) -> float:
    """Seconds a wait in one collective may last: ``--collective-timeout``, or
    :data:`SLOWEST_ITERATION_FACTOR` times the slowest iteration so far when that is longer
    (a run whose iterations take minutes is not judged by a timeout meant for seconds)."""
    return max(timeout_s, SLOWEST_ITERATION_FACTOR * slowest_iteration_s)


@dataclass
class PeerState:
    """What this rank last heard from one peer (times from ``time.monotonic``)."""

    last_heard: float
    entered: int = 0
    waiting: bool = False
    epoch: int = UNKNOWN
    iteration: int = UNKNOWN

    def where(self) -> str:
        return where(self.epoch, self.iteration)


def where(epoch: int, iteration: int) -> str:
    """``at epoch 2, iteration 40`` (or before training / before an epoch's first iteration)."""
    if epoch == UNKNOWN:
        return "before training"
    if iteration == UNKNOWN:
        return f"at epoch {epoch}, before its first iteration"
    return f"at epoch {epoch}, iteration {iteration}"


@dataclass
class Verdict:
    """The watchdog's decision about one long wait."""

    #: Peers silent for longer than the deadline.
    quiet: list[int]
    #: Peers alive but behind this rank (fewer collectives entered, or not waiting).
    behind: list[int]
    #: Whether this rank aborts now (it is the reporter, or the reporter's grace has passed).
    abort: bool
    #: The line to print.
    message: str


def judge(
    rank: int,
    collective: str,
    here: str,
    waited_s: float,
    deadline_s: float,
    heartbeat_s: float,
    peers: dict[int, PeerState],
    now: float,
    entered: int,
    timeout_flag: float,
    can_hear: bool = True,
) -> Verdict | None:
    """Decide about a wait of ``waited_s`` seconds in ``collective`` (pure: no MPI, no clock).

    Returns None while ``waited_s`` is within ``deadline_s``; otherwise who went quiet, who
    is behind, whether this rank aborts, and the message.
    """
    if waited_s < deadline_s:
        return None
    head = (
        f"collective watchdog: rank {rank} has waited {waited_s:.1f} s in {collective} "
        f"({here}; deadline {deadline_s:.1f} s from --collective-timeout {timeout_flag:g} "
        "and the slowest iteration)"
    )
    if not can_hear:
        return Verdict(
            [],
            [],
            True,
            f"{head}; MPI gives less than MPI_THREAD_MULTIPLE here, so no heartbeats tell which "
            "rank went quiet. Aborting the job.",
        )
    quiet = sorted(p for p, s in peers.items() if now - s.last_heard > deadline_s)
    behind = sorted(
        p for p, s in peers.items() if p not in quiet and (s.entered < entered or not s.waiting)
    )
    if not quiet:
        names = ", ".join(f"rank {p} ({peers[p].where()})" for p in behind) or "none"
        return Verdict(
            [],
            behind,
            False,
            f"warning: {head}; every peer still sends heartbeats (alive), behind: {names}. "
            "Not aborting: a slow rank is not a stopped one.",
        )
    described = "; ".join(
        f"rank {p} sent no heartbeat for {now - peers[p].last_heard:.1f} s "
        f"(last heard {peers[p].where()})"
        for p in quiet
    )
    reporter = min(r for r in [rank, *peers] if r not in quiet)
    grace = FOLLOWER_GRACE_HEARTBEATS * heartbeat_s
    abort = rank == reporter or waited_s >= deadline_s + grace
    return Verdict(
        quiet,
        behind,
        abort,
        f"{head}; {described}: stopped, or its node or link is gone. Aborting the job "
        f"(exit code {WATCHDOG_EXIT_CODE}).",
    )


class CollectiveWatchdog:
    """Heartbeats to every peer and a deadline on every watched collective (see the module).

    Construct it on every rank at the same point (it duplicates ``comm``: a collective);
    :meth:`start` the thread, mark collectives with :meth:`watch`, report iteration times with
    :meth:`iteration_done`, and :meth:`stop` on every rank at the same point (a goodbye
    exchange, so no heartbeat is left unreceived).

    Args:
        comm: an ``mpi4py`` communicator (``MpiGroup.comm``).
        timeout_s: ``--collective-timeout``, seconds (> 0).
        log: prints one line (stderr by default).
        abort: ends the job (default: ``MPI_Abort`` on ``comm`` with
            :data:`WATCHDOG_EXIT_CODE`).
    """

    def __init__(
        self,
        comm,
        timeout_s: float,
        *,
        log: Callable[[str], None] | None = None,
        abort: Callable[[], None] | None = None,
    ) -> None:
        from mpi4py import MPI

        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._MPI = MPI
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.timeout_s = float(timeout_s)
        self.heartbeat_s = heartbeat_period(self.timeout_s)
        self.can_hear = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._world = comm
        self._channel = comm.Dup()  # collective: every rank constructs the watchdog together
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._abort = abort or self._mpi_abort
        now = time.monotonic()
        self.peers = {p: PeerState(now) for p in range(self.size) if p != self.rank}
        self.entered = 0
        self.slowest_iteration_s = 0.0
        self.epoch = UNKNOWN
        self.iteration = UNKNOWN
        self._waiting: tuple[str, float] | None = None
        self._depth = 0
        self._warned_at = 0.0
        self._pending: dict[int, list] = {p: [] for p in self.peers}
        self._stop = threading.Event()
        #: Set by :meth:`at` (and to stop): wakes the thread for a heartbeat.
        self._moved = threading.Event()
        self._thread: threading.Thread | None = None

    # -- main thread ---------------------------------------------------------------------------

    def _mpi_abort(self) -> None:
        """``MPI_Abort`` the job, after :data:`ABORT_LINE_GRACE_S` for the line to get out."""
        time.sleep(ABORT_LINE_GRACE_S)
        self._world.Abort(WATCHDOG_EXIT_CODE)

    def start(self) -> None:
        """Start heartbeats and deadline checks (a daemon thread)."""
        if self._thread is None:
            now = time.monotonic()  # peers start their heartbeats about now too
            for peer in self.peers.values():
                peer.last_heard = now
            self._thread = threading.Thread(target=self._run, name="distmb-watchdog", daemon=True)
            self._thread.start()

    @contextmanager
    def watch(self, collective: str) -> Iterator[None]:
        """Mark the main thread as waiting in ``collective`` (nested marks count once)."""
        self._depth += 1
        if self._depth == 1:
            self.entered += 1
            self._waiting = (collective, time.monotonic())
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._waiting = None

    def at(self, epoch: int, iteration: int = UNKNOWN) -> None:
        """Where the main thread is, for the messages (ours and our heartbeats'): a
        heartbeat carrying it leaves within :data:`MIN_HEARTBEAT_S`."""
        self.epoch, self.iteration = epoch, iteration
        self._moved.set()

    def iteration_done(self, seconds: float) -> None:
        """A healthy iteration took ``seconds``: the deadline is at least
        :data:`SLOWEST_ITERATION_FACTOR` times the slowest."""
        self.slowest_iteration_s = max(self.slowest_iteration_s, float(seconds))

    def deadline_s(self) -> float:
        return deadline(self.timeout_s, self.slowest_iteration_s)

    def stop(self) -> None:
        """Stop the thread, then say goodbye to every peer and receive every peer's
        heartbeats up to its goodbye (every rank calls this at the same point)."""
        if self._thread is None:
            return
        self._stop.set()
        self._moved.set()
        self._thread.join()
        self._thread = None
        MPI = self._MPI
        requests = [r for pending in self._pending.values() for r in pending]
        if self.can_hear:
            for peer in self.peers:
                requests.append(self._send(peer, goodbye=True))
            buf = np.empty(HEARTBEAT_FIELDS, dtype=np.int64)
            for peer in self.peers:  # messages from one peer arrive in order: goodbye is last
                while True:
                    self._channel.Recv(buf, source=peer, tag=HEARTBEAT_TAG)
                    if buf[0] == GOODBYE:
                        break
        MPI.Request.Waitall(requests)
        self._pending = {p: [] for p in self.peers}

    def close(self) -> None:
        """Stop the thread without the goodbye exchange (this rank is leaving on an error;
        the peers' watchdogs will notice)."""
        self._stop.set()
        self._moved.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- watchdog thread -------------------------------------------------------------------
    def _send(self, peer: int, *, goodbye: bool = False):
        message = np.array(
            [
                GOODBYE if goodbye else self.entered,
                int(self._waiting is not None),
                self.epoch,
                self.iteration,
                self.rank,
            ],
            dtype=np.int64,
        )
        return self._channel.Isend(message, dest=peer, tag=HEARTBEAT_TAG)

    def _beat(self) -> None:
        for peer, pending in self._pending.items():
            pending[:] = [r for r in pending if not r.Test()]
            if len(pending) < MAX_PENDING_PER_PEER:
                pending.append(self._send(peer))

    def _listen(self) -> None:
        MPI = self._MPI
        status = MPI.Status()
        buf = np.empty(HEARTBEAT_FIELDS, dtype=np.int64)
        while self._channel.Iprobe(source=MPI.ANY_SOURCE, tag=HEARTBEAT_TAG, status=status):
            source = status.Get_source()
            self._channel.Recv(buf, source=source, tag=HEARTBEAT_TAG)
            peer = self.peers[source]
            peer.last_heard = time.monotonic()
            if buf[0] != GOODBYE:
                peer.entered, peer.waiting = int(buf[0]), bool(buf[1])
                peer.epoch, peer.iteration = int(buf[2]), int(buf[3])

    def _check(self) -> bool:
        """Returns True when the job is being aborted."""
        waiting = self._waiting
        if waiting is None:
            return False
        collective, since = waiting
        now = time.monotonic()
        verdict = judge(
            self.rank,
            collective,
            where(self.epoch, self.iteration),
            now - since,
            self.deadline_s(),
            self.heartbeat_s,
            self.peers,
            now,
            self.entered,
            self.timeout_s,
            can_hear=self.can_hear,
        )
        if verdict is None:
            return False
        if verdict.abort:
            self._log(f"distmb: {verdict.message}")
            self._abort()
            return True
        if not verdict.quiet and now - self._warned_at >= self.deadline_s():
            self._warned_at = now
            self._log(f"distmb: {verdict.message}")
        return False

    def _run(self) -> None:
        """Heartbeat, listen and check every ``heartbeat_s`` seconds, and at once when the
        main thread moves on (:meth:`at`), but never twice within :data:`MIN_HEARTBEAT_S`."""
        while True:
            self._moved.clear()  # a move from here on is in this heartbeat or wakes the next
            if self.can_hear:
                self._beat()
                self._listen()
            if self._check() or self._stop.wait(MIN_HEARTBEAT_S):
                return
            self._moved.wait(max(0.0, self.heartbeat_s - MIN_HEARTBEAT_S))
            if self._stop.is_set():
                return
