"""``distmb-predict`` / ``python -m distmb.predict``: predictions, logits and hidden embeddings
of every vertex from a training checkpoint.

The checkpoint (``--checkpoint DIR_or_FILE``, read without pickle and checked against its
sha256) holds the model's options and weights; the model is rebuilt from them. The data is
``--dataset SPEC`` (one rank, the whole graph) or ``--part-dir DIR`` (a partition: under
``mpirun -np P`` each rank its part; default: the data the checkpoint was trained on). The
model is the same data-parallel copy on every rank, so a checkpoint of a multi-rank run
predicts on one rank and vice versa; a checkpoint of another graph is refused.

Inference is exact: layer-wise over all in-neighbours (:func:`layerwise_inference`, the
trainer's evaluation), with one halo exchange per layer across ranks. Outputs, in original
vertex id (``VID_o``) order, as ``.npy`` files (memory-mappable: ``np.load(path,
mmap_mode="r")``), written atomically into ``--out``:

- ``predictions.npy``: int64[n], the arg-max class of every vertex;
- ``logits.npy``: float32[n, num_classes];
- ``embeddings-layer<k>.npy`` (``--embeddings``): float32[n, width of layer k's output],
  the output of hidden layer ``k`` (``0 <= k < layers - 1``; after its activation, no
  dropout);
- ``predict.json``: the manifest (checkpoint path, sha256 and epoch, dataset, sizes, files,
  accuracy on the train/val/test splits).

With several ranks the rows are gathered to rank 0, which writes them chunk by chunk into
memory maps (the full table never has to fit in its memory); ``--per-part`` instead has
each rank write its own vertices' rows into ``OUT/part-<rank>/`` with ``orig_ids.npy``
(int64[n_part], the ``VID_o`` of each row) beside them. Layout: docs/predict.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmb.config.train import OPTIONS, RESUME_MUST_MATCH, TrainConfig
from distmb.core.errors import InputError, PartitionError, exit_on_user_error
from distmb.core.malloc import DEFAULT_MALLOC_POLICY, MALLOC_POLICIES, configure_malloc

if TYPE_CHECKING:
    from distmb.comm.mpi import RankGroup, SingleProcess
    from distmb.data.local import LocalGraph

    Ranks = RankGroup | SingleProcess

#: The command (messages, ``--help``).
PROG = "distmb.cli.predict"
#: Output files (in ``--out``, or in each ``part-<rank>/`` with ``--per-part``).
PREDICTIONS_FILE = "predictions.npy"
LOGITS_FILE = "logits.npy"
#: ``--per-part``: the ``VID_o`` of each row of the part's files.
ORIG_IDS_FILE = "orig_ids.npy"
#: The manifest, in ``--out``.
MANIFEST_FILE = "predict.json"
#: Bump when the manifest or the file layout changes incompatibly.
MANIFEST_VERSION = 1
#: The options a prediction takes from the checkpoint besides those that shape the model
#: (:data:`RESUME_MUST_MATCH`): the kernels and the evaluation's block size it was evaluated
#: with, so that predictions repeat the trainer's evaluation bit for bit.
CARRIED_OPTIONS: tuple[str, ...] = (*RESUME_MUST_MATCH, "kernels", "eval_batch_size")
#: Splits whose accuracy the manifest reports.
SPLITS = ("train", "val", "test")


def embeddings_file(layer: int) -> str:
    """File of hidden layer ``layer``'s output: ``embeddings-layer<layer>.npy``."""
    return f"embeddings-layer{layer}.npy"


@dataclass
class Prediction:
    """What :func:`predict` returns, on every rank.

    Attributes:
        num_nodes: vertices of the whole graph.
        num_classes: classes (columns of ``logits``).
        accuracy: ``{"train", "val", "test"}`` -> share of the split predicted right over
            all ranks (nan for an empty split).
        out: the output directory, or None when nothing was written.
        files: the names of the written ``.npy`` files, in ``out`` (gathered) or in each
            ``out/part-<rank>/`` (per part).
        predictions: int64[num_nodes] by ``VID_o`` on rank 0 when gathered (memory-mapped
            from ``out`` when written there), else None.
        logits: float32[num_nodes, num_classes], likewise.
        embeddings: float32[num_nodes, dim_k] per hidden layer ``k`` with ``embeddings``
            (likewise; empty otherwise).
        manifest: the contents of ``predict.json`` (rank 0), else None.
    """

    num_nodes: int
    num_classes: int
    accuracy: dict[str, float]
    out: Path | None
    files: list[str] = field(default_factory=list)
    predictions: np.ndarray | None = None
    logits: np.ndarray | None = None
    embeddings: list[np.ndarray] = field(default_factory=list)
    manifest: dict[str, Any] | None = None


def predict(
    checkpoint: str | Path,
    *,
    dataset: str | None = None,
    part_dir: str | Path | None = None,
    out: str | Path | None = None,
    embeddings: bool = False,
    per_part: bool = False,
    overwrite: bool = False,
    batch_size: int | None = None,
    threads: int | None = None,
    malloc: str = DEFAULT_MALLOC_POLICY,
    verify: bool = True,
    comm: Ranks | None = None,
    log: Callable[[str], None] | None = None,
) -> Prediction:
    """Predict every vertex with the model of ``checkpoint`` (exact layer-wise inference).

    Args:
        checkpoint: a checkpoint file, or a ``--checkpoint-dir`` (its ``checkpoint.pt``).
        dataset: a dataset spec (one rank), or
        part_dir: a partition with one part per rank; neither: the checkpoint's own data.
        out: directory of the ``.npy`` files and ``predict.json`` (created; checked before
            any work); None: nothing is written and the gathered arrays are returned in
            memory on rank 0.
        embeddings: also produce each hidden layer's output.
        per_part: each rank writes its own vertices' rows to ``out/part-<rank>/`` with their
            ``orig_ids.npy`` instead of gathering them to rank 0 (needs ``out``).
        overwrite: replace the outputs of an earlier prediction in ``out``.
        batch_size: destinations per block (default: the checkpoint's ``--eval-batch-size``).
        threads: PyTorch's and the C++ kernels' threads (default: all cores).
        malloc: the C allocator policy while inferring (``--malloc``:
            :data:`distmb.core.malloc.MALLOC_POLICIES`; ``retain`` keeps each batch's freed
            buffers for the next; distmb/core/malloc.py).
        verify: check the partition's files when opening them.
        comm: the ranks (:class:`distmb.comm.mpi.RankGroup` under mpirun or torchrun; default: one
            rank).
        log: prints one line (rank 0 only); default: ``print``.

    Returns:
        :class:`Prediction`.

    Raises:
        InputError: a missing or damaged checkpoint, data of another graph, an unusable
            ``out``, or arguments that do not fit together; one line naming them.
    """
    from distmb.comm.mpi import SingleProcess

    comm = comm if comm is not None else SingleProcess()
    if log is None:
        log = print
    say = log if comm.rank == 0 else (lambda _: None)
    if dataset is not None and part_dir is not None:
        raise InputError("--dataset and --part-dir exclude each other")
    if per_part and out is None:
        raise InputError("--per-part writes files: give --out DIR")
    if batch_size is not None and batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")
    path = checkpoint_file(checkpoint)
    out_dir = None if out is None else Path(out).expanduser()
    previous: list[str] = []
    if out is not None and (per_part or comm.rank == 0):  # the ranks that write there
        previous = _prepare_out(out, overwrite)

    from distmb.engine.checkpoint import read_checkpoint

    state = read_checkpoint(path, "--checkpoint")
    config = inference_config(
        state["args"], path, dataset, part_dir, batch_size, threads, verify, malloc
    )
    local, data_text = _open_data(comm, config)
    check_same_graph(state["identity"], local.identity, path, data_text)
    result = _run(comm, state, config, local, path, data_text, out_dir, embeddings, per_part, say)
    if out_dir is not None and comm.rank == 0:
        _remove_stale(out_dir, previous, result.manifest)
    return result


def checkpoint_file(checkpoint: str | Path) -> Path:
    """The checkpoint file ``--checkpoint`` names: the file itself, or a directory's
    ``checkpoint.pt``.

    Raises:
        InputError: nothing there.
    """
    from distmb.engine.checkpoint import CHECKPOINT_FILE

    path = Path(checkpoint).expanduser()
    if path.is_dir():
        if not (path / CHECKPOINT_FILE).is_file():
            raise InputError(
                f"--checkpoint {checkpoint}: the directory holds no {CHECKPOINT_FILE} "
                "(train with --checkpoint-dir DIR, or give the checkpoint file)"
            )
        return path / CHECKPOINT_FILE
    if not path.is_file():
        raise InputError(f"--checkpoint {checkpoint}: no such file or directory")
    return path


def inference_config(
    saved_args: dict[str, Any],
    path: Path,
    dataset: str | None,
    part_dir: str | Path | None,
    batch_size: int | None,
    threads: int | None,
    verify: bool,
    malloc: str,
) -> TrainConfig:
    """The configuration of a prediction: the checkpoint's :data:`CARRIED_OPTIONS` (what
    shapes the model and its evaluation), the data given (default: the checkpoint's own),
    features memory-mapped whatever the partition's layout, and the run-time choices
    given; every other option at its default.

    Raises:
        InputError: the checkpoint records options this distmb does not accept.
    """
    if not isinstance(saved_args, dict):
        raise InputError(f"--checkpoint {path}: 'args' is not a dictionary of options")
    known = {o.name for o in OPTIONS}
    values = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in saved_args.items()
        if k in CARRIED_OPTIONS and k in known
    }
    if dataset is None and part_dir is None:  # the checkpoint's own data
        dataset, part_dir = saved_args.get("dataset"), saved_args.get("part_dir")
    if batch_size is not None:
        values["eval_batch_size"] = batch_size
    try:
        return TrainConfig(
            **values,
            dataset=dataset,
            part_dir=None if part_dir is None else str(part_dir),
            features="mmap",
            threads=threads,
            malloc=malloc,
            verify=verify,
            progress=False,
        )
    except InputError as exc:
        raise InputError(f"--checkpoint {path}: its options do not fit ({exc})") from None


def check_same_graph(
    saved: dict[str, Any], data: dict[str, Any], path: Path, data_text: str
) -> None:
    """Refuse a checkpoint of another graph (name, sizes, feature width, classes, sha256 of
    structure and labels), naming both.

    Raises:
        InputError: one line: the checkpoint's graph and the data's.
    """
    if saved == data:
        return
    diff = sorted(k for k in set(saved) | set(data) if saved.get(k) != data.get(k))
    raise InputError(
        f"--checkpoint {path} was trained on {_describe_graph(saved)}, but {data_text} is "
        f"{_describe_graph(data)} (they differ in {', '.join(diff)})"
    )


def _describe_graph(identity: dict[str, Any]) -> str:
    sha = str(identity.get("graph_sha256", "?"))[:12]
    return (
        f"{identity.get('graph_name')!r} ({identity.get('num_nodes')} vertices, "
        f"{identity.get('feat_dim')} features, {identity.get('num_classes')} classes, "
        f"sha256 {sha}...)"
    )


def _prepare_out(out: str | Path, overwrite: bool) -> list[str]:
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


def _remove_stale(out: Path, previous: list[str], manifest: dict[str, Any] | None) -> None:
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


def _open_data(comm: Ranks, config: TrainConfig) -> tuple[LocalGraph, str]:
    """This rank's :class:`LocalGraph` (opened as training opens it, quietly) and a
    description of the data for messages."""
    from distmb.cli.launch import open_part
    from distmb.cli.train import load_local
    from distmb.data.local import LocalGraph

    if comm.size == 1:
        data_text = (
            f"--part-dir {config.part_dir}"
            if config.part_dir
            else f"--dataset {config.dataset or 'synthetic'}"
        )
        return load_local(config, lambda _: None), data_text
    if not config.part_dir:
        raise InputError(
            f"--dataset {config.dataset or 'synthetic'} predicts on one rank; under mpirun "
            f"-np {comm.size} give --part-dir (a partition with {comm.size} parts, e.g. the "
            "one the job trained on)"
        )
    store = open_part(comm, config.part_dir, verify=config.verify)
    return LocalGraph.from_store(store), f"--part-dir {config.part_dir}"


def _run(
    comm: Ranks,
    state: dict[str, Any],
    config: TrainConfig,
    local: LocalGraph,
    path: Path,
    data_text: str,
    out: Path | None,
    embeddings: bool,
    per_part: bool,
    say: Callable[[str], None],
) -> Prediction:
    """Load the weights, infer layer by layer, write (or gather) the outputs, the manifest
    and the summary line."""
    import torch

    from distmb.cli.train import set_threads
    from distmb.engine.build import model_from_config
    from distmb.engine.evaluate import layerwise_inference, part_layer_table, split_accuracies
    from distmb.engine.features import open_features
    from distmb.nn.kernels.dispatch import set_kernels
    from distmb.pipeline.features.normalize import FeatureNormalization
    from distmb.pipeline.sample.host import NeighborSampler

    start = time.perf_counter()
    set_threads(config)
    # --malloc: each inference batch reuses the previous one's freed buffers (the checkpoint
    # and the data were loaded before, with glibc's defaults).
    note = configure_malloc(config.malloc)
    if note:
        say(f"distmb.cli.predict: {note}")
    set_kernels(config.kernels)
    with torch.random.fork_rng(devices=[]):  # the initial weights are replaced below
        model = model_from_config(config, local.feat_dim, local.num_classes)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise InputError(
            f"--checkpoint {path}: its weights do not fit the model ({first})"
        ) from None
    # --normalize-features: the statistics the run trained with, from the checkpoint
    normalization = (
        FeatureNormalization.from_state(state["feature_norm"], local.feat_dim, str(path))
        if state.get("feature_norm") is not None
        else None
    )
    features = open_features(local, config, normalization=normalization).evaluation()
    sampler = NeighborSampler(
        local.indptr, local.indices, local.n_solid, local.n_local, config.fanout, config.seed
    )
    ids = (
        np.asarray(local.store.orig_ids[: local.n_solid], dtype=np.int64)
        if local.store is not None
        else np.arange(local.n_solid, dtype=np.int64)
    )
    num_nodes = int(local.identity["num_nodes"])
    if out is not None:
        if comm.rank == 0:  # a prediction cut short leaves no manifest naming stale files
            (out / MANIFEST_FILE).unlink(missing_ok=True)
        comm.barrier()  # before any rank writes
    writer = (
        PerPartWriter(out, comm.rank, ids) if per_part else GatherWriter(comm, out, ids, num_nodes)
    )
    last = model.num_layers - 1

    def on_layer(layer: int, rows: torch.Tensor) -> None:
        if layer < last and embeddings:
            writer.embeddings(layer, rows.numpy())  # collective when gathered: every rank

    logits = layerwise_inference(
        model,
        features,
        sampler,
        config.eval_batch_size,
        part_layer_table(comm, local, features),
        on_layer=on_layer,
    )
    writer.logits(logits.numpy())
    accuracy = split_accuracies(
        comm,
        logits,
        local.labels,
        {"train": local.train_idx, "val": local.val_idx, "test": local.test_idx},
    )
    part_rows = comm.allgather(int(local.n_solid)) if per_part else None
    result = Prediction(
        num_nodes=num_nodes,
        num_classes=int(local.num_classes),
        accuracy=accuracy,
        out=out,
        files=list(writer.names),
        predictions=writer.predictions,
        logits=writer.logits_table,
        embeddings=writer.embedding_tables,
    )
    if out is not None:
        comm.barrier()  # every rank's files are in place before the manifest names them
    if comm.rank == 0:
        result.manifest = _manifest(state, path, data_text, comm.size, result, part_rows)
        if out is not None:
            _write_manifest(out, result.manifest)
        say(_summary(result, comm.size, path, per_part, time.perf_counter() - start))
    return result


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

    def __init__(self, comm: Ranks, out: Path | None, ids: np.ndarray, num_nodes: int) -> None:
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
        from distmb.core.atomic import atomic_path

        tmp = stack.enter_context(atomic_path(self.out / name))
        return np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)


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

        write_atomic(self.directory / name, lambda f: np.save(f, array, allow_pickle=False))
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


def _manifest(
    state: dict[str, Any],
    path: Path,
    data_text: str,
    ranks: int,
    result: Prediction,
    part_rows: list[int] | None,
) -> dict[str, Any]:
    from distmb.data.store.store import sha256_file

    identity = state["identity"]
    args = state["args"]
    manifest: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "checkpoint": str(path.resolve()),
        "checkpoint_sha256": sha256_file(path),
        "checkpoint_epoch": int(state["epoch"]),
        "model": {k: args.get(k) for k in ("model", "layers", "hidden", "heads", "aggr")},
        "data": data_text,
        "dataset": identity.get("graph_name"),
        "graph_sha256": identity.get("graph_sha256"),
        "num_nodes": result.num_nodes,
        "num_classes": result.num_classes,
        "ranks": ranks,
        "layout": "per-part" if part_rows is not None else "gathered",
        "files": result.files,
        "accuracy": {k: (None if np.isnan(v) else v) for k, v in result.accuracy.items()},
    }
    if part_rows is not None:
        from distmb.data.store.format import part_dir_name

        manifest["parts"] = [
            {"dir": part_dir_name(rank), "rows": rows} for rank, rows in enumerate(part_rows)
        ]
    return manifest


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    from distmb.core.atomic import write_atomic

    text = json.dumps(manifest, indent=2) + "\n"
    write_atomic(out / MANIFEST_FILE, lambda f: f.write(text.encode()))


def _summary(result: Prediction, ranks: int, path: Path, per_part: bool, seconds: float) -> str:
    """The one line rank 0 prints: vertices, accuracy per split, where the files went."""
    acc = "  ".join(
        f"{name} {100 * value:.2f}%" for name, value in result.accuracy.items() if value == value
    )
    where = ""
    if result.out is not None:
        names = ", ".join(result.files)
        if per_part:
            names = f"part-<rank>/{{{names}}}"
        where = f"; wrote {names} and {MANIFEST_FILE} to {result.out}"
    return (
        f"predicted {result.num_nodes} vertices ({result.num_classes} classes) with {path} on "
        f"{ranks} rank(s) in {seconds:.1f}s: {acc or 'no labelled split'}{where}"
    )


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m distmb.predict`` (docs/predict.md lists them)."""
    parser = argparse.ArgumentParser(
        prog="python -m distmb.predict",
        description=(
            "Predictions, logits and (--embeddings) hidden embeddings of every vertex from a "
            "training checkpoint, by exact layer-wise inference, in original vertex id order "
            "(.npy files and a predict.json manifest in --out). Under mpirun -np P each rank "
            "predicts its part of --part-dir and rank 0 gathers the rows (or, with "
            "--per-part, each rank writes its own)."
        ),
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint file, or a --checkpoint-dir of distmb.cli.train (its checkpoint.pt)",
    )
    data = parser.add_mutually_exclusive_group()
    data.add_argument(
        "--dataset",
        help="dataset spec (as distmb.cli.train's); one rank, the whole graph "
        "(default: the checkpoint's own --dataset or --part-dir)",
    )
    data.add_argument(
        "--part-dir", help="partition directory; under mpirun -np P each rank predicts its part"
    )
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument(
        "--embeddings",
        action="store_true",
        help="also write each hidden layer's output (embeddings-layer<k>.npy)",
    )
    parser.add_argument(
        "--per-part",
        action="store_true",
        help="each rank writes its own vertices' rows to OUT/part-<rank>/ with orig_ids.npy, "
        "instead of gathering them to rank 0",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier prediction in --out (its files not written again are removed)",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help="destinations per block of the layer-wise inference "
        "(default: the checkpoint's --eval-batch-size)",
    )
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="threads of PyTorch and the C++ kernels (default: all cores)",
    )
    parser.add_argument(
        "--malloc",
        choices=MALLOC_POLICIES,
        default=DEFAULT_MALLOC_POLICY,
        help="C allocator policy (as distmb.cli.train's --malloc): retain keeps each batch's freed "
        "buffers for the next instead of page-faulting them afresh; system: glibc's defaults",
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="do not check the partition's files when opening them",
    )
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _run_cli(argv: list[str] | None, comm: Ranks | None) -> None:
    args = build_parser().parse_args(argv)
    predict(
        args.checkpoint,
        dataset=args.dataset,
        part_dir=args.part_dir,
        out=args.out,
        embeddings=args.embeddings,
        per_part=args.per_part,
        overwrite=args.overwrite,
        batch_size=args.batch_size,
        threads=args.threads,
        malloc=args.malloc,
        verify=not args.no_verify,
        comm=comm,
        log=lambda line: print(line, flush=True),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: every rank of an MPI or torchrun job predicts its part; else one rank."""
    from distmb.cli.launch import is_multi_rank_launch, run_on_ranks

    if is_multi_rank_launch():
        return run_on_ranks(PROG, lambda comm: _run_cli(argv, comm))
    return _main_single(argv)


@exit_on_user_error(PROG)
def _main_single(argv: list[str] | None) -> int:
    _run_cli(argv, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
