"""Training checkpoints: written atomically, loaded without pickle (``weights_only=True``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from distmb.config import RESUME_MUST_MATCH
from distmb.errors import InputError

#: File name of the latest checkpoint inside ``--checkpoint-dir``.
CHECKPOINT_FILE = "checkpoint.pt"
#: Bump when the checkpoint's contents change incompatibly.
CHECKPOINT_VERSION = 1


def save_checkpoint(directory: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``directory/checkpoint.pt`` via a temporary file and a rename, so a
    crash leaves the previous checkpoint intact. Returns the path."""
    path = Path(directory) / CHECKPOINT_FILE
    write_atomic(path, lambda f: torch.save({"version": CHECKPOINT_VERSION, **state}, f))
    return path


#: Infix of the temporary files :func:`write_atomic` renames into place (``.NAME.tmp-PID``).
TMP_INFIX = ".tmp-"


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """``write`` into a temporary file beside ``path``, fsync, rename it to ``path``, then
    fsync the directory (so the rename itself survives a power loss): a crash leaves the
    previous file (or none), never a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}{TMP_INFIX}{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
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


def load_checkpoint(
    directory: str | Path, *, identity: dict[str, Any], args: dict[str, Any]
) -> dict[str, Any]:
    """Load ``directory/checkpoint.pt`` (no pickle) and check it belongs to this run.

    Args:
        identity: the dataset's identity (name, sizes, sha256); must equal the saved one.
        args: this run's arguments; those in :data:`RESUME_MUST_MATCH` must equal the saved.

    Raises:
        InputError: naming the file and the mismatch.
    """
    path = Path(directory) / CHECKPOINT_FILE
    if not path.is_file():
        raise InputError(f"--resume: no checkpoint at {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated, or not a weights-only file
        raise InputError(f"--resume: {path} is not a readable checkpoint ({exc})") from None
    if not isinstance(state, dict) or state.get("version") != CHECKPOINT_VERSION:
        raise InputError(
            f"--resume: {path} has checkpoint version {state.get('version')!r}, "
            f"expected {CHECKPOINT_VERSION}"
        )
    saved_identity = state.get("identity", {})
    if saved_identity != identity:
        diff = sorted(
            k
            for k in set(saved_identity) | set(identity)
            if saved_identity.get(k) != identity.get(k)
        )
        raise InputError(
            f"--resume: {path} was trained on another dataset "
            f"({saved_identity.get('graph_name')!r}; differs in {', '.join(diff)})"
        )
    saved_args = state.get("args", {})
    for key in RESUME_MUST_MATCH:
        # A checkpoint of an older version may not record every option: those it lacks pass.
        if key in saved_args and saved_args[key] != args.get(key):
            flag = "--" + key.replace("_", "-")
            raise InputError(
                f"--resume: {path} was trained with {flag} {saved_args[key]!r}, this run has "
                f"{args.get(key)!r} (it shapes the model, the batches or the caches: resume "
                f"with {flag} {saved_args[key]!r}, or start a new run)"
            )
    return state


def cache_state_file(directory: str | Path, epoch: int, rank: int) -> Path:
    """Where ``rank`` keeps its HEC lines as they were after ``epoch``."""
    return Path(directory) / f"hec-epoch{epoch}-rank{rank}.npz"


def save_cache_state(
    directory: str | Path, epoch: int, rank: int, arrays: dict[str, np.ndarray]
) -> Path:
    """Write one rank's cache lines (``np.savez``, no pickle) via a temporary file and a
    rename; the file also records ``epoch`` and ``rank``. Returns the path."""
    path = cache_state_file(directory, epoch, rank)
    write_atomic(path, lambda f: np.savez(f, epoch=np.int64(epoch), rank=np.int64(rank), **arrays))
    return path


def load_cache_state(directory: str | Path, epoch: int, rank: int) -> dict[str, np.ndarray] | None:
    """One rank's cache lines saved after ``epoch``, or ``None`` when there is no such file.

    Raises:
        InputError: the file is unreadable or records another epoch or rank.
    """
    path = cache_state_file(directory, epoch, rank)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except Exception as exc:  # truncated or not an npz file
        raise InputError(f"--resume: {path} is not a readable cache file ({exc})") from None
    saved = (int(arrays.pop("epoch", -1)), int(arrays.pop("rank", -1)))
    if saved != (epoch, rank):
        raise InputError(
            f"--resume: {path} holds epoch {saved[0]} of rank {saved[1]}, "
            f"expected epoch {epoch} of rank {rank}"
        )
    return arrays


def remove_cache_states(directory: str | Path, rank: int, keep_epoch: int) -> None:
    """Delete ``rank``'s cache files of every epoch but ``keep_epoch``."""
    keep = cache_state_file(directory, keep_epoch, rank).name
    for path in Path(directory).glob(f"hec-epoch*-rank{rank}.npz"):
        if path.name != keep:
            path.unlink(missing_ok=True)
