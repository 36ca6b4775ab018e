"""Output paths, checked and created before any work: a run never dies after an epoch (or,
under mpirun, takes the job down) because ``--results``, ``--checkpoint-dir`` or
``distmb.predict``'s ``--out`` cannot be written, and never replaces a checkpoint it was not
asked to."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from distmb.core.dirlock import hold_directory
from distmb.core.errors import InputError
from distmb.core.temporaries import remove_stale_temporaries
from distmb.engine.checkpoint import BEST_FILE, CHECKPOINT_FILE


def prepare_checkpoint_dir(
    directory: str, *, resume: bool, overwrite: bool, hold: bool = True
) -> Path:
    """Create ``--checkpoint-dir`` (and its parents), check that it can be written and, with
    ``hold``, take it for this run (:func:`~distmb.core.dirlock.hold_directory`: a lock held
    until the run ends; rank 0 of a multi-rank run holds it for the job), then remove the
    temporaries of dead writers in it. Only the holder, after taking the lock, also removes
    the host-less temporaries of older versions (judged by this host's process ids, they may
    be a live run's on another host: that run holds the lock, and this one is refused before
    it sweeps); the other ranks remove those named after their host alone.

    Raises:
        InputError: it is not a directory, cannot be created or written, another run holds
            it (:class:`~distmb.core.dirlock.DirectoryInUse`), or it holds a checkpoint
            (``checkpoint.pt``, or ``best.pt`` alone: a run killed in its first checkpoint)
            and the run neither resumes it nor was told to replace it.
    """
    path = prepare_output_dir(directory, "--checkpoint-dir", sweep=False)
    if hold and not hold_directory(path, "--checkpoint-dir"):
        print(
            f"warning: --checkpoint-dir {directory}: its filesystem cannot lock files (flock), "
            "so a second run on it would not be refused",
            file=sys.stderr,
        )
    remove_stale_temporaries(path, hostless=hold)
    held = [name for name in (CHECKPOINT_FILE, BEST_FILE) if (path / name).exists()]
    if held and not (resume or overwrite):
        raise InputError(
            f"--checkpoint-dir {directory} already holds a checkpoint ({held[0]}); continue it "
            "with --resume, or replace it with --overwrite-checkpoint"
        )
    return path


def prepare_output_dir(directory: str, flag: str, *, sweep: bool = True) -> Path:
    """Create the output directory ``directory`` of ``flag`` (and its parents), check that
    it can be written and, with ``sweep``, remove the temporaries killed writers left in it
    (:func:`~distmb.core.temporaries.remove_stale_temporaries`; the host-less names of older
    versions too: an output directory other than a held checkpoint directory has one writer
    at a time, ``distmb.predict``'s ``--out`` the rank 0 of one prediction).

    Raises:
        InputError: naming ``flag``: it is not a directory, or cannot be created or written.
    """
    path = Path(directory).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {directory}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{flag} {directory}: cannot be created ({exc})") from None
    _check_writable(path, flag, directory)
    if sweep:
        remove_stale_temporaries(path)
    return path


def prepare_results_file(results: str) -> Path:
    """Create ``--results``' parent directories and check that the file can be appended to
    (an existing file is kept: records are appended).

    Raises:
        InputError: it is a directory, or it or its directory cannot be created or written.
    """
    path = Path(results).expanduser()
    if path.is_dir():
        raise InputError(f"--results {results}: is a directory, expected a file (.jsonl)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as exc:
        raise InputError(f"--results {results}: cannot be written ({exc})") from None
    return path


def _check_writable(directory: Path, flag: str, given: str) -> None:
    probe = directory / f".write-test-{socket.gethostname()}-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise InputError(f"{flag} {given}: cannot be written ({exc})") from None
