"""``--tensorboard DIR``: every epoch's record as TensorBoard scalars, written by rank 0.

The scalars are exactly the numbers of the JSON record (``--results``), by the same names:
``loss``, ``train_acc``, ``val_acc``, ``epoch_time``, ``mbc``, ... at the top level,
``hec_hit_rate/0`` for the first entry of a list, ``feature_cache/hit_rate`` inside a nested
record. Strings and missing values (``None``) are left out; the step is the record's
``epoch``. Needs the optional ``tensorboard`` package (``pip install tensorboard``, or the
``tensorboard`` extra of distmb), which ``torch.utils.tensorboard`` writes with.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from distmb.core.errors import InputError

#: How to install what ``--tensorboard`` needs.
TENSORBOARD_INSTALL = "pip install tensorboard  (or pip install 'distmb[tensorboard]')"


def record_scalars(record: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(tag, value)`` of every number in ``record`` (nested records and lists flattened
    to ``key/sub`` and ``key/index``), except the step ``epoch`` at the top level."""
    for key, value in record.items():
        tag = f"{prefix}{key}"
        if not prefix and key == "epoch":
            continue
        if isinstance(value, Mapping):
            yield from record_scalars(value, tag + "/")
        elif isinstance(value, list | tuple):
            yield from record_scalars({str(i): v for i, v in enumerate(value)}, tag + "/")
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            yield tag, float(value)


def summary_writer_class() -> type:
    """``torch.utils.tensorboard.SummaryWriter``.

    Raises:
        InputError: the ``tensorboard`` package is missing, naming ``--tensorboard`` and the
            pip command.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise InputError(
            f"--tensorboard needs the tensorboard package, which is not installed: "
            f"{TENSORBOARD_INSTALL}"
        ) from None
    return SummaryWriter


def prepare_tensorboard_dir(directory: str) -> None:
    """Check, before any work, that ``--tensorboard DIR`` can be written: the package is
    installed and ``DIR`` is (or can be made) a directory.

    Raises:
        InputError: naming ``--tensorboard`` and what is wrong.
    """
    summary_writer_class()
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"--tensorboard {directory}: cannot create the directory ({exc.strerror})"
        ) from None


class TensorBoardLog:
    """Writes each epoch's record as scalars to an event file in ``directory`` (rank 0).

    Args:
        directory: the ``--tensorboard`` directory (one event file per run).
    """

    def __init__(self, directory: str) -> None:
        prepare_tensorboard_dir(directory)
        self.writer = summary_writer_class()(log_dir=directory)

    def log_epoch(self, record: Mapping[str, Any]) -> None:
        """Every number of ``record`` at step ``record["epoch"]``; flushed, so a crash later
        loses nothing written."""
        step = int(record["epoch"])
        for tag, value in record_scalars(record):
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
