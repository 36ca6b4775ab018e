"""Training checkpoints: written atomically, loaded without pickle (``weights_only=True``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distmb.config.train import RESUME_MUST_MATCH, flag_of
from distmb.core.atomic import write_atomic
from distmb.core.errors import InputError

#: File name of the latest checkpoint inside ``--checkpoint-dir``.
CHECKPOINT_FILE = "checkpoint.pt"
#: File name of the checkpoint of the best validation epoch so far, beside the latest one
#: (same format; written before the latest checkpoint of the same epoch).
BEST_FILE = "best.pt"
#: Bump when the checkpoint's contents change incompatibly.
CHECKPOINT_VERSION = 1
#: Key of the sha256 over the rest of the state (:func:`state_digest`).
CHECKSUM_KEY = "sha256"
#: Keys every checkpoint holds.
REQUIRED_KEYS = ("epoch", "model", "optimizer", "torch_rng", "args", "identity")
#: A saved epoch at or above this is not a real run's (a damaged or forged file).
MAX_EPOCH = 10**9


def save_checkpoint(
    directory: str | Path, state: dict[str, Any], name: str = CHECKPOINT_FILE
) -> Path:
    """Write ``state`` to ``directory/name`` (:data:`CHECKPOINT_FILE` or :data:`BEST_FILE`)
    via a temporary file and a rename, so a crash leaves the previous file intact. Returns
    the path."""
    path = Path(directory) / name
    full = {"version": CHECKPOINT_VERSION, **state}
    full[CHECKSUM_KEY] = state_digest(full)
    write_atomic(path, lambda f: torch.save(full, f), "checkpoint")
    return path


def state_digest(state: Any) -> str:
    """sha256 over a checkpoint's contents (every key, tensor dtype, shape and bytes, and
    value, in a fixed order; the checksum entry itself excluded): a flipped byte anywhere in
    the weights, the optimizer state or the metadata changes it."""
    h = hashlib.sha256()
    _digest(state, h)
    return h.hexdigest()


def _digest(obj: Any, h: Any) -> None:
    if isinstance(obj, dict):
        h.update(b"{")
        for key in sorted(obj, key=repr):
            if key == CHECKSUM_KEY:
                continue
            h.update(repr(key).encode() + b":")
            _digest(obj[key], h)
        h.update(b"}")
    elif isinstance(obj, list | tuple):
        h.update(b"[")
        for item in obj:
            _digest(item, h)
        h.update(b"]")
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        h.update(repr(obj).encode())


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
    state = read_checkpoint(path, "--resume")
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
            flag = flag_of(key)
            raise InputError(
                f"--resume: {path} was trained with {flag} {saved_args[key]!r}, this run has "
                f"{args.get(key)!r} (it shapes the model, the batches, the caches, the inputs "
                f"or the lr schedule: resume with {flag} {saved_args[key]!r}, or start a new run)"
            )
    return state


def read_checkpoint(path: Path, flag: str) -> dict[str, Any]:
    """Read the checkpoint file ``path`` without pickle (``weights_only=True``) and check it:
    version, checksum, required keys, a plausible epoch, finite weights.

    Args:
        flag: the flag that named the file (``--resume``, ``--checkpoint``), for messages.

    Raises:
        InputError: one line naming ``flag``, the file and what is wrong with it.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated, or not a weights-only file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"{flag}: {path} is not a readable checkpoint: damaged, or not written by distmb "
            f"({first[:200]})"
        ) from None
    if not isinstance(state, dict):
        raise InputError(f"{flag}: {path} does not hold a checkpoint (not a dictionary)")
    if state.get("version") != CHECKPOINT_VERSION:
        raise InputError(
            f"{flag}: {path} has checkpoint version {state.get('version')!r}, "
            f"expected {CHECKPOINT_VERSION}"
        )
    _check_contents(path, state, flag)
    return state


def _check_contents(path: Path, state: dict[str, Any], flag: str) -> None:
    """The checksum (when the checkpoint has one: older ones do not), the required keys, a
    plausible epoch and finite weights; each failure is one line naming the file."""
    saved = state.get(CHECKSUM_KEY)
    if saved is not None and saved != state_digest(state):
        raise InputError(f"{flag}: {path}: checksum mismatch; the file is altered or corrupt")
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise InputError(f"{flag}: {path} lacks {', '.join(missing)}; not a distmb checkpoint")
    epoch = state["epoch"]
    if not isinstance(epoch, int) or not 0 <= epoch < MAX_EPOCH:
        raise InputError(f"{flag}: {path} records epoch {epoch!r}; not a real run's")
    model = state["model"]
    if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        raise InputError(f"{flag}: {path}: 'model' is not a state dict of tensors")
    for name, value in model.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise InputError(f"{flag}: {path}: weight {name} holds NaN or Inf")


def cache_state_file(directory: str | Path, epoch: int, rank: int) -> Path:
    """Where ``rank`` keeps its HEC lines as they were after ``epoch``."""
    return Path(directory) / f"hec-epoch{epoch}-rank{rank}.npz"


def save_cache_state(
    directory: str | Path, epoch: int, rank: int, arrays: dict[str, np.ndarray]
) -> Path:
    """Write one rank's cache lines (``np.savez``, no pickle) via a temporary file and a
    rename; the file also records ``epoch`` and ``rank``. Returns the path."""
    path = cache_state_file(directory, epoch, rank)
    write_atomic(
        path,
        lambda f: np.savez(f, epoch=np.int64(epoch), rank=np.int64(rank), **arrays),
        "cache state",
    )
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
