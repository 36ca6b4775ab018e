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

Everything that may refuse a prediction comes before its first collective, in steps that
``predict(agree=...)`` runs (:class:`Agree`): opening the checkpoint and ``--out``, this
rank's part, checking that every rank opened the same partition, checking the checkpoint
against the data, rebuilding the model. The command line under a launcher passes
:func:`distmb.cli.usage.agree_on_ranks` there, so that an error every rank meets is reported
once and every rank leaves with one exit code; no step holds a collective before a point
where it may fail on one rank alone, so no rank is left waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

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
    import torch

    from distmb.comm import RankGroup
    from distmb.data.local import LocalGraph
    from distmb.data.store.store import PartitionStore
    from distmb.pipeline.features.protocol import FeatureSource
    from distmb.pipeline.sample.host import NeighborSampler

    Ranks = RankGroup

T = TypeVar("T")

#: Bump when the manifest or the file layout changes incompatibly.
MANIFEST_VERSION = 1
#: The options a prediction takes from the checkpoint besides those that shape the model
#: (:data:`RESUME_MUST_MATCH`): the kernels and the evaluation's block size it was evaluated
#: with, and the dtype it stored the feature table in (``--feature-dtype``: the rows are read
#: rounded as the run read them), so that predictions repeat the trainer's evaluation bit
#: for bit (``--kernels auto`` is resolved on the CPU, where a prediction runs: the fused
#: kernels, as a CPU run's).
CARRIED_OPTIONS: tuple[str, ...] = (
    *RESUME_MUST_MATCH,
    "kernels",
    "eval_batch_size",
    "feature_dtype",
)
#: Splits whose accuracy the manifest reports.
SPLITS = ("train", "val", "test")


class Agree(Protocol):
    """How :func:`predict` runs each step of its set-up, on every rank together: returns what
    ``step()`` returned, or raises. :func:`run_step` (the default: one rank, or the Python
    API) lets the step's error propagate on the rank that met it; the command line under a
    launcher passes :func:`distmb.cli.usage.agree_on` (``comm``'s
    :func:`distmb.cli.usage.agree_on_ranks`), which tells every rank of any rank's failure,
    prints it once (or once per rank that met it) and exits every rank alike.

    Each step reaches all of its collectives on every rank, or fails before its first one.
    """

    def __call__(self, step: Callable[[], T], /) -> T: ...


def run_step(step: Callable[[], T]) -> T:
    """:class:`Agree` for one rank, or ranks that handle their errors themselves: ``step()``."""
    return step()


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
    agree: Agree = run_step,
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
        agree: runs each step of the set-up, the steps that may refuse the prediction,
            before any collective of the inference (:class:`Agree`; default: :func:`run_step`).

    Returns:
        :class:`Prediction`.

    Raises:
        InputError: a missing or damaged checkpoint, data of another graph, an unusable
            ``out``, or arguments that do not fit together; one line naming them.
        PartitionError: a partition of another number of parts than ranks, a missing or
            damaged file of this rank's part, ranks that opened different partitions.
    """
    from distmb.comm import SingleProcess

    comm = comm if comm is not None else SingleProcess()
    if log is None:
        log = print
    say = log if comm.rank == 0 else (lambda _: None)
    out_dir = None if out is None else Path(out).expanduser()

    def open_checkpoint() -> tuple[Path, list[str], dict[str, Any], TrainConfig]:
        """The checkpoint file, the files of an earlier prediction in ``out``, the
        checkpoint's contents and the prediction's configuration (no collective)."""
        from distmb.engine.checkpoint import read_checkpoint

        check_arguments(dataset, part_dir, out, per_part, batch_size)
        path = checkpoint_file(checkpoint)
        previous: list[str] = []
        if out is not None and (per_part or comm.rank == 0):  # the ranks that write there
            previous = prepare_out(out, overwrite)
        state = read_checkpoint(path, "--checkpoint")
        config = inference_config(
            state["args"], path, dataset, part_dir, batch_size, threads, verify, malloc
        )
        return path, previous, state, config

    path, previous, state, config = agree(open_checkpoint)
    local, data_text = _open_data(comm, config, agree)
    agree(lambda: check_same_graph(state["identity"], local.identity, path, data_text))
    model = agree(lambda: _load_model(state, config, local, path, say))
    result = _run(
        comm, state, config, local, model, path, data_text, out_dir, embeddings, per_part, say
    )
    if out_dir is not None and comm.rank == 0:
        remove_stale(out_dir, previous, result.manifest)
    return result


def check_arguments(
    dataset: str | None,
    part_dir: str | Path | None,
    out: str | Path | None,
    per_part: bool,
    batch_size: int | None,
) -> None:
    """Refuse arguments of :func:`predict` that do not fit together.

    Raises:
        InputError: naming them.
    """
    if dataset is not None and part_dir is not None:
        raise InputError("--dataset and --part-dir exclude each other")
    if per_part and out is None:
        raise InputError("--per-part writes files: give --out DIR")
    if batch_size is not None and batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")


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


def _open_data(comm: Ranks, config: TrainConfig, agree: Agree) -> tuple[LocalGraph, str]:
    """This rank's :class:`LocalGraph` (opened as training opens it, quietly) and a
    description of the data for messages; each step that may refuse the data runs through
    ``agree``.

    Under several ranks, this rank's part is opened first (no collective: a file of one part
    fails on its rank alone), then every rank checks that all opened the same partition (its
    all-gathers reached by every rank, its errors decided from their results)."""
    from distmb.data.local import LocalGraph
    from distmb.engine.build.data import check_same_partition, load_local, open_own_part

    data_text = (
        f"--part-dir {config.part_dir}"
        if config.part_dir
        else f"--dataset {config.dataset or 'synthetic'}"
    )
    if comm.size == 1:
        return agree(lambda: load_local(config, lambda _: None)), data_text
    part_dir = config.part_dir or ""

    def own_part() -> PartitionStore:
        if not part_dir:
            raise InputError(
                f"{data_text} predicts on one rank; under mpirun -np {comm.size} give "
                f"--part-dir (a partition with {comm.size} parts, e.g. the one the job "
                "trained on)"
            )
        return open_own_part(part_dir, comm.size, comm.rank, verify=config.verify)

    store = agree(own_part)
    agree(lambda: check_same_partition(comm, part_dir, store))
    return LocalGraph.from_store(store), data_text


@dataclass
class _Model:
    """What :func:`_load_model` prepares for the inference: the model with the checkpoint's
    weights, the features of layer-wise evaluation (normalised as the run did), the
    sampler over the rank's in-edges, and when loading them began (``time.perf_counter``:
    the summary line's clock)."""

    module: torch.nn.Module
    features: FeatureSource
    sampler: NeighborSampler
    started: float


def _load_model(
    state: dict[str, Any],
    config: TrainConfig,
    local: LocalGraph,
    path: Path,
    say: Callable[[str], None],
) -> _Model:
    """Set the threads, the allocator and the kernels, rebuild the model with the
    checkpoint's weights, open the features and the sampler (no collective).

    Raises:
        InputError: weights or feature statistics that do not fit the model or the data.
    """
    import torch

    from distmb.engine.build.features import open_features
    from distmb.engine.build.model import model_from_config
    from distmb.engine.build.runtime import configure_kernels, set_threads
    from distmb.pipeline.features.normalize import FeatureNormalization
    from distmb.pipeline.sample.host import NeighborSampler

    started = time.perf_counter()
    set_threads(config)
    # --malloc: each inference batch reuses the previous one's freed buffers (the checkpoint
    # and the data were loaded before, with glibc's defaults).
    note = configure_malloc(config.malloc)
    if note:
        say(f"distmb.predict: {note}")
    # The checkpoint's --kernels on the CPU, where inference runs (auto: the fused kernels).
    configure_kernels(config, torch.device("cpu"))
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
    return _Model(model, features, sampler, started)


def _run(
    comm: Ranks,
    state: dict[str, Any],
    config: TrainConfig,
    local: LocalGraph,
    model: _Model,
    path: Path,
    data_text: str,
    out: Path | None,
    embeddings: bool,
    per_part: bool,
    say: Callable[[str], None],
) -> Prediction:
    """Infer layer by layer, write (or gather) the outputs, the manifest and the summary line:
    the collectives of the prediction, reached by every rank."""
    from distmb.engine.evaluate import layerwise_inference, part_layer_table, split_accuracies

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
    last = model.module.num_layers - 1

    def on_layer(layer: int, rows: torch.Tensor) -> None:
        if layer < last and embeddings:
            writer.embeddings(layer, rows.numpy())  # collective when gathered: every rank

    logits = layerwise_inference(
        model.module,
        model.features,
        model.sampler,
        config.eval_batch_size,
        part_layer_table(comm, local, model.features),
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
        say(_summary(result, comm.size, path, per_part, time.perf_counter() - model.started))
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
