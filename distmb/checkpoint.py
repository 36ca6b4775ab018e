"""Training checkpoints: written atomically, loaded without pickle (``weights_only=True``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from distmb.errors import InputError

#: File name of the latest checkpoint inside ``--checkpoint-dir``.
CHECKPOINT_FILE = "checkpoint.pt"
#: Bump when the checkpoint's contents change incompatibly.
CHECKPOINT_VERSION = 1
#: Arguments that must match for a checkpoint to be resumed (they shape the model or data).
RESUME_MUST_MATCH = ("model", "layers", "hidden", "heads", "fanout", "aggr")


def save_checkpoint(directory: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``directory/checkpoint.pt`` via a temporary file and a rename, so a
    crash leaves the previous checkpoint intact. Returns the path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_FILE
    tmp = directory / f".{CHECKPOINT_FILE}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save({"version": CHECKPOINT_VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


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
        if saved_args.get(key) != args.get(key):
            raise InputError(
                f"--resume: {path} was trained with --{key} {saved_args.get(key)!r}, "
                f"this run has {args.get(key)!r}"
            )
    return state
