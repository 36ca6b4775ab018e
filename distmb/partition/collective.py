"""What every rank of the partitioner's MPI jobs shares (``--method parmetis`` and the
distributed writer, :mod:`distmb.partition.distributed` and :mod:`distmb.partition.distwrite`).

:func:`collective` runs a step on every rank and raises an error of any rank on all of them;
:func:`vertex_ranges` splits the vertices into the ranks' ranges; :func:`read_sliced` maps a
dataset's arrays on every rank so that each can read its slice of the edges.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from distmb.core.errors import InputError, OutputError
from distmb.data.datasets import parse_spec
from distmb.data.datasets.loader_utils import one_line
from distmb.data.datasets.ogb import dataset_name, read_ogb_arrays
from distmb.data.datasets.ogb_arrays import OgbArrays

T = TypeVar("T")

#: Dataset kinds whose edges can be read in slices (memory-mapped arrays).
SLICED_KINDS = ("ogb",)


def collective(comm: Any, what: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; when it failed anywhere, raise :class:`InputError` on every
    rank naming the first failing rank (a collective that only some ranks reach would hang);
    :class:`OutputError` when that rank's error was an :class:`OSError` (a full disk)."""
    result: Any = None
    error = None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - any failure must reach every rank
        kind = "" if isinstance(exc, InputError | OSError) else f"{type(exc).__name__}: "
        error = (isinstance(exc, OSError), f"rank {comm.rank}: {kind}{one_line(exc)}")
    errors = [e for e in comm.allgather(error) if e]
    if errors:
        failed_writing, message = errors[0]
        raise (OutputError if failed_writing else InputError)(f"{what}: {message}")
    return result


def vertex_ranges(num_nodes: int, ranks: int) -> np.ndarray:
    """int64[ranks + 1] ``vtxdist``: rank r owns ``[vtxdist[r], vtxdist[r+1])``."""
    return (np.arange(ranks + 1, dtype=np.int64) * num_nodes) // ranks


def read_sliced(spec: str, comm: Any, what: str) -> tuple[OgbArrays, list[str], str, str]:
    """``(arrays, notes, source, name)`` of ``spec`` on every rank, as
    :func:`~distmb.data.datasets.ogb.read_ogb_arrays` gives them (edges and features memory-mapped),
    with the graph's name. Rank 0 reads (and, for ``ogb:DIR``, converts into the cache)
    first; the others follow, then map the converted arrays. ``what`` names the step that
    needs sliced edges in the error for another dataset kind."""
    kind, arg = parse_spec(spec)
    if kind not in SLICED_KINDS:
        raise InputError(
            f"{what} reads the edges in slices from {', '.join(SLICED_KINDS)}:DIR datasets "
            f"(memory-mapped arrays); got --dataset {spec}"
        )

    def read() -> tuple[OgbArrays, list[str], str, str]:
        arrays, notes, source = read_ogb_arrays(arg)
        return arrays, notes, source, dataset_name(Path(arg))

    first = collective(comm, f"--dataset {spec}", read if comm.rank == 0 else lambda: None)
    rest = collective(comm, f"--dataset {spec}", read if comm.rank != 0 else lambda: None)
    return first if comm.rank == 0 else rest
