"""``distmb.predict(...)``: predictions, logits and hidden embeddings of every vertex from a
training checkpoint (the command line: :mod:`distmb.cli.predict`).

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

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmb.config.train import OPTIONS, RESUME_MUST_MATCH, TrainConfig
from distmb.core.errors import InputError
from distmb.core.malloc import DEFAULT_MALLOC_POLICY, configure_malloc
from distmb.engine.predict_outputs import (
    MANIFEST_FILE,
    GatherWriter,
    PerPartWriter,
    prepare_out,
    remove_stale,
    write_manifest,
)

if TYPE_CHECKING:
    from distmb.comm import RankGroup
    from distmb.data.local import LocalGraph

    Ranks = RankGroup

#: Bump when the manifest or the file layout changes incompatibly.
MANIFEST_VERSION = 1
#: The options a prediction takes from the checkpoint besides those that shape the model
#: (:data:`RESUME_MUST_MATCH`): the kernels and the evaluation's block size it was evaluated
#: with, so that predictions repeat the trainer's evaluation bit for bit.
CARRIED_OPTIONS: tuple[str, ...] = (*RESUME_MUST_MATCH, "kernels", "eval_batch_size")
#: Splits whose accuracy the manifest reports.
SPLITS = ("train", "val", "test")


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
        comm: the ranks (:class:`distmb.comm.RankGroup` under mpirun or torchrun; default: one
            rank).
        log: prints one line (rank 0 only); default: ``print``.

    Returns:
        :class:`Prediction`.

    Raises:
        InputError: a missing or damaged checkpoint, data of another graph, an unusable
            ``out``, or arguments that do not fit together; one line naming them.
    """
    from distmb.comm import SingleProcess

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
        previous = prepare_out(out, overwrite)

    from distmb.engine.checkpoint import read_checkpoint

    state = read_checkpoint(path, "--checkpoint")
    config = inference_config(
        state["args"], path, dataset, part_dir, batch_size, threads, verify, malloc
    )
    local, data_text = _open_data(comm, config)
    check_same_graph(state["identity"], local.identity, path, data_text)
    result = _run(comm, state, config, local, path, data_text, out_dir, embeddings, per_part, say)
    if out_dir is not None and comm.rank == 0:
        remove_stale(out_dir, previous, result.manifest)
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


def _open_data(comm: Ranks, config: TrainConfig) -> tuple[LocalGraph, str]:
    """This rank's :class:`LocalGraph` (opened as training opens it, quietly) and a
    description of the data for messages."""
    from distmb.data.local import LocalGraph
    from distmb.engine.build.data import load_local, open_part

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

    from distmb.engine.build.features import open_features
    from distmb.engine.build.model import model_from_config
    from distmb.engine.build.runtime import set_threads
    from distmb.engine.evaluate import layerwise_inference, part_layer_table, split_accuracies
    from distmb.nn.kernels.dispatch import set_kernels
    from distmb.pipeline.features.normalize import FeatureNormalization
    from distmb.pipeline.sample.host import NeighborSampler

    start = time.perf_counter()
    set_threads(config)
    # --malloc: each inference batch reuses the previous one's freed buffers (the checkpoint
    # and the data were loaded before, with glibc's defaults).
    note = configure_malloc(config.malloc)
    if note:
        say(f"distmb.predict: {note}")
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
            write_manifest(out, result.manifest)
        say(_summary(result, comm.size, path, per_part, time.perf_counter() - start))
    return result


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
