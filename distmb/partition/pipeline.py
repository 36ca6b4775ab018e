"""``partition_graph``: assignment + train rebalancing + writing, with a per-part report."""

from __future__ import annotations

import hashlib
import math
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from distmb.core.errors import InputError, PartitionError
from distmb.core.machine import physical_memory_bytes
from distmb.core.progress import Progress, peak_rss_bytes
from distmb.data.datasets.loader_utils import one_line
from distmb.data.graph import Graph
from distmb.data.store.format import META_FILE, part_dir_name
from distmb.data.store.store import STAMP_FILE, read_meta
from distmb.partition.assign import (
    ASSIGNMENT_METHOD,
    ENGINES,
    GIVEN_METHODS,
    METHODS,
    assign_parts,
    metis_edge_fraction,
    rebalance_train_and_vertices,
)
from distmb.partition.spill import spilled
from distmb.partition.writer import write_partition

#: Default allowed training-vertex imbalance after rebalancing (max/mean - 1).
DEFAULT_TRAIN_TOLERANCE = 0.02
#: Default allowed vertex-count imbalance after rebalancing (max/mean - 1).
DEFAULT_VERTEX_TOLERANCE = 0.05
#: Default memory budget, as a share of the machine's physical memory.
DEFAULT_MEMORY_SHARE = 0.6


def default_memory_budget_gib() -> float:
    """:data:`DEFAULT_MEMORY_SHARE` of physical memory, in GiB."""
    total = physical_memory_bytes() or 0
    return round(DEFAULT_MEMORY_SHARE * total / 2**30, 1)


def partition_graph(
    graph: Graph,
    parts: int,
    out_dir: str | os.PathLike[str],
    *,
    method: str = "metis",
    seed: int = 0,
    balance_edges: bool = False,
    train_tolerance: float = DEFAULT_TRAIN_TOLERANCE,
    vertex_tolerance: float = DEFAULT_VERTEX_TOLERANCE,
    memory_budget_gib: float | None = None,
    replicate_halo_features: bool = False,
    features_layout: str = "npy",
    overwrite: bool = False,
    progress: Progress | None = None,
    part_of: np.ndarray | None = None,
    extra_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Partition ``graph`` into ``parts`` parts and write them to ``out_dir``.

    Args:
        method: ``"metis"`` (min edge cut, balanced vertices and training vertices),
            ``"random"`` (balanced, for graphs METIS cannot hold in memory) or
            ``"parmetis"`` (the assignment ``part_of`` computed by an MPI job,
            :mod:`distmb.partition.distributed`) or ``"assignment"`` (``part_of`` computed
            elsewhere, ``--assignment FILE``).
        seed: makes the output byte-identical across runs.
        balance_edges: also balance in-edges per part (a third METIS constraint).
        train_tolerance: after METIS, move training vertices until max/mean <= 1 + this.
        vertex_tolerance: then move other vertices until the vertex counts' max/mean is
            at most 1 + this.
        memory_budget_gib: when the process with METIS would exceed it
            (:func:`~distmb.partition.assign.metis_memory_bytes`: the graph with its
            features, METIS per vertex and per adjacency entry), METIS partitions the
            uniform sample of the edges that fits (default: 60 % of physical memory). The
            share used is recorded in ``partition.json`` and affects the output, so pass it
            explicitly to reproduce a partition on a machine with another memory size.
        replicate_halo_features: store each part's halo features too.
        features_layout: ``"npy"`` or ``"ooc"`` (aligned raw row files for out-of-core
            reads, ``--features ooc``).
        overwrite: replace an existing ``out_dir``.
        part_of: int[num_nodes] part of every vertex, computed elsewhere (``parmetis``,
            ``assignment``); it is rebalanced like METIS' and recorded as ``method``.
        extra_options: more entries for ``partition.json``'s ``partitioner`` record.

    Returns:
        The metadata written to ``partition.json``.
    """
    log = progress or Progress(quiet=True)
    check_partition_args(graph.num_nodes, parts, out_dir, method=method, overwrite=overwrite)
    budget = check_rebalance_args(train_tolerance, vertex_tolerance, memory_budget_gib)
    if (part_of is None) == (method in GIVEN_METHODS):
        raise InputError(
            f"part_of is given exactly when method is {' or '.join(map(repr, GIVEN_METHODS))}"
        )
    fraction = 1.0
    if part_of is None:
        # The engines work on their own copy of the adjacency: the graph's indices and
        # features wait in memory-mapped files meanwhile (distmb.partition.spill).
        spill = spilled(graph, log) if method in ENGINES and parts > 1 else nullcontext([])
        with spill:
            if method == "metis":
                fraction = metis_edge_fraction(graph, budget * 2**30, parts)
            if fraction < 1.0:
                log(
                    f"METIS would exceed the {budget:.1f} GiB memory budget: it partitions a "
                    f"uniform {100 * fraction:.0f} % sample of the edges (--memory-budget to "
                    "change)"
                )
            log(f"assigning {graph.num_nodes} vertices to {parts} parts ({method}, seed {seed})")
            part_of = assign_parts(
                graph,
                parts,
                method=method,
                seed=seed,
                balance_edges=balance_edges,
                metis_edge_fraction=fraction,
            )
        log(f"{method} done; peak memory so far {peak_rss_bytes() / 2**30:.2f} GiB")
    else:
        part_of = _checked_assignment(part_of, graph.num_nodes, parts)
    moved_train, moved_other = rebalance_train_and_vertices(
        graph, part_of, parts, train_tolerance=train_tolerance, vertex_tolerance=vertex_tolerance
    )
    log(f"assigned; rebalancing moved {moved_train} training and {moved_other} other vertices")
    options = partitioner_record(
        method=method,
        seed=seed,
        balance_edges=balance_edges,
        train_tolerance=train_tolerance,
        vertex_tolerance=vertex_tolerance,
        memory_budget_gib=budget,
        metis_edge_fraction=fraction,
        moved=(moved_train, moved_other),
        extra_options=extra_options,
    )
    meta = write_partition(
        graph,
        part_of,
        out_dir,
        parts=parts,
        partitioner=options,
        replicate_halo_features=replicate_halo_features,
        features_layout=features_layout,
        overwrite=overwrite,
        progress=log,
    )
    peak = meta["peak_memory"]
    log(
        f"wrote {out_dir}; peak memory {peak['peak_rss_bytes'] / 2**30:.2f} GiB = "
        f"{peak['bytes_per_edge']:.1f} bytes per directed edge "
        f"({peak['bytes_per_edge_beyond_features']:.1f} beyond the "
        f"{peak['feature_bytes'] / 2**30:.2f} GiB feature table)"
    )
    return meta


def check_rebalance_args(
    train_tolerance: float, vertex_tolerance: float, memory_budget_gib: float | None
) -> float:
    """Reject bad tolerances and budgets; return the budget in GiB (default filled in)."""
    for flag, value in (
        ("--train-tolerance", train_tolerance),
        ("--vertex-tolerance", vertex_tolerance),
    ):
        if not 0.0 <= value < 1.0:
            raise InputError(f"{flag} must be in [0, 1), got {value}")
    budget = default_memory_budget_gib() if memory_budget_gib is None else memory_budget_gib
    if not 0 < budget < math.inf:  # NaN fails too
        raise InputError(f"--memory-budget must be a finite number > 0 (GiB), got {budget}")
    return budget


def partitioner_record(
    *,
    method: str,
    seed: int,
    balance_edges: bool,
    train_tolerance: float,
    vertex_tolerance: float,
    memory_budget_gib: float,
    metis_edge_fraction: float,
    moved: tuple[int, int],
    extra_options: dict[str, Any] | None,
) -> dict[str, Any]:
    """``partition.json``'s ``partitioner`` record (the writer adds
    ``replicate_halo_features``); ``moved``: training and other vertices the rebalancing
    moved."""
    return {
        "method": method,
        "seed": seed,
        "balance_edges": balance_edges,
        "train_tolerance": train_tolerance,
        "vertex_tolerance": vertex_tolerance,
        "memory_budget_gib": memory_budget_gib,
        "metis_edge_fraction": round(metis_edge_fraction, 4),
        "train_vertices_moved": moved[0],
        "other_vertices_moved": moved[1],
        **(extra_options or {}),
    }


#: dtypes an ``--assignment`` file may hold.
ASSIGNMENT_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def load_assignment(
    path: str | os.PathLike[str], num_nodes: int, parts: int, flag: str = "--assignment"
) -> np.ndarray:
    """The vertex -> part assignment in ``path`` (a ``.npy`` of int32 or int64[num_nodes],
    every value in ``[0, parts)``; read without pickle) as int32[num_nodes].

    Raises:
        InputError: naming ``flag``, the file and what was expected.
    """
    part_of = open_assignment(path, parts, flag)
    if part_of.shape[0] != num_nodes:
        raise InputError(
            f"{flag} {path}: holds {part_of.shape[0]} parts but the graph has {num_nodes} "
            "vertices (one part per vertex, in vertex-id order)"
        )
    return np.array(part_of, dtype=np.int32)


def open_assignment(
    path: str | os.PathLike[str], parts: int, flag: str = "--assignment"
) -> np.ndarray:
    """The assignment file ``path`` memory-mapped and checked as far as that needs no graph
    (before a dataset is loaded): a readable ``.npy`` (no pickle) of one dimension, int32 or
    int64, every value in ``[0, parts)``. :func:`load_assignment` adds the length check.

    Returns:
        int32 or int64[n], read-only (a memory map).

    Raises:
        InputError: naming ``flag``, the file and what was expected.
    """
    where = f"{flag} {path}"
    try:
        part_of = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(
            f"{where}: not a readable .npy array of int32/int64 parts ({one_line(exc)})"
        ) from None
    if part_of.dtype.newbyteorder("=") not in ASSIGNMENT_DTYPES or part_of.ndim != 1:
        raise InputError(
            f"{where}: expected a one-dimensional int32 or int64 array (the part of every "
            f"vertex), got {part_of.dtype}{list(part_of.shape)}"
        )
    bad = np.flatnonzero((part_of < 0) | (part_of >= parts))
    if bad.size:
        v = int(bad[0])
        raise InputError(
            f"{where}: vertex {v} is in part {int(part_of[v])}, outside [0, {parts}) of "
            f"--parts {parts} ({bad.size} such vertices)"
        )
    return part_of


def assignment_record(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``partitioner`` entries recording an ``--assignment`` file: its absolute path and
    sha256."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(ASSIGNMENT_HASH_BYTES), b""):
            h.update(block)
    return {"assignment_file": str(Path(path).resolve()), "assignment_sha256": h.hexdigest()}


#: Bytes read at a time when hashing an ``--assignment`` file.
ASSIGNMENT_HASH_BYTES = 16 << 20


def _checked_assignment(part_of: np.ndarray, num_nodes: int, parts: int) -> np.ndarray:
    """A given assignment as int32[num_nodes] with every part in ``[0, parts)``."""
    part_of = np.asarray(part_of)
    if part_of.shape != (num_nodes,) or not np.issubdtype(part_of.dtype, np.integer):
        raise InputError(
            f"part_of must be int[{num_nodes}], got {part_of.dtype}{list(part_of.shape)}"
        )
    if num_nodes and (part_of.min() < 0 or part_of.max() >= parts):
        raise InputError(f"part_of holds parts outside [0, {parts})")
    return part_of.astype(np.int32)


def check_partition_args(
    num_nodes: int | None,
    parts: int,
    out_dir: str | os.PathLike[str],
    *,
    method: str,
    overwrite: bool,
) -> None:
    """Reject bad ``--parts``/``--method``/``--out`` before any expensive work."""
    if parts < 1:
        raise InputError(f"--parts must be >= 1, got {parts}")
    if num_nodes is not None and parts > num_nodes:
        raise InputError(f"--parts {parts} exceeds the graph's {num_nodes} vertices")
    if method not in METHODS + (ASSIGNMENT_METHOD,):
        raise InputError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise InputError(f"--out {out}: already exists; pass --overwrite to replace it")
    if out.exists():
        _check_replaceable(out)
    ancestor = out.resolve().parent
    while not ancestor.exists():  # missing parents are created when writing
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK):
        raise InputError(f"--out {out}: {ancestor} is not a writable directory")


def _check_replaceable(out: Path) -> None:
    """``--overwrite`` replaces only what this tool wrote: an empty directory, or a partition
    whose ``partition.json`` reads as this format and lists every file in it (besides its
    own verification stamps). Anything else in there could be a user's data.

    Raises:
        InputError: naming the first file that does not belong, or the unreadable metadata.
    """
    if not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory; refusing to replace it")
    if not any(out.iterdir()):
        return
    try:
        meta = read_meta(out)
    except PartitionError as exc:
        raise InputError(
            f"--out {out}: exists and is not a distmb partition ({exc}); refusing to replace it"
        ) from None
    listed = set(meta["files"]) | {META_FILE}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if path.is_dir() and rel in {part_dir_name(i) for i in range(meta["num_parts"])}:
            continue
        if path.name == STAMP_FILE and path.parent != out:
            continue
        if rel not in listed:
            raise InputError(
                f"--out {out}: holds {rel}, which is not part of the partition; refusing to "
                "replace it (move it away, or choose another --out)"
            )


def format_report(meta: dict[str, Any], graph_bytes: int | None = None) -> str:
    """The per-part table (solid, halo, train, edges, edge cut, halo ratio) and totals."""
    rows = [("part", "solid", "halo", "train", "val", "test", "in-edges", "edge cut", "halo/solid")]
    for i, c in enumerate(meta["parts"]):
        ratio = c["n_halo"] / c["n_solid"] if c["n_solid"] else float("nan")
        rows.append(
            (
                str(i),
                str(c["n_solid"]),
                str(c["n_halo"]),
                str(c["n_train"]),
                str(c["n_val"]),
                str(c["n_test"]),
                str(c["n_edges"]),
                str(c["cut_edges"]),
                f"{ratio:.3f}",
            )
        )
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    solid = np.array([c["n_solid"] for c in meta["parts"]], dtype=np.float64)
    train = np.array([c["n_train"] for c in meta["parts"]], dtype=np.float64)
    edges = np.array([c["n_edges"] for c in meta["parts"]], dtype=np.float64)
    cut, total = meta["edge_cut"], meta["num_edges"]
    lines.append(
        f"edge cut: {cut} of {total} in-edges ({100.0 * cut / max(total, 1):.2f} %); "
        f"max/mean balance: vertices {_imbalance(solid):.3f}, train {_imbalance(train):.3f}, "
        f"edges {_imbalance(edges):.3f}"
    )
    if graph_bytes:
        peak = peak_rss_bytes()
        lines.append(
            f"peak memory {peak / 2**30:.2f} GiB = {peak / graph_bytes:.1f}x the graph's "
            f"{graph_bytes / 2**30:.2f} GiB = {peak / max(total, 1):.1f} bytes per directed edge"
        )
    return "\n".join(lines)


def _imbalance(x: np.ndarray) -> float:
    return float(x.max() / x.mean()) if x.size and x.mean() > 0 else 1.0
