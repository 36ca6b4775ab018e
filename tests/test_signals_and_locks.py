"""Nothing silent, nothing noisy: Ctrl-C and SIGTERM under a real ``mpiexec -n 2`` and on one
rank end the run with one line and exit 130 / 143 (no tracebacks); a run holds its
``--checkpoint-dir`` (a second run on it is refused, naming the holder; the lock file of a
dead run locks nothing); ``best.pt`` alone counts as a checkpoint; ``--no-verify`` still
range-checks a partition's ids."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import FAST_FLAGS, SMALL, run_train_cli
from test_distributed import mpiexec

from distmb.cli.train import PROG
from distmb.core.dirlock import LOCK_FILE, DirectoryInUse, hold_directory, release_directory
from distmb.core.errors import InputError
from distmb.data import load_dataset
from distmb.engine.checkpoint import BEST_FILE, CHECKPOINT_FILE, read_checkpoint
from distmb.engine.outputs import prepare_checkpoint_dir
from distmb.partition import partition_graph

#: A run that trains until it is stopped: tiny epochs, one thread, no evaluation.
ENDLESS = [
    *FAST_FLAGS, "--threads", "1", "--epochs", "100000", "--eval-every", "100000",
]  # fmt: skip
#: Seconds a test waits for a run to print its first epoch line, and then for it to end.
START_TIMEOUT_S = 60.0
END_TIMEOUT_S = 30.0


def _start(cmd: list[str]) -> subprocess.Popen:
    """Start ``cmd`` (its own session, so a stray process can be killed as a group) and
    return once it has printed an epoch line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    seen = b""
    deadline = time.monotonic() + START_TIMEOUT_S
    while b"\nepoch " not in seen and not seen.startswith(b"epoch "):
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk or time.monotonic() > deadline:
            _kill(proc)
            pytest.fail(f"no epoch line: {seen[-2000:]!r} {proc.stderr.read()[-2000:]!r}")
        seen += chunk
    return proc


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    """Wait for ``proc`` to end: (exit status, stderr)."""
    try:
        _, err = proc.communicate(timeout=END_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill(proc)
        pytest.fail("the run did not end after the signal")
    return proc.returncode, err.decode()


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def _rank_pid(launcher: int, rank: int) -> int:
    """The pid of ``rank`` among the descendants of the launcher ``launcher`` (its
    ``PMI_RANK``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if f"PMI_RANK={rank}".encode() in environ and _descends(int(entry.name), launcher):
                return int(entry.name)
        except OSError:
            continue
    pytest.fail(f"rank {rank} of mpiexec {launcher} not found")


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


@pytest.fixture(scope="module")
def two_parts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parts") / "p2"
    partition_graph(load_dataset(SMALL), 2, out, seed=0)
    return out


def _assert_whole_or_absent(checkpoint_dir: Path) -> None:
    """A checkpoint a stopped run left is complete (its checksum holds) or absent."""
    for name in (CHECKPOINT_FILE, BEST_FILE):
        if (checkpoint_dir / name).exists():
            read_checkpoint(checkpoint_dir / name, "--resume")


@pytest.mark.parametrize(
    ("signum", "target"),
    [
        (signal.SIGINT, "mpiexec"),
        (signal.SIGINT, 1),
        (signal.SIGTERM, "mpiexec"),
        (signal.SIGTERM, 0),
    ],
    ids=["int-launcher", "int-rank1", "term-launcher", "term-rank0"],
)
def test_a_stop_signal_ends_the_job_with_one_line(two_parts, tmp_path, signum, target):
    """Ctrl-C (SIGINT to mpiexec, which forwards it to every rank, or to one rank) and
    SIGTERM end every rank: one line on stderr (rank 0's; a lone signalled rank's names
    itself), exit 128 + signal, no traceback, checkpoints whole or absent."""
    ckpt = tmp_path / "ckpt"
    argv = ["--part-dir", str(two_parts), *ENDLESS, "--checkpoint-dir", str(ckpt)]
    proc = _start([mpiexec(), "-n", "2", sys.executable, "-m", "distmb.train", *argv])
    pid = proc.pid if target == "mpiexec" else _rank_pid(proc.pid, target)
    os.kill(pid, signum)
    code, err = _finish(proc)
    word = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}[signum]
    line = f"{PROG}: {word}" + (f" (rank {target})" if target not in ("mpiexec", 0) else "")
    assert code == 128 + signum, err[-3000:]
    assert err.splitlines() == [line], err[-3000:]
    _assert_whole_or_absent(ckpt)


def test_sigterm_ends_a_single_rank_run_with_one_line(tmp_path):
    proc = _start([sys.executable, "-m", "distmb.train", "--dataset", SMALL, *ENDLESS])
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc)
    assert code == 143 and err.splitlines() == [f"{PROG}: terminated"], err[-3000:]


# ---- the checkpoint directory's lock -------------------------------------------------------


def test_a_second_run_on_a_held_checkpoint_dir_is_refused_naming_the_holder(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    holder = _start(
        [sys.executable, "-m", "distmb.train", "--dataset", SMALL, *ENDLESS,
         "--checkpoint-dir", str(ckpt)]
    )  # fmt: skip
    try:
        argv = ["--dataset", SMALL, *FAST_FLAGS, "--epochs", "1", "--checkpoint-dir", str(ckpt)]
        for extra in ([], ["--resume"], ["--overwrite-checkpoint"]):
            code, out, err = run_train_cli([*argv, *extra], capsys)
            assert code == 2 and "epoch" not in out and len(err.splitlines()) == 1, err
            assert err.startswith(
                f"{PROG}: error: --checkpoint-dir {ckpt} is in use by another run (pid "
                f"{holder.pid} on host {socket.gethostname()}, since "
            ), err
    finally:
        holder.send_signal(signal.SIGTERM)
        _finish(holder)
    # The holder is gone; its lock file stays and locks nothing.
    assert (ckpt / LOCK_FILE).is_file()
    prepare_checkpoint_dir(str(ckpt), resume=True, overwrite=False)
    release_directory(ckpt)


def test_the_lock_is_released_when_its_process_dies(tmp_path):
    """flock is the kernel's: a holder killed by SIGKILL holds nothing."""
    script = (
        "import sys, time; from distmb.core.dirlock import hold_directory; "
        "hold_directory(sys.argv[1], '--checkpoint-dir'); print('held', flush=True); "
        "time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(DirectoryInUse, match=rf"in use by another run \(pid {holder.pid} on"):
        hold_directory(tmp_path, "--checkpoint-dir")
    holder.kill()
    holder.wait()
    assert hold_directory(tmp_path, "--checkpoint-dir")
    assert hold_directory(tmp_path, "--checkpoint-dir")  # this process again: still held
    release_directory(tmp_path)


def test_best_alone_counts_as_a_checkpoint(tmp_path):
    """A run killed during its first checkpoint may leave only best.pt (written first)."""
    (tmp_path / BEST_FILE).write_bytes(b"x")
    with pytest.raises(InputError, match=r"already holds a checkpoint \(best.pt\)"):
        prepare_checkpoint_dir(str(tmp_path), resume=False, overwrite=False, hold=False)
    prepare_checkpoint_dir(str(tmp_path), resume=False, overwrite=True, hold=False)


# ---- --no-verify ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "bound"), [("indices", "n_local"), ("train_idx", "n_solid")])
def test_no_verify_still_range_checks_the_ids(tmp_path, capsys, name, bound):
    """An out-of-range id under --no-verify: the same one-line error as with verification,
    not a ValueError from deep inside a kernel."""
    from distmb.data import PartitionStore

    out = tmp_path / "p1"
    partition_graph(load_dataset(SMALL), 1, out, seed=0)
    limit = getattr(PartitionStore(out, 0), bound)
    path = out / "part-0" / f"{name}.npy"
    values = np.load(path)
    values[len(values) // 2] = limit  # one past the last valid id
    np.save(path, values)
    argv = ["--part-dir", str(out), *FAST_FLAGS, "--epochs", "1", "--threads", "1"]
    code, out_text, err = run_train_cli([*argv, "--no-verify"], capsys)
    assert code == 2 and "Traceback" not in err and "epoch" not in out_text
    assert err.splitlines() == [
        f"{PROG}: error: {path}: value {limit} at index {len(values) // 2} is outside [0, {limit})"
    ]
