"""Writing a partition as an MPI job: every rank writes its own parts, no rank holds the graph.

Given an assignment (int32[N], the same on every rank: from ParMETIS, ``--method parmetis``,
or from a file, ``--assignment``) and a dataset whose edges can be read in slices
(:data:`~distmb.partition.collective.SLICED_KINDS`), under ``mpiexec -n R``:

1. **Rows by vertex range.** Every rank reads its ``E/R`` slice of the memory-mapped edges in
   chunks of :data:`ROUTE_CHUNK` edges and sends every in-edge entry (``u`` in row ``v`` for
   an edge ``u -> v``, and ``v`` in row ``u`` when symmetrising; self-loops dropped) to the
   rank owning ``v``'s vertex range (``vtxdist``, ParMETIS' ranges), one ``Alltoallv`` per
   chunk. Each rank builds its rows with the loader's own
   :func:`~distmb.data.csr.build_csr` (rows sorted and de-duplicated), so row ``v`` equals
   the single-node loader's row ``v``.
2. **Identity.** The rows' lengths are all-gathered (``in_degree`` int64[N] on every rank);
   rank 0 hashes ``indptr``, every rank's indices in rank order (streamed to it in chunks of
   :data:`HASH_CHUNK`), then the labels: ``graph_sha256`` equals :meth:`Graph.identity`'s.
3. **Rebalancing.** Every rank runs the single-node rebalancing
   (:func:`~distmb.partition.assign.rebalance_assignment`) on its copy of the assignment;
   the neighbour part counts of the candidates are computed by the ranks holding their rows
   and all-gathered, so every rank makes exactly the single-node moves.
4. **Rows by part.** The rows are routed again, to the rank that writes their vertex's part:
   part ``p`` is written by rank ``p % R`` (:func:`writer_rank`; with fewer parts than ranks
   the last ranks write nothing). It builds the CSR of its parts' rows and writes each part
   with the single-node writer's :func:`~distmb.partition.writer.write_part` into the
   temporary directory rank 0 created (its name is broadcast; ``--out`` must be on a file
   system all ranks share), then its parts' send lists
   (:func:`~distmb.partition.writer.write_send_list`, from the halo scratch files of all
   parts).
5. **Publishing.** Rank 0 gathers the parts' counts and checksums, writes ``partition.json``
   and renames the directory onto ``--out``. An error on any rank is raised on every rank
   (:func:`~distmb.partition.collective.collective`) and the temporary directory is removed:
   never a partition that looks valid.

Memory per rank (docs/partitioning-at-scale.md): its ``E/R`` rows twice at most (by range,
then by part, in :func:`~distmb.data.store.format.index_dtype` ids: int32 below 2**31 vertices),
one route chunk, and per-vertex arrays of the whole graph: the assignment (int32), two
``indptr`` (int64), ``in_degree``, VID_p and the writer's scratch (int64), labels (int64).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from distmb.core.errors import InputError
from distmb.core.progress import Progress, peak_rss_bytes
from distmb.data.csr import EDGE_CHUNK, CsrBuild, build_csr, build_note, csr_edge_chunks
from distmb.data.graph import Graph, graph_sha256, sparse_class_notes
from distmb.data.store.format import NODE_PART_FILE, index_dtype
from distmb.partition.assign import neighbour_part_counts, rebalance_assignment
from distmb.partition.collective import collective, read_sliced, vertex_ranges
from distmb.partition.pipeline import (
    check_partition_args,
    check_rebalance_args,
    partitioner_record,
)
from distmb.partition.writer import (
    PartContext,
    check_features_layout,
    partition_meta,
    peak_memory_record,
    publish,
    remove_scratch,
    save_npy,
    writable_tmp_dir,
    write_meta,
    write_part,
    write_send_list,
)

#: Edges a rank reads and routes per ``Alltoallv`` round (bounds the send and receive
#: buffers of one round: at most twice this many entries when symmetrising).
ROUTE_CHUNK = EDGE_CHUNK
#: In-edge entries per message when streaming a rank's rows to rank 0 for the identity hash.
HASH_CHUNK = 1 << 22
#: MPI tag of the identity-hash stream.
_HASH_TAG = 77

#: ``(destination rank, source ids, target ids)`` of a round's in-edge entries.
Piece = tuple[np.ndarray, np.ndarray, np.ndarray]


def writer_rank(part: np.ndarray | int, ranks: int) -> np.ndarray | int:
    """The rank that writes part ``part``: ``part % ranks`` (parts dealt round-robin)."""
    return part % ranks


def route(comm: Any, pieces: Iterable[Piece], dtype: np.dtype) -> list[tuple[np.ndarray, ...]]:
    """All-to-all exchange of in-edge entries, one ``Alltoallv`` round per piece.

    Rounds go on until no rank has a piece left (a rank out of pieces sends nothing), so the
    ranks may hold different numbers of pieces. Collective: every rank must call it.

    Args:
        pieces: ``(dest int64[m], src, dst)``, ``src``/``dst`` of ``dtype``: entry ``k`` goes
            to rank ``dest[k]``.

    Returns:
        The received ``(src, dst)`` chunks (a re-iterable edge source for
        :func:`~distmb.data.csr.build_csr`), empty rounds left out.
    """
    from mpi4py import MPI

    mpi_type = MPI.INT32_T if np.dtype(dtype) == np.int32 else MPI.INT64_T
    ranks = comm.size
    received: list[tuple[np.ndarray, ...]] = []
    pieces = iter(pieces)
    while True:
        piece = next(pieces, None)
        if not comm.allreduce(piece is not None, op=MPI.LOR):
            return received
        if piece is None:
            piece = (np.zeros(0, np.int64), np.zeros(0, dtype), np.zeros(0, dtype))
        dest, src, dst = piece
        order = np.argsort(dest, kind="stable")
        send_counts = np.bincount(dest, minlength=ranks).astype(np.int64)
        recv_counts = np.empty(ranks, dtype=np.int64)
        comm.Alltoall(send_counts, recv_counts)
        send_disp = np.cumsum(send_counts) - send_counts
        recv_disp = np.cumsum(recv_counts) - recv_counts
        out = []
        for values in (src, dst):
            got = np.empty(int(recv_counts.sum()), dtype=dtype)
            comm.Alltoallv(
                [np.ascontiguousarray(values[order], dtype=dtype), (send_counts, send_disp),
                 mpi_type],
                [got, (recv_counts, recv_disp), mpi_type],
            )  # fmt: skip
            out.append(got)
        if out[0].size:
            received.append(tuple(out))


def check_slice(src: np.ndarray, dst: np.ndarray, lo: int, hi: int, num_nodes: int, source: str):
    """:class:`InputError` naming ``source`` and the first edge of ``[lo, hi)`` with an
    endpoint outside ``[0, num_nodes)`` (read in chunks)."""
    for a in range(lo, hi, ROUTE_CHUNK):
        b = min(a + ROUTE_CHUNK, hi)
        s, d = np.asarray(src[a:b]), np.asarray(dst[a:b])
        bad = np.flatnonzero((s < 0) | (s >= num_nodes) | (d < 0) | (d >= num_nodes))
        if bad.size:
            e = a + int(bad[0])
            raise InputError(
                f"{source}: edge {e} ({int(src[e])} -> {int(dst[e])}) has an endpoint outside "
                f"the {num_nodes} vertices"
            )


class _SliceStats:
    """Self-loops dropped and entries sent by :func:`_slice_pieces`."""

    def __init__(self) -> None:
        self.self_loops = 0
        self.entries = 0


def _slice_pieces(
    src: np.ndarray,
    dst: np.ndarray,
    lo: int,
    hi: int,
    symmetrize: bool,
    dtype: np.dtype,
    vtxdist: np.ndarray,
    stats: _SliceStats,
) -> Iterator[Piece]:
    """The in-edge entries of edges ``[lo, hi)``, :data:`ROUTE_CHUNK` edges at a time, each
    to the rank owning its row (target) in ``vtxdist``."""
    for a in range(lo, hi, ROUTE_CHUNK):
        s = np.asarray(src[a : min(a + ROUTE_CHUNK, hi)]).astype(dtype)
        d = np.asarray(dst[a : min(a + ROUTE_CHUNK, hi)]).astype(dtype)
        keep = s != d
        stats.self_loops += int(keep.size - np.count_nonzero(keep))
        s, d = s[keep], d[keep]
        if symmetrize:
            s, d = np.concatenate([s, d]), np.concatenate([d, s])
        stats.entries += int(s.size)
        yield np.searchsorted(vtxdist, d, side="right") - 1, s, d


def _row_pieces(
    indptr: np.ndarray, indices: np.ndarray, part_of: np.ndarray, ranks: int
) -> Iterator[Piece]:
    """The entries of a CSR's rows, each to the rank writing its row's part."""
    for cols, rows in csr_edge_chunks(indptr, indices, ROUTE_CHUNK)():
        yield writer_rank(part_of[rows].astype(np.int64), ranks), cols, rows


def _csr_of(received: list[tuple[np.ndarray, ...]], num_nodes: int, dtype: np.dtype) -> CsrBuild:
    """The in-edge CSR (over all ``num_nodes`` vertices) of the entries :func:`route`
    received, which are released (the list is emptied) once it is built."""
    build = build_csr(lambda: iter(received), num_nodes, symmetrize=False, dtype=dtype)
    received.clear()
    return build


def _allgather_rows(comm: Any, rows: np.ndarray) -> np.ndarray:
    """Every rank's int64[k_r, c] ``rows`` stacked in rank order, on every rank."""
    from mpi4py import MPI

    width = rows.shape[1]
    sizes = np.array(comm.allgather(int(rows.size)), dtype=np.int64)
    out = np.empty((int(sizes.sum()) // max(width, 1), width), dtype=np.int64)
    comm.Allgatherv(
        np.ascontiguousarray(rows, dtype=np.int64),
        [out, (sizes, np.cumsum(sizes) - sizes), MPI.INT64_T],
    )
    return out


def _identity_sha256(
    comm: Any, build: CsrBuild, vtxdist: np.ndarray, in_degree: np.ndarray, labels: np.ndarray
) -> str | None:
    """:meth:`Graph.identity`'s sha256 on rank 0 (None elsewhere): each rank's rows (its
    vertex range) are streamed to rank 0 in rank order, :data:`HASH_CHUNK` at a time."""
    ranks, rank = comm.size, comm.rank
    starts = np.zeros(in_degree.shape[0] + 1, dtype=np.int64)
    np.cumsum(in_degree, out=starts[1:])
    sizes = starts[vtxdist[1:]] - starts[vtxdist[:-1]]
    if rank != 0:
        for a in range(0, int(sizes[rank]), HASH_CHUNK):
            chunk = np.ascontiguousarray(build.indices[a : a + HASH_CHUNK], dtype=np.int64)
            comm.Send(chunk, dest=0, tag=_HASH_TAG)
        return None

    def chunks() -> Iterator[np.ndarray]:
        for k in range(ranks):
            for a in range(0, int(sizes[k]), HASH_CHUNK):
                n = min(HASH_CHUNK, int(sizes[k]) - a)
                if k == 0:
                    yield build.indices[a : a + n]
                else:
                    buf = np.empty(n, dtype=np.int64)
                    comm.Recv(buf, source=k, tag=_HASH_TAG)
                    yield buf

    return graph_sha256(starts, chunks(), labels)


def partition_distributed(
    spec: str,
    parts: int,
    out_dir: str | os.PathLike[str],
    assignment: Callable[[int], np.ndarray],
    *,
    method: str,
    seed: int = 0,
    symmetrize: bool = True,
    balance_edges: bool = False,
    train_tolerance: float,
    vertex_tolerance: float,
    memory_budget_gib: float | None = None,
    replicate_halo_features: bool = False,
    features_layout: str = "npy",
    overwrite: bool = False,
    extra_options: dict[str, Any] | None = None,
    progress: Progress | None = None,
    comm: Any = None,
) -> dict[str, Any] | None:
    """Steps 1-5 of the module docstring on every rank of ``comm`` (default
    ``MPI.COMM_WORLD``); the output equals :func:`~distmb.partition.pipeline.partition_graph`
    of the loaded graph with ``part_of=assignment(num_nodes)`` (file by file;
    ``partition.json`` but for ``peak_memory`` and ``partitioner.writer_ranks``).

    Args:
        assignment: ``num_nodes -> int32[num_nodes]``, the same on every rank (called on
            every rank; may raise :class:`InputError`).
        method: recorded in ``partition.json`` (``"parmetis"`` or ``"assignment"``).
        Others: as for :func:`~distmb.partition.pipeline.partition_graph`.

    Returns:
        The ``partition.json`` metadata on rank 0, None on the other ranks.
    """
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    log = progress or Progress(quiet=True)
    ranks, rank = comm.size, comm.rank
    out = Path(out_dir)

    def say(message: str) -> None:
        if rank == 0:
            log(message)

    def setup() -> tuple[float, Any]:
        check_features_layout(features_layout)
        return check_rebalance_args(train_tolerance, vertex_tolerance, memory_budget_gib), None

    budget, _ = collective(comm, "distmb-partition", setup)
    data, notes, source, name = read_sliced(spec, comm, "distributed writing")
    num_nodes = int(data.labels.shape[0])
    dtype = index_dtype(num_nodes)

    def given() -> np.ndarray:
        check_partition_args(num_nodes, parts, out, method=method, overwrite=overwrite)
        return assignment(num_nodes)

    part_of = collective(comm, "the assignment", given)
    vtxdist = vertex_ranges(num_nodes, ranks)
    lo, hi = int(vtxdist[rank]), int(vtxdist[rank + 1])
    num_input = int(data.src.shape[0])
    e_lo, e_hi = (num_input * rank) // ranks, (num_input * (rank + 1)) // ranks
    collective(comm, source, lambda: check_slice(data.src, data.dst, e_lo, e_hi, num_nodes, source))

    say(f"routing {num_input} edges to the {ranks} ranks' vertex ranges")
    stats = _SliceStats()
    pieces = _slice_pieces(data.src, data.dst, e_lo, e_hi, symmetrize, dtype, vtxdist, stats)
    rows = _csr_of(route(comm, pieces, dtype), num_nodes, dtype)
    view = Graph(
        name=name,
        indptr=rows.indptr,
        indices=rows.indices,
        features=data.features,
        labels=data.labels,
        train_idx=data.train_idx,
        val_idx=data.val_idx,
        test_idx=data.test_idx,
        num_classes=data.num_classes,
        symmetric=symmetrize,
    )
    collective(comm, source, lambda: view.validate(source, feature_rows=(lo, hi)))
    counted = np.array([stats.self_loops, stats.entries, rows.indices.size], dtype=np.int64)
    self_loops, entries, kept = (int(x) for x in comm.allreduce(counted))
    notes = [
        *notes,
        build_note(num_input, self_loops, entries - kept, kept, symmetrize),
        *sparse_class_notes(data.labels, data.num_classes),
    ]

    in_degree = _allgather_rows(comm, np.diff(rows.indptr[lo : hi + 1]).reshape(-1, 1))[:, 0]
    sha = _identity_sha256(comm, rows, vtxdist, in_degree, data.labels)
    say("rows built and hashed; rebalancing")

    def neighbour_counts(cand: np.ndarray) -> np.ndarray:
        a, b = np.searchsorted(cand, [lo, hi])
        mine = neighbour_part_counts(rows.indptr, rows.indices, part_of, cand[a:b], parts)
        return _allgather_rows(comm, mine)

    moved = rebalance_assignment(
        part_of,
        parts,
        train_idx=data.train_idx,
        train_tolerance=train_tolerance,
        vertex_tolerance=vertex_tolerance,
        neighbour_counts=neighbour_counts,
    )
    say(f"rebalancing moved {moved[0]} training and {moved[1]} other vertices")
    received = route(comm, _row_pieces(rows.indptr, rows.indices, part_of, ranks), dtype)
    rows = view = None  # the rows by range are sent: only the received ones are held now
    mine = _csr_of(received, num_nodes, dtype)

    tmp_name = collective(
        comm, f"--out {out}", lambda: writable_tmp_dir(out, os.getpid()).name if rank == 0 else None
    )
    tmp = out.parent / comm.bcast(tmp_name, root=0)
    try:
        return _write_parts(
            comm,
            tmp,
            out,
            mine,
            part_of,
            parts,
            data=data,
            in_degree=in_degree,
            identity={
                "name": name,
                "num_nodes": num_nodes,
                "num_edges": kept,
                "feat_dim": int(data.features.shape[1]),
                "num_classes": data.num_classes,
                "sha256": sha,
            },
            notes=notes,
            partitioner=partitioner_record(
                method=method,
                seed=seed,
                balance_edges=balance_edges,
                train_tolerance=train_tolerance,
                vertex_tolerance=vertex_tolerance,
                memory_budget_gib=budget,
                metis_edge_fraction=1.0,
                moved=moved,
                extra_options={**(extra_options or {}), "writer_ranks": ranks},
            ),
            replicate_halo_features=replicate_halo_features,
            features_layout=features_layout,
            overwrite=overwrite,
            say=say,
        )
    except BaseException:
        if rank == 0:  # every rank has left the collective that failed: nothing writes now
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_parts(
    comm: Any,
    tmp: Path,
    out: Path,
    mine: CsrBuild,
    part_of: np.ndarray,
    parts: int,
    *,
    data: Any,
    in_degree: np.ndarray,
    identity: dict[str, Any],
    notes: list[str],
    partitioner: dict[str, Any],
    replicate_halo_features: bool,
    features_layout: str,
    overwrite: bool,
    say: Callable[[str], None],
) -> dict[str, Any] | None:
    """Step 4's writing and step 5 (module docstring) into ``tmp``, then ``out``."""
    ranks, rank = comm.size, comm.rank
    own = list(range(rank, parts, ranks))

    def write_own() -> tuple[PartContext, dict[int, Any]]:
        if not tmp.is_dir():
            raise InputError(
                f"--out {out}: rank {rank} does not see {tmp}, which rank 0 created; --out "
                "must be on a file system that every rank shares"
            )
        ctx = PartContext.create(
            tmp,
            part_of,
            parts,
            in_degree=in_degree,
            labels=data.labels,
            splits={"train": data.train_idx, "val": data.val_idx, "test": data.test_idx},
            features=data.features,
            replicate_halo_features=replicate_halo_features,
            features_layout=features_layout,
        )
        written = {}
        if rank == 0:
            written[-1] = save_npy(tmp / NODE_PART_FILE, part_of)
        for p in own:
            written[p] = write_part(ctx, mine.indptr, mine.indices, p)
            say(f"part {p}: written by rank {rank}")
        return ctx, written

    ctx, written = collective(comm, f"writing {out}", write_own)
    halo_counts = np.zeros((parts, parts), dtype=np.int64)
    for p in own:
        halo_counts[p] = written[p].halo_counts
    comm.Allreduce(halo_counts.copy(), halo_counts)  # every part's halo file is complete now
    n_solid_of = np.bincount(part_of, minlength=parts)

    def send_lists() -> dict[int, tuple[dict[str, str], int]]:
        return {
            i: write_send_list(tmp, i, halo_counts, ctx.halo_dtype, int(n_solid_of[i])) for i in own
        }

    sent = collective(comm, f"writing {out}", send_lists)
    mine_meta = {
        "parts": {p: (written[p].counts, written[p].files, sent[p]) for p in own},
        "feature_file": next((w.feature_file for p, w in written.items() if p >= 0), None),
        "node_part": written.get(-1),
        "peak": peak_rss_bytes(),
    }
    gathered = comm.gather(mine_meta, root=0)

    def finish() -> dict[str, Any] | None:
        if rank != 0:
            return None
        files: dict[str, str] = {NODE_PART_FILE: gathered[0]["node_part"]}
        part_meta: list[dict[str, int]] = [{} for _ in range(parts)]
        for g in gathered:
            for p, (counts, part_files, (send_files, n_send)) in g["parts"].items():
                part_meta[p] = {**counts, "n_send": n_send}
                files.update(part_files)
                files.update(send_files)
        peaks = [int(g["peak"]) for g in gathered]
        feature_bytes = (
            identity["num_nodes"] * identity["feat_dim"] * np.dtype(data.features.dtype).itemsize
        )
        peak = peak_memory_record(identity["num_edges"], feature_bytes, peak=max(peaks))
        meta = partition_meta(
            identity,
            partitioner={**partitioner, "replicate_halo_features": replicate_halo_features},
            features_layout=features_layout,
            feature_file=gathered[0]["feature_file"],
            part_meta=part_meta,
            files=files,
            notes=notes,
            peak_memory={**peak, "ranks": ranks, "peak_rss_bytes_per_rank": peaks},
        )
        remove_scratch(tmp)
        write_meta(tmp, meta)
        publish(tmp, out, overwrite)
        say(f"wrote {out}; peak memory per rank {max(peaks) / 2**30:.2f} GiB at most")
        return meta

    return collective(comm, f"writing {out}", finish)
