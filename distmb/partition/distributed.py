"""``distmb-partition --method parmetis``: the vertex assignment as an MPI job (ParMETIS).

For graphs whose METIS run does not fit one node (METIS needs about
:data:`~distmb.partition.assign.METIS_BYTES_PER_ENTRY` bytes per adjacency entry: ~400 GB
for ogbn-papers100M). Run under ``mpiexec -n R``; every rank:

1. memory-maps the dataset's edge arrays and reads only its slice of ``E/R`` edges
   (``ogb:DIR``: rank 0 converts the dataset into its cache first, the others then map it);
2. builds its rows of the distributed graph ParMETIS takes: rank ``r`` owns the vertices
   ``[vtxdist[r], vtxdist[r+1])`` (``R`` nearly equal ranges); each edge ``u -> v`` becomes
   the entries ``(v, u)`` and ``(u, v)`` (ParMETIS needs a symmetric graph), self-loops
   dropped, each sent (``Alltoallv``) to the rank owning its row, then sorted and
   de-duplicated;
3. weighs every vertex as the METIS path does: two balance constraints, 1 per vertex and 1
   per training vertex;
4. calls ``ParMETIS_V3_PartKway`` (:mod:`distmb.partition.parmetis`) and writes the parts of
   its own vertices into the shared assignment file (``int32[N]`` ``.npy`` beside ``--out``,
   plain writes at its offset).

Every rank then reads the assignment and the job goes on with the distributed writer
(:mod:`distmb.partition.distwrite`): the same rebalancing as the METIS path, every rank
writing its own parts, the usual format; no rank loads the whole graph. ``partition.json``
records ``method: parmetis`` and the ranks. An error on any rank is raised on every rank, so
none waits forever.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from distmb.core.errors import InputError
from distmb.partition.assign import METIS_UFACTOR
from distmb.partition.collective import collective, read_sliced, vertex_ranges
from distmb.partition.distwrite import partition_distributed

#: The assignment file's name beside ``--out``.
ASSIGNMENT_SUFFIX = ".node_part.npy"
#: ParMETIS' allowed imbalance per constraint (max/mean), the METIS path's ufactor.
PARMETIS_IMBALANCE = 1.0 + METIS_UFACTOR / 1000


def edge_slice(src: np.ndarray, dst: np.ndarray, rank: int, ranks: int) -> tuple[np.ndarray, ...]:
    """This rank's ``E/R`` edges of memory-mapped ``src``/``dst`` (only they are read)."""
    lo, hi = (src.shape[0] * rank) // ranks, (src.shape[0] * (rank + 1)) // ranks
    return np.array(src[lo:hi], dtype=np.int64), np.array(dst[lo:hi], dtype=np.int64)


def distributed_csr(
    comm: Any, src: np.ndarray, dst: np.ndarray, vtxdist: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows of the symmetric graph of all ranks' edges ``src[e] -> dst[e]``.

    Returns:
        (xadj int64[n_local + 1], adjncy int64[xadj[-1]]): the distinct neighbours of local
        vertex ``vtxdist[rank] + i`` are ``adjncy[xadj[i]:xadj[i+1]]``, ascending, global ids,
        no self-loops.
    """
    from mpi4py import MPI

    num_nodes = int(vtxdist[-1])
    for name, ids in (("source", src), ("target", dst)):
        if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
            raise ValueError(f"an edge {name} lies outside the {num_nodes} vertices")
    keep = src != dst
    rows = np.concatenate([dst[keep], src[keep]])
    cols = np.concatenate([src[keep], dst[keep]])
    del keep
    owner = np.searchsorted(vtxdist, rows, side="right") - 1
    order = np.argsort(owner, kind="stable")
    rows, cols, owner = rows[order], cols[order], owner[order]
    ranks = comm.size
    send_counts = np.bincount(owner, minlength=ranks).astype(np.int64)
    recv_counts = np.empty(ranks, dtype=np.int64)
    comm.Alltoall(send_counts, recv_counts)
    send_disp = np.concatenate([[0], np.cumsum(send_counts)[:-1]])
    recv_disp = np.concatenate([[0], np.cumsum(recv_counts)[:-1]])
    received = []
    for values in (rows, cols):
        out = np.empty(int(recv_counts.sum()), dtype=np.int64)
        comm.Alltoallv(
            [values, (send_counts, send_disp), MPI.INT64_T],
            [out, (recv_counts, recv_disp), MPI.INT64_T],
        )
        received.append(out)
    del rows, cols, owner
    local_rows, cols = received
    lo, hi = int(vtxdist[comm.rank]), int(vtxdist[comm.rank + 1])
    local_rows -= lo
    order = np.lexsort((cols, local_rows))
    local_rows, cols = local_rows[order], cols[order]
    distinct = np.ones(cols.size, dtype=bool)
    distinct[1:] = (local_rows[1:] != local_rows[:-1]) | (cols[1:] != cols[:-1])
    local_rows, cols = local_rows[distinct], cols[distinct]
    xadj = np.zeros(hi - lo + 1, dtype=np.int64)
    np.cumsum(np.bincount(local_rows, minlength=hi - lo), out=xadj[1:])
    return xadj, cols


def sliced_edges(spec: str, comm: Any) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """(src, dst memory-mapped int64[E], num_nodes, train_idx) of ``spec`` on every rank
    (:func:`read_sliced`)."""
    arrays, _, _, _ = read_sliced(spec, comm, "--method parmetis")
    return arrays.src, arrays.dst, int(arrays.labels.shape[0]), arrays.train_idx


def vertex_weights(train_idx: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """int64[hi - lo, 2]: 1 per vertex and 1 per training vertex (the METIS path's
    constraints), or int64[hi - lo, 1] when the graph has no training vertex."""
    in_range = train_idx[(train_idx >= lo) & (train_idx < hi)] - lo
    if train_idx.size == 0:
        return np.ones((hi - lo, 1), dtype=np.int64)
    weights = np.zeros((hi - lo, 2), dtype=np.int64)
    weights[:, 0] = 1
    weights[in_range, 1] = 1
    return weights


def assign_parmetis(
    comm: Any, spec: str, parts: int, out: Path, seed: int, log: Callable[[str], None]
) -> tuple[Path, dict[str, Any]]:
    """Run steps 1-4 of the module docstring on every rank.

    Returns:
        (the assignment file ``int32[N]``, the ``partitioner`` entries to record).
    """
    from distmb.partition import parmetis

    library = collective(comm, "--method parmetis", parmetis.load)
    src, dst, num_nodes, train_idx = sliced_edges(spec, comm)
    ranks, rank = comm.size, comm.rank
    if num_nodes < ranks:
        raise InputError(f"--method parmetis: {num_nodes} vertices for {ranks} ranks")
    vtxdist = vertex_ranges(num_nodes, ranks)
    lo, hi = int(vtxdist[rank]), int(vtxdist[rank + 1])
    xadj, adjncy = collective(
        comm,
        "distributed graph",
        lambda: distributed_csr(comm, *edge_slice(src, dst, rank, ranks), vtxdist),
    )
    weights = vertex_weights(train_idx, lo, hi)
    log(f"rank {rank}: {hi - lo} vertices, {adjncy.size} adjacency entries; ParMETIS")
    if parts == 1:
        cut, part = 0, np.zeros(hi - lo, dtype=np.int64)
    else:
        cut, part = collective(
            comm,
            f"{library.path}",
            lambda: library.part_kway(
                comm, vtxdist, xadj, adjncy, weights, parts, PARMETIS_IMBALANCE, seed
            ),
        )
    path = out.parent / f".{out.name}{ASSIGNMENT_SUFFIX}"
    create = (lambda: _create_assignment(path, num_nodes)) if rank == 0 else (lambda: None)
    collective(comm, str(path), create)
    collective(comm, str(path), lambda: _write_slice(path, lo, part.astype(np.int32)))
    options = {
        "parmetis_ranks": ranks,
        "parmetis_edge_cut": cut,
        "parmetis_imbalance": PARMETIS_IMBALANCE,
        "parmetis_idx_bits": 8 * library.idx.itemsize,
    }
    return path, options


def _create_assignment(path: Path, num_nodes: int) -> None:
    """An ``int32[num_nodes]`` ``.npy`` of zeros, written with plain writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        header = {"descr": "<i4", "fortran_order": False, "shape": (num_nodes,)}
        np.lib.format.write_array_header_1_0(f, header)
        f.truncate(f.tell() + 4 * num_nodes)
        f.flush()
        os.fsync(f.fileno())


def _write_slice(path: Path, lo: int, part: np.ndarray) -> None:
    """Write ``part`` (int32) at vertex ``lo`` of the assignment file."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        header = size - 4 * int(np.load(path, mmap_mode="r").shape[0])
        f.seek(header + 4 * lo)
        f.write(part.astype("<i4").tobytes())
        f.flush()
        os.fsync(f.fileno())


def read_assignment(path: Path) -> np.ndarray:
    """The assignment file as int32[N] in memory."""
    return np.load(path, allow_pickle=False)


def partition_parmetis(
    spec: str,
    parts: int,
    out: str | os.PathLike[str],
    *,
    seed: int,
    symmetrize: bool,
    log: Callable[[str], None],
    **write_options: Any,
) -> dict[str, Any] | None:
    """The whole ``--method parmetis`` job on ``MPI.COMM_WORLD`` (module docstring): the
    assignment, then the distributed writer
    (:func:`~distmb.partition.distwrite.partition_distributed`).

    Returns:
        The ``partition.json`` metadata on rank 0; None on the other ranks.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = Path(out)
    path, options = assign_parmetis(comm, spec, parts, out, seed, log)
    try:
        return partition_distributed(
            spec,
            parts,
            out,
            lambda _num_nodes: read_assignment(path),
            method="parmetis",
            seed=seed,
            symmetrize=symmetrize,
            extra_options=options,
            progress=log,
            comm=comm,
            **write_options,
        )
    finally:
        comm.Barrier()  # every rank has read the assignment
        if comm.rank == 0:
            path.unlink(missing_ok=True)
