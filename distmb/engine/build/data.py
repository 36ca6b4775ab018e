"""The graph a rank trains on: the whole graph or a one-part partition on one rank
(:func:`load_local`), or its part of a partition on every rank: :func:`open_own_part` (no
collective; its errors may be one rank's) then :func:`check_same_partition` (every rank's
all-gathers; its errors every rank's alike), which ``distmb.train`` and ``distmb.predict``
run as two steps that every rank agrees on (:func:`distmb.cli.usage.agree_on_ranks`), and
:func:`open_part`, both at once, for callers whose errors abort the job."""

from __future__ import annotations

from collections.abc import Callable

from distmb.comm import RankGroup
from distmb.config.train import TrainConfig
from distmb.core.errors import InputError, PartitionError
from distmb.data.datasets import load_dataset
from distmb.data.local import LocalGraph
from distmb.data.store.format import NODE_PART_FILE
from distmb.data.store.store import PartitionStore, read_meta


def load_local(config: TrainConfig, log: Callable[[str], None]) -> LocalGraph:
    """The single rank's :class:`LocalGraph` from ``--part-dir`` (one part) or
    ``--dataset`` (default: the built-in synthetic dataset).

    Raises:
        InputError: a partition of several parts, or a graph without training vertices.
    """
    if config.part_dir:
        store = PartitionStore(config.part_dir, 0, verify="auto" if config.verify else "never")
        if store.num_parts != 1:
            raise InputError(
                f"--part-dir {config.part_dir} has {store.num_parts} parts; a single-rank run "
                f"needs 1 (run under mpirun -np {store.num_parts} for multi-rank training)"
            )
        log(f"partition {config.part_dir}: {store}")
        local = LocalGraph.from_store(store)
    else:
        spec = config.dataset or "synthetic"
        graph = load_dataset(spec, seed=config.seed)
        log(graph.summary())
        for note in graph.notes:
            log(f"  {note}")
        local = LocalGraph.from_graph(graph)
    if local.train_idx.size == 0:
        where = config.part_dir or config.dataset or "synthetic"
        raise InputError(f"{where}: no training vertices")
    return local


def open_part(comm: RankGroup, part_dir: str, *, verify: bool = True) -> PartitionStore:
    """Open part ``rank`` of ``part_dir`` on every rank, after checking on every rank that
    the partition has one part per rank and that all ranks see the same graph: the two
    halves, :func:`open_own_part` and :func:`check_same_partition`, at once. An error of
    the first half on one rank leaves the others waiting in the second's all-gather: for
    callers that abort the job on any error (scripts, tests); the commands run the halves
    as two agreed steps.

    Raises:
        PartitionError: another number of parts than ranks, ranks that opened different
            graphs or partitionings, or a part without training vertices.
    """
    store = open_own_part(part_dir, comm.size, comm.rank, verify=verify)
    check_same_partition(comm, part_dir, store)
    return store


def open_own_part(
    part_dir: str, num_ranks: int, rank: int, *, verify: bool = True
) -> PartitionStore:
    """Part ``rank`` of ``part_dir``, after checking that the partition has ``num_ranks``
    parts. No collective: its errors may be this rank's alone (a file of its part).

    Raises:
        PartitionError: another number of parts than ranks, or a missing or corrupt file.
    """
    num_parts = int(read_meta(part_dir)["num_parts"])
    if num_parts != num_ranks:
        raise PartitionError(
            f"--part-dir {part_dir} has {num_parts} parts but {num_ranks} ranks run; "
            f"use mpirun -np {num_parts}"
        )
    return PartitionStore(part_dir, rank, verify="auto" if verify else "never")


def check_same_partition(comm: RankGroup, part_dir: str, store: PartitionStore) -> None:
    """Check that every rank opened a part of the same partitioning of the same graph
    (``store``: this rank's part of ``part_dir``), and that every part has training vertices.
    Every rank reaches both all-gathers, and each error is decided from their results, so
    every rank raises it alike.

    Raises:
        PartitionError: ranks that opened different graphs or partitionings, or a part
            without training vertices.
    """
    # The graph, and the partitioning itself: node_part.npy's sha256 tells apart any two
    # assignments (another --method, --seed or METIS version), whatever produced them.
    mine = (store.meta["graph_sha256"], store.num_parts, store.meta["files"].get(NODE_PART_FILE))
    everyone = comm.allgather(mine)
    odd = [r for r, other in enumerate(everyone) if other != everyone[0]]
    if odd:
        raise PartitionError(
            f"--part-dir {part_dir}: rank(s) {odd} opened a partition of another graph or "
            f"partitioning than rank 0 (graph sha256 {everyone[0][0][:12]}...)"
        )
    train_counts = comm.allgather(int(store.counts["n_train"]))
    empty = [r for r, n in enumerate(train_counts) if n == 0]
    if empty:
        raise PartitionError(
            f"--part-dir {part_dir}: part(s) {empty} have no training vertices; use fewer ranks"
        )
