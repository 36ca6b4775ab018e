"""The files of ``distmb.predict``: their names, the output directory's checks, and the
writers of the rows (gathered to rank 0 into memory maps, or per part). Layout:
docs/predict.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmb.core.errors import InputError, PartitionError

if TYPE_CHECKING:
    from distmb.comm import RankGroup

#: Output files (in ``--out``, or in each ``part-<rank>/`` with ``--per-part``).
PREDICTIONS_FILE = "predictions.npy"
LOGITS_FILE = "logits.npy"
#: ``--per-part``: the ``VID_o`` of each row of the part's files.
ORIG_IDS_FILE = "orig_ids.npy"
#: The manifest, in ``--out``.
MANIFEST_FILE = "predict.json"
#: What these files are called in a write error (``cannot write prediction PATH: ...``).
PREDICTION_OUTPUT = "prediction"


def embeddings_file(layer: int) -> str:
    """File of hidden layer ``layer``'s output: ``embeddings-layer<layer>.npy``."""
    return f"embeddings-layer{layer}.npy"


def prepare_out(out: str | Path, overwrite: bool) -> list[str]:
    """Create and check ``--out`` (the project's output-path checks); refuse to mix with an
    earlier prediction's files unless ``overwrite``. Returns the files the earlier
    prediction's manifest lists (relative to ``out``; none without one)."""
    from distmb.engine.outputs import prepare_output_dir

    directory = prepare_output_dir(str(out), "--out")
    manifest = directory / MANIFEST_FILE
    if not manifest.exists():
        return []
    if not overwrite:
        raise InputError(
            f"--out {out} already holds a prediction ({MANIFEST_FILE}); replace it with "
            "--overwrite, or choose another directory"
        )
    try:
        listed = output_paths(json.loads(manifest.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        listed = []  # unreadable: its files are overwritten or left, the manifest replaced
    return listed


def output_paths(manifest: dict[str, Any]) -> list[str]:
    """Every file a manifest describes, relative to the output directory: ``files`` in it
    (gathered), or in each ``parts[i].dir`` (per part); the manifest itself last."""
    names = [str(name) for name in manifest["files"]]
    parts = manifest.get("parts")
    if parts is None:
        return [*names, MANIFEST_FILE]
    return [f"{part['dir']}/{name}" for part in parts for name in names] + [MANIFEST_FILE]


def remove_stale(out: Path, previous: list[str], manifest: dict[str, Any] | None) -> None:
    """``--overwrite``: delete the earlier prediction's files this one did not write again
    (another layout, rank count or no ``--embeddings``), so that ``out`` holds one
    prediction only; emptied ``part-*`` directories go too."""
    if not previous or manifest is None:
        return
    keep = set(output_paths(manifest))
    root = out.resolve()
    for rel in previous:
        target = (out / rel).resolve()
        if rel in keep or not target.is_relative_to(root) or target == root:
            continue
        target.unlink(missing_ok=True)
        parent = target.parent
        if parent != root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


class GatherWriter:
    """The outputs of every rank in one table per array, on rank 0, in ``VID_o`` order:
    rows arrive chunk by chunk (:meth:`RankGroup.gather_rows`) and are written into a
    memory map of a temporary file (renamed into place when complete: atomic) or, without
    an output directory, into an array in memory. Every rank calls the same methods in the
    same order (each is a collective).

    Args:
        comm: the ranks.
        out: the output directory, or None (arrays in memory on rank 0).
        ids: int64[n_solid], the ``VID_o`` of this rank's rows.
        num_nodes: rows of each gathered table.
    """

    def __init__(
        self,
        comm: RankGroup,
        out: Path | None,
        ids: np.ndarray,
        num_nodes: int,
    ) -> None:
        self.comm = comm
        self.out = out
        self.ids = ids
        self.num_nodes = num_nodes
        self.names: list[str] = []
        self.predictions: np.ndarray | None = None
        self.logits_table: np.ndarray | None = None
        self.embedding_tables: list[np.ndarray] = []

    def embeddings(self, layer: int, rows: np.ndarray) -> None:
        """Gather hidden layer ``layer``'s output (float32[n_solid, D] on every rank)."""
        (table,) = self._gather(rows, [(embeddings_file(layer), None)])
        if table is not None:
            self.embedding_tables.append(table)

    def logits(self, rows: np.ndarray) -> None:
        """Gather the logits (float32[n_solid, C] on every rank) and their arg-max classes."""
        tables = self._gather(rows, [(LOGITS_FILE, None), (PREDICTIONS_FILE, predicted_class)])
        self.logits_table, self.predictions = tables

    def _gather(
        self,
        rows: np.ndarray,
        outputs: list[tuple[str, Callable[[np.ndarray], np.ndarray] | None]],
    ) -> list[np.ndarray | None]:
        """One gather of ``rows`` into one table per ``(file name, transform of a chunk)``
        (None: the rows themselves). Returns the tables on rank 0 (read-only memory maps of
        the written files with an output directory), Nones elsewhere."""
        n = self.num_nodes
        if self.comm.rank != 0:
            self.comm.gather_rows(self.ids, rows, None)
            return [None] * len(outputs)
        with ExitStack() as stack:
            tables = []
            for name, transform in outputs:
                sample = rows[:1] if transform is None else transform(rows[:1])
                tables.append(self._table(stack, name, (n, *sample.shape[1:]), sample.dtype))
            seen = np.zeros(n, dtype=bool)

            def sink(chunk_ids: np.ndarray, chunk: np.ndarray) -> None:
                _mark_rows(seen, chunk_ids)
                for table, (_, transform) in zip(tables, outputs, strict=True):
                    table[chunk_ids] = chunk if transform is None else transform(chunk)

            self.comm.gather_rows(self.ids, rows, sink)
            if not seen.all():
                missing = int(np.flatnonzero(~seen)[0])
                raise PartitionError(f"no rank holds vertex {missing} as solid: broken partition")
            for table in tables:
                if isinstance(table, np.memmap):
                    table.flush()
        if self.out is None:
            return tables
        self.names += [name for name, _ in outputs]
        return [np.load(self.out / name, mmap_mode="r", allow_pickle=False) for name, _ in outputs]

    def _table(
        self, stack: ExitStack, name: str, shape: tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray:
        if self.out is None:
            return np.empty(shape, dtype=dtype)
        from distmb.core.atomic import allocate, atomic_path

        tmp = stack.enter_context(atomic_path(self.out / name, PREDICTION_OUTPUT))
        table = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
        allocate(tmp)  # a full disk fails here, not as a SIGBUS in the first store to the map
        return table


class PerPartWriter:
    """``--per-part``: this rank's rows (its solid vertices, ascending ``VID_o``) in
    ``out/part-<rank>/``, with ``orig_ids.npy``; each file written atomically. No
    collectives.

    Args:
        out: the output directory.
        rank: this rank (its part).
        ids: int64[n_solid], the ``VID_o`` of this rank's rows.
    """

    def __init__(self, out: Path, rank: int, ids: np.ndarray) -> None:
        from distmb.data.store.format import part_dir_name

        self.subdir = part_dir_name(rank)
        self.directory = out / self.subdir
        self.names: list[str] = []
        self.predictions: np.ndarray | None = None
        self.logits_table: np.ndarray | None = None
        self.embedding_tables: list[np.ndarray] = []
        self._save(ORIG_IDS_FILE, ids)

    def embeddings(self, layer: int, rows: np.ndarray) -> None:
        self._save(embeddings_file(layer), rows)

    def logits(self, rows: np.ndarray) -> None:
        self._save(LOGITS_FILE, rows)
        self._save(PREDICTIONS_FILE, predicted_class(rows))

    def _save(self, name: str, array: np.ndarray) -> None:
        from distmb.core.atomic import write_atomic

        write_atomic(
            self.directory / name,
            lambda f: np.save(f, array, allow_pickle=False),
            PREDICTION_OUTPUT,
        )
        self.names.append(name)


def predicted_class(logits: np.ndarray) -> np.ndarray:
    """int64[n]: the arg-max class of each row of ``logits`` (float32[n, C]), as the
    trainer's accuracy takes it (``torch.argmax``: the first of equal maxima)."""
    import torch

    if logits.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return torch.from_numpy(np.ascontiguousarray(logits)).argmax(dim=1).numpy()


def _mark_rows(seen: np.ndarray, ids: np.ndarray) -> None:
    """Record that ``ids`` arrived; a repeated or out-of-range id is a broken partition."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= seen.size):
        raise PartitionError(f"a rank sent vertex ids outside [0, {seen.size})")
    if seen[ids].any() or np.unique(ids).size != ids.size:
        raise PartitionError("two ranks hold the same vertex as solid: broken partition")
    seen[ids] = True


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    from distmb.core.atomic import write_atomic

    text = json.dumps(manifest, indent=2) + "\n"
    write_atomic(out / MANIFEST_FILE, lambda f: f.write(text.encode()), PREDICTION_OUTPUT)
