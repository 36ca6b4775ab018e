"""``--collective-timeout``: the run's collective watchdog, or a no-op stand-in where it has
none (one rank, no timeout, or ranks without MPI)."""

from __future__ import annotations

from typing import Protocol

from distmb.comm import MpiGroup, RankGroup, SingleProcess
from distmb.comm.watchdog import UNKNOWN, CollectiveWatchdog
from distmb.config.train import TrainConfig


class Watchdog(Protocol):
    """What the training loop tells a watchdog (:class:`CollectiveWatchdog`)."""

    def start(self) -> None:
        """Start watching (every rank, at the same point)."""

    def at(self, epoch: int, iteration: int = UNKNOWN) -> None:
        """Where the loop is, for the messages."""

    def iteration_done(self, seconds: float) -> None:
        """A healthy iteration took ``seconds``."""

    def stop(self) -> None:
        """Stop watching (every rank, at the same point)."""


class NoWatchdog:
    """The watchdog of a run without one: every call does nothing."""

    def start(self) -> None:
        return None

    def at(self, epoch: int, iteration: int = UNKNOWN) -> None:
        return None

    def iteration_done(self, seconds: float) -> None:
        return None

    def stop(self) -> None:
        return None


def collective_watchdog(comm: RankGroup, config: TrainConfig) -> Watchdog:
    """A :class:`CollectiveWatchdog` over ``comm`` with ``--collective-timeout`` seconds when
    several ranks run over MPI and the timeout is set (a collective: every rank constructs it
    at the same point; ``comm`` then marks its collectives for it), else a
    :class:`NoWatchdog`. Its heartbeats travel over MPI: ranks started by torchrun have
    none."""
    if not (isinstance(comm, MpiGroup) and comm.size > 1 and config.collective_timeout):
        return NoWatchdog()
    watchdog = CollectiveWatchdog(comm.comm, config.collective_timeout)  # Dup: collective
    comm.watchdog = watchdog
    return watchdog
