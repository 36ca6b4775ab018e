"""The collective watchdog's decisions (pure: no MPI, no clock), and that its heartbeats
tell the peers where a rank is as soon as it moves (under mpiexec). Its behaviour in a real
job, a rank stopped by SIGSTOP and a slow but live rank, is tested under mpiexec in
test_distributed.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distmb.comm.watchdog import (
    FOLLOWER_GRACE_HEARTBEATS,
    MAX_HEARTBEAT_S,
    MIN_HEARTBEAT_S,
    SLOWEST_ITERATION_FACTOR,
    UNKNOWN,
    PeerState,
    deadline,
    heartbeat_period,
    judge,
)
from distmb.config.train import TrainConfig

NOW = 1000.0
DEADLINE = 30.0
BEAT = 3.0


def decide(rank, peers, waited, entered=5, can_hear=True):
    return judge(
        rank,
        "gradient allreduce",
        "at epoch 2, iteration 7",
        waited,
        DEADLINE,
        BEAT,
        peers,
        NOW,
        entered,
        DEADLINE,
        can_hear=can_hear,
    )


def fresh(entered=5, waiting=True, epoch=2, iteration=7) -> PeerState:
    return PeerState(NOW - 1.0, entered, waiting, epoch, iteration)


def silent(for_s: float) -> PeerState:
    return PeerState(NOW - for_s, 4, False, 2, 6)


def test_no_verdict_within_the_deadline():
    assert decide(0, {1: silent(1e6)}, waited=DEADLINE - 0.1) is None


def test_a_silent_peer_is_named_and_the_lowest_live_rank_aborts_at_once():
    peers = {1: silent(DEADLINE + 5), 2: fresh()}
    verdict = decide(0, peers, waited=DEADLINE + 1)
    assert verdict.quiet == [1] and verdict.abort
    assert "rank 1 sent no heartbeat for 35.0 s (last heard at epoch 2, iteration 6)" in (
        verdict.message
    )
    assert "rank 2" not in verdict.message and "Aborting the job" in verdict.message


def test_other_live_ranks_wait_for_the_reporter_then_abort_themselves():
    peers = {0: fresh(), 1: silent(DEADLINE + 5)}  # rank 2's view: rank 0 reports
    assert not decide(2, peers, waited=DEADLINE + 1).abort
    late = DEADLINE + FOLLOWER_GRACE_HEARTBEATS * BEAT
    assert decide(2, peers, waited=late).abort


def test_rank_zero_can_be_the_quiet_one():
    verdict = decide(1, {0: silent(DEADLINE + 1), 2: fresh()}, waited=DEADLINE + 1)
    assert verdict.quiet == [0] and verdict.abort  # rank 1 is the lowest live rank


def test_a_slow_live_peer_is_a_warning_not_an_abort():
    peers = {1: fresh(entered=4, waiting=False, iteration=6), 2: fresh()}
    verdict = decide(0, peers, waited=10 * DEADLINE)
    assert not verdict.abort and verdict.quiet == [] and verdict.behind == [1]
    assert verdict.message.startswith("warning:")
    assert "behind: rank 1 (at epoch 2, iteration 6)" in verdict.message


def test_without_thread_multiple_a_long_wait_aborts_without_naming():
    verdict = decide(0, {1: fresh()}, waited=DEADLINE, can_hear=False)
    assert verdict.abort and "MPI_THREAD_MULTIPLE" in verdict.message


def test_deadline_follows_the_slowest_iteration():
    assert deadline(300.0, 1.0) == 300.0
    assert deadline(300.0, 60.0) == pytest.approx(60.0 * SLOWEST_ITERATION_FACTOR)


def test_heartbeat_period_is_clamped():
    assert heartbeat_period(1e-3) == MIN_HEARTBEAT_S
    assert heartbeat_period(1e6) == MAX_HEARTBEAT_S
    assert heartbeat_period(20.0) == pytest.approx(2.0)


def test_the_message_names_where_the_quiet_rank_was_last_heard():
    """A rank stopped by SIGSTOP at epoch 5, iteration 12: the line names that place."""
    verdict = decide(0, {1: PeerState(NOW - DEADLINE - 2, 90, False, 5, 12)}, DEADLINE + 1)
    assert verdict.abort and "(last heard at epoch 5, iteration 12)" in verdict.message


def test_a_move_is_heard_before_the_next_heartbeat_period():
    """Heartbeats go out when the training loop moves on (CollectiveWatchdog.at), not only
    every period: with epochs shorter than the period, the peers used to know a rank only
    "before training". Two ranks, a 2 s period; rank 1 moves to epoch 5, iteration 3, and
    rank 0 hears it within 1 s."""
    local = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(local) if local.exists() else shutil.which("mpiexec")
    if mpiexec is None:
        pytest.fail("mpiexec not found: install the mpich extra (pip install -e '.[mpich]')")
    script = Path(__file__).parent / "mpi_scripts" / "watchdog_position.py"
    proc = subprocess.run(
        [mpiexec, "-n", "2", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "rank 1 last heard at epoch 5, iteration 3"


def test_where_before_training_and_between_epochs():
    assert PeerState(0.0).where() == "before training"
    assert PeerState(0.0, epoch=3, iteration=UNKNOWN).where() == (
        "at epoch 3, before its first iteration"
    )


def test_collective_timeout_flag():
    assert TrainConfig().collective_timeout == 300.0
    from distmb.config.train import parse_config
    from distmb.core.errors import InputError

    assert parse_config(["--collective-timeout", "0"]).collective_timeout == 0.0
    with pytest.raises(InputError, match="--collective-timeout"):
        parse_config(["--collective-timeout", "-1"])
