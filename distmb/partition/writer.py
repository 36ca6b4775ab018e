"""Writes a partition directory in format version 1 (see docs/partition-format.md).

Everything goes into a temporary sibling directory that is renamed onto the final name only
once every file and ``partition.json`` (with sha256 checksums) are complete, so a crash never
leaves a partition that looks valid.

Memory: besides the graph, the writer holds one part's view at a time and a few per-vertex
arrays. Feature rows are streamed from the (possibly memory-mapped) table into each part's
file in chunks of :data:`FEATURE_CHUNK_BYTES`; every part's halo, grouped by owner, goes to a
scratch file and the send lists are assembled from those files at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distmb import _C
from distmb.core.errors import InputError, output_error
from distmb.core.progress import Progress, meter, peak_rss_bytes
from distmb.data.graph import Graph
from distmb.data.store.format import (
    FEATURE_LAYOUTS,
    FORMAT_VERSION,
    META_FILE,
    NODE_PART_FILE,
    OOC_FEATURE_FILE,
    index_dtype,
    part_dir_name,
)
from distmb.data.store.rowfile import RowTake, write_row_file
from distmb.partition.staging import remove_stale_staging, staging_path

#: Bytes of feature rows gathered and written at a time.
FEATURE_CHUNK_BYTES = 32 << 20

#: Sub-directory of the temporary partition for the halo lists of the send-list assembly;
#: removed before ``partition.json`` is written.
_SCRATCH_DIR = ".scratch"


class _HashingWriter:
    """File wrapper that feeds every written byte to a sha256."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "wb")  # noqa: SIM115 - closed by NpyWriter.close
        self.sha = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        self.sha.update(data)
        return self.file.write(data)


class NpyWriter:
    """Writes one ``.npy`` file (no pickle) from consecutive chunks, hashing as it goes.

    The bytes equal ``np.save`` of the whole array: header version 1.0 (what ``np.save``
    picks for every plain dtype) and the C-order data.

    Args:
        path: the file to create.
        dtype: the array's dtype.
        shape: the whole array's shape; the chunks are its consecutive leading-axis slices.
    """

    def __init__(self, path: Path, dtype: np.dtype | type, shape: tuple[int, ...]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.remaining = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.out = _HashingWriter(path)
        try:
            header = {
                "descr": np.lib.format.dtype_to_descr(self.dtype),
                "fortran_order": False,
                "shape": self.shape,
            }
            np.lib.format.write_array_header_1_0(self.out, header)
        except BaseException:
            self.out.file.close()
            raise

    def write(self, chunk: np.ndarray) -> None:
        """Append the next rows (``chunk.shape[1:]`` must match the array's)."""
        chunk = np.ascontiguousarray(chunk)
        if chunk.dtype != self.dtype or chunk.shape[1:] != self.shape[1:]:
            raise ValueError(
                f"{self.path}: chunk {chunk.dtype}{list(chunk.shape)} does not continue "
                f"{self.dtype}{list(self.shape)}"
            )
        if chunk.nbytes > self.remaining:
            raise ValueError(f"{self.path}: more rows than the declared shape {list(self.shape)}")
        self.remaining -= chunk.nbytes
        if chunk.nbytes:
            self.out.write(memoryview(chunk).cast("B"))

    def abort(self) -> None:
        """Close the file after a failure (the temporary directory is removed anyway)."""
        self.out.file.close()

    def close(self) -> str:
        """fsync and close; return the file's sha256 hex digest.

        Raises:
            ValueError: fewer rows were written than the shape declares.
        """
        try:
            if self.remaining:
                raise ValueError(f"{self.path}: {self.remaining} bytes short of {list(self.shape)}")
            self.out.file.flush()
            os.fsync(self.out.file.fileno())
        finally:
            self.out.file.close()
        return self.out.sha.hexdigest()


def save_npy(path: Path, array: np.ndarray) -> str:
    """Save ``array`` as ``.npy`` (no pickle) and return the file's sha256 hex digest."""
    array = np.ascontiguousarray(array)
    out = NpyWriter(path, array.dtype, array.shape)
    try:
        out.write(array)
    except BaseException:
        out.abort()
        raise
    return out.close()


def save_rows(path: Path, rows: RowTake) -> str:
    """Save the gathered rows ``rows`` as ``.npy`` in chunks of :data:`FEATURE_CHUNK_BYTES`;
    return the sha256 hex digest (the bytes equal :func:`save_npy` of ``rows[:]``)."""
    step = max(1, FEATURE_CHUNK_BYTES // max(rows.shape[1] * rows.dtype.itemsize, 1))
    out = NpyWriter(path, rows.dtype, rows.shape)
    try:
        for lo in range(0, rows.shape[0], step):
            out.write(rows[lo : lo + step])
    except BaseException:
        out.abort()
        raise
    return out.close()


def peak_memory_record(
    num_edges: int, feature_bytes: int, peak: int | None = None
) -> dict[str, float | int]:
    """``partition.json``'s ``peak_memory``: ``peak`` bytes (default: this process'
    high-water mark so far, Linux ``ru_maxrss``, loading the graph included), also per
    directed edge, in total and beyond the feature table."""
    peak = peak_rss_bytes() if peak is None else int(peak)
    edges = max(num_edges, 1)
    return {
        "peak_rss_bytes": peak,
        "feature_bytes": int(feature_bytes),
        "bytes_per_edge": round(peak / edges, 2),
        "bytes_per_edge_beyond_features": round((peak - feature_bytes) / edges, 2),
    }


def ooc_feature_meta(info: dict[str, Any]) -> dict[str, Any]:
    """``partition.json``'s ``feature_file`` entry for the ``ooc`` layout, from what
    :func:`~distmb.data.store.rowfile.write_row_file` returned (the same for every part: the
    row count of each part follows from its counts)."""
    return {
        "name": OOC_FEATURE_FILE,
        "dtype": info["dtype"],
        "row_stride": int(info["row_stride"]),
        "align": int(info["align"]),
    }


def local_ids(part_of: np.ndarray, parts: int) -> np.ndarray:
    """int64[num_nodes]: the VID_p of every vertex in its owning part (solid vertices are
    numbered in VID_o order within a part)."""
    order = np.argsort(part_of, kind="stable")
    starts = np.zeros(parts + 1, dtype=np.int64)
    starts[1:] = np.cumsum(np.bincount(part_of, minlength=parts))
    local = np.empty(part_of.shape[0], dtype=np.int64)
    local[order] = np.arange(part_of.shape[0], dtype=np.int64) - starts[part_of[order]]
    return local


def writable_tmp_dir(out: Path, tag: int) -> Path:
    """Create (empty) the temporary sibling ``.<name>.tmp-<host>-<tag>`` of ``out`` that a
    partition is written into before :func:`publish` renames it, after removing those of
    killed writers (:mod:`~distmb.partition.staging`); :class:`InputError` naming ``--out``."""
    tmp = staging_path(out, "tmp", tag)
    try:
        remove_stale_staging(out)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create {tmp} ({exc.strerror})") from None
    return tmp


def check_features_layout(features_layout: str) -> None:
    """:class:`InputError` unless ``features_layout`` is one of :data:`FEATURE_LAYOUTS`."""
    if features_layout not in FEATURE_LAYOUTS:
        raise InputError(
            f"--features-layout must be one of {', '.join(FEATURE_LAYOUTS)}, got "
            f"{features_layout!r}"
        )


def write_partition(
    graph: Graph,
    part_of: np.ndarray,
    out_dir: str | os.PathLike[str],
    *,
    parts: int,
    partitioner: dict[str, Any],
    replicate_halo_features: bool = False,
    features_layout: str = "npy",
    overwrite: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write ``graph`` split by ``part_of`` (int32[num_nodes]) into ``out_dir``.

    Args:
        partitioner: method, seed and options, recorded in ``partition.json``.
        replicate_halo_features: also store every part's halo features.
        features_layout: ``"npy"`` (``features.npy``, ``halo_features.npy``) or ``"ooc"``
            (one aligned raw row file per part, for out-of-core reads; see
            docs/partition-format.md).
        overwrite: replace an existing ``out_dir`` (the old one stays until the new one is
            complete).

    Returns:
        The metadata written to ``partition.json``.

    Raises:
        OutputError: ``cannot write partition OUT: REASON`` (a full disk, a quota, ...); the
            temporary directory is removed and an existing ``out_dir`` kept.
    """
    log = progress or Progress(quiet=True)
    check_features_layout(features_layout)
    out = Path(out_dir)
    tmp = writable_tmp_dir(out, os.getpid())
    try:
        meta = _write_all(
            graph, part_of, tmp, parts, partitioner, replicate_halo_features, features_layout, log
        )
        publish(tmp, out, overwrite)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):  # a full disk, a quota, ...: one line naming --out
            raise output_error("partition", out, exc) from exc
        raise
    return meta


@dataclass
class PartContext:
    """What every part's files are cut from besides the in-edges: per-vertex arrays of the
    whole graph (O(num_nodes) each; the distributed writer holds them on every rank).

    Attributes:
        tmp: the temporary partition directory (shared by all ranks when distributed).
        parts: number of parts P.
        part_of: int32[num_nodes], the part of every vertex.
        in_degree: int64[num_nodes], every vertex's in-degree in the whole graph.
        labels: int64[num_nodes].
        splits: ``{"train": int64[], "val": ..., "test": ...}`` ascending vertex ids.
        features: float32[num_nodes, F] (a memory map is read row range by row range).
        replicate_halo_features: also store every part's halo features.
        features_layout: ``"npy"`` or ``"ooc"``.
        vid_p: int64[num_nodes], every vertex's VID_p in its part (:func:`local_ids`).
        halo_dtype: dtype of the halo lists in the scratch files (fits every part's VID_p).
        scratch: int64[num_nodes] of -1, the work array of ``_C.extract_part``.
    """

    tmp: Path
    parts: int
    part_of: np.ndarray
    in_degree: np.ndarray
    labels: np.ndarray
    splits: dict[str, np.ndarray]
    features: np.ndarray
    replicate_halo_features: bool
    features_layout: str
    vid_p: np.ndarray
    halo_dtype: np.dtype
    scratch: np.ndarray

    @classmethod
    def create(
        cls,
        tmp: Path,
        part_of: np.ndarray,
        parts: int,
        *,
        in_degree: np.ndarray,
        labels: np.ndarray,
        splits: dict[str, np.ndarray],
        features: np.ndarray,
        replicate_halo_features: bool,
        features_layout: str,
    ) -> PartContext:
        """The context of a partition by ``part_of`` (the scratch directory exists after)."""
        n_solid_of = np.bincount(part_of, minlength=parts)
        (tmp / _SCRATCH_DIR).mkdir(exist_ok=True)
        return cls(
            tmp=tmp,
            parts=parts,
            part_of=part_of,
            in_degree=in_degree,
            labels=labels,
            splits=splits,
            features=features,
            replicate_halo_features=replicate_halo_features,
            features_layout=features_layout,
            vid_p=local_ids(part_of, parts),
            halo_dtype=index_dtype(int(n_solid_of.max(initial=0))),
            scratch=np.full(part_of.shape[0], -1, dtype=np.int64),
        )


@dataclass
class PartWritten:
    """What :func:`write_part` wrote for one part.

    Attributes:
        files: ``{relative path: sha256}`` of the part's files (send lists excepted).
        counts: the part's ``partition.json`` entry so far (``n_send`` is added later).
        halo_counts: int64[P], this part's halo vertices per owning part.
        feature_file: the ``ooc`` layout's ``feature_file`` entry, else None.
    """

    files: dict[str, str]
    counts: dict[str, int]
    halo_counts: np.ndarray
    feature_file: dict[str, Any] | None


def write_part(ctx: PartContext, indptr: np.ndarray, indices: np.ndarray, p: int) -> PartWritten:
    """Write part ``p``'s files (all but the send lists) into ``ctx.tmp``, and its halo grouped
    by owner into the scratch file the send lists are assembled from (:func:`write_send_list`).

    Args:
        indptr: int64[num_nodes + 1]; indices: int32|int64[indptr[-1]]: an in-edge CSR over
            all vertices that holds (at least) the complete rows of part ``p``'s vertices,
            ascending and distinct (other rows may be empty).
    """
    view = _C.extract_part(indptr, indices, ctx.part_of, p, ctx.scratch)
    solid, halo = view["solid"], view["halo"]
    n_solid, n_halo = solid.size, halo.size
    halo_owner = ctx.part_of[halo]
    orig_ids = np.concatenate([solid, halo])
    arrays: dict[str, np.ndarray] = {
        "indptr": view["indptr"],
        "indices": view["indices"],  # int32 when n_local fits (index_dtype), else int64
        "orig_ids": orig_ids,
        "halo_owner": halo_owner,
        "labels": ctx.labels[solid],
        "in_degree": ctx.in_degree[orig_ids],
    }
    counts = {"n_solid": n_solid, "n_halo": n_halo, "n_local": n_solid + n_halo}
    for split in ("train", "val", "test"):
        idx = ctx.splits[split]
        mine = idx[ctx.part_of[idx] == p]
        arrays[f"{split}_idx"] = np.searchsorted(solid, mine).astype(np.int64)
        counts[f"n_{split}"] = int(mine.size)
    counts["n_edges"] = int(view["indices"].size)
    counts["cut_edges"] = int(view["cut_edges"])
    del view
    rel = part_dir_name(p)
    pdir = ctx.tmp / rel
    pdir.mkdir()
    files: dict[str, str] = {}
    for name, arr in arrays.items():
        files[f"{rel}/{name}.npy"] = save_npy(pdir / f"{name}.npy", arr)
    del arrays
    feature_file = None
    if ctx.features_layout == "npy":
        files[f"{rel}/features.npy"] = save_rows(
            pdir / "features.npy", RowTake(ctx.features, solid)
        )
        if ctx.replicate_halo_features:
            files[f"{rel}/halo_features.npy"] = save_rows(
                pdir / "halo_features.npy", RowTake(ctx.features, halo)
            )
    else:
        rows = orig_ids if ctx.replicate_halo_features else solid
        info = write_row_file(pdir / OOC_FEATURE_FILE, RowTake(ctx.features, rows), atomic=False)
        files[f"{rel}/{OOC_FEATURE_FILE}"] = info["sha256"]
        feature_file = ooc_feature_meta(info)
    # This part's halo as VID_p in their owners, grouped by owner (VID_o order within).
    order = np.argsort(halo_owner, kind="stable")
    ctx.vid_p[halo[order]].astype(ctx.halo_dtype).tofile(_halo_file(ctx.tmp, p))
    halo_counts = np.bincount(halo_owner, minlength=ctx.parts).astype(np.int64)
    return PartWritten(files, counts, halo_counts, feature_file)


def _halo_file(tmp: Path, p: int) -> Path:
    """Part ``p``'s halo list in the scratch directory."""
    return tmp / _SCRATCH_DIR / f"halo-{p}.bin"


def write_send_list(
    tmp: Path, i: int, halo_counts: np.ndarray, halo_dtype: np.dtype, n_solid: int
) -> tuple[dict[str, str], int]:
    """Write part ``i``'s ``send_ids.npy`` and ``send_ptr.npy`` from every part's scratch file.

    Part ``i`` sends to part ``j`` the solid vertices of ``i`` that are halo in ``j``: group
    ``i`` of part ``j``'s scratch file.

    Args:
        halo_counts: int64[P, P], ``[j, i]``: halo vertices of part ``j`` owned by part ``i``.
        halo_dtype: dtype of the scratch files; n_solid: part ``i``'s solid vertices.

    Returns:
        (``{relative path: sha256}`` of the two files, the number of ids sent).
    """
    parts = halo_counts.shape[0]
    group_start = np.cumsum(halo_counts, axis=1) - halo_counts  # [j, i]: offset of group i
    send_ptr = np.zeros(parts + 1, dtype=np.int64)
    send_ptr[1:] = np.cumsum(halo_counts[:, i])
    rel = f"{part_dir_name(i)}/send_ids.npy"
    out = NpyWriter(tmp / rel, index_dtype(int(n_solid)), (int(send_ptr[-1]),))
    try:
        for j in range(parts):
            with open(_halo_file(tmp, j), "rb") as f:
                f.seek(int(group_start[j, i]) * halo_dtype.itemsize)
                chunk = np.fromfile(f, dtype=halo_dtype, count=int(halo_counts[j, i]))
            out.write(chunk.astype(out.dtype, copy=False))
    except BaseException:
        out.abort()
        raise
    files = {rel: out.close()}
    files[f"{part_dir_name(i)}/send_ptr.npy"] = save_npy(
        tmp / part_dir_name(i) / "send_ptr.npy", send_ptr
    )
    return files, int(send_ptr[-1])


def remove_scratch(tmp: Path) -> None:
    """Remove the scratch directory once every send list is written."""
    shutil.rmtree(tmp / _SCRATCH_DIR)


def _write_all(
    graph: Graph,
    part_of: np.ndarray,
    tmp: Path,
    parts: int,
    partitioner: dict[str, Any],
    replicate_halo_features: bool,
    features_layout: str,
    log: Progress,
) -> dict[str, Any]:
    files: dict[str, str] = {NODE_PART_FILE: save_npy(tmp / NODE_PART_FILE, part_of)}
    feature_file: dict[str, Any] | None = None
    ctx = PartContext.create(
        tmp,
        part_of,
        parts,
        in_degree=graph.in_degree(),
        labels=graph.labels,
        splits={s: getattr(graph, f"{s}_idx") for s in ("train", "val", "test")},
        features=graph.features,
        replicate_halo_features=replicate_halo_features,
        features_layout=features_layout,
    )
    # halo_counts[j, i]: halo vertices of part j owned by part i (the send list i -> j).
    halo_counts = np.zeros((parts, parts), dtype=np.int64)
    part_meta: list[dict[str, int]] = []

    bar = meter("writing parts", parts, "parts", rate_unit="vertices")
    for p in range(parts):
        written = write_part(ctx, graph.indptr, graph.indices, p)
        files.update(written.files)
        feature_file = written.feature_file or feature_file
        halo_counts[p] = written.halo_counts
        counts = written.counts
        part_meta.append(counts)
        log(
            f"part {p}: {counts['n_solid']} solid, {counts['n_halo']} halo, "
            f"{counts['n_edges']} in-edges written"
        )
        bar.update(1, items=counts["n_local"])
    bar.close()
    n_solid_of = np.bincount(part_of, minlength=parts)
    halo_dtype = ctx.halo_dtype
    del ctx

    for i in range(parts):
        sent, n_send = write_send_list(tmp, i, halo_counts, halo_dtype, int(n_solid_of[i]))
        files.update(sent)
        part_meta[i]["n_send"] = n_send
    remove_scratch(tmp)
    log("send lists written")

    feature_bytes = graph.num_nodes * graph.feat_dim * np.dtype(graph.features.dtype).itemsize
    meta = partition_meta(
        graph.identity(),
        partitioner={**partitioner, "replicate_halo_features": replicate_halo_features},
        features_layout=features_layout,
        feature_file=feature_file,
        part_meta=part_meta,
        files=files,
        notes=list(graph.notes),
        peak_memory=peak_memory_record(graph.num_edges, feature_bytes),
    )
    write_meta(tmp, meta)
    return meta


def partition_meta(
    identity: dict[str, Any],
    *,
    partitioner: dict[str, Any],
    features_layout: str,
    feature_file: dict[str, Any] | None,
    part_meta: list[dict[str, int]],
    files: dict[str, str],
    notes: list[str],
    peak_memory: dict[str, float | int],
) -> dict[str, Any]:
    """``partition.json``'s contents.

    Args:
        identity: :meth:`Graph.identity` of the partitioned graph (name, sizes, sha256).
        part_meta: every part's counts, in part order.
        files: ``{relative path: sha256}`` of every file of the partition.
    """
    return {
        "format_version": FORMAT_VERSION,
        "graph_name": identity["name"],
        "graph_sha256": identity["sha256"],
        "num_parts": len(part_meta),
        "num_nodes": identity["num_nodes"],
        "num_edges": identity["num_edges"],
        "feat_dim": identity["feat_dim"],
        "num_classes": identity["num_classes"],
        "partitioner": partitioner,
        "edge_cut": int(sum(m["cut_edges"] for m in part_meta)),
        "feature_layout": features_layout,
        **({"feature_file": feature_file} if feature_file is not None else {}),
        "parts": part_meta,
        "files": dict(sorted(files.items())),
        "notes": notes,
        "peak_memory": peak_memory,
    }


def write_meta(tmp: Path, meta: dict[str, Any]) -> None:
    """Write ``partition.json`` into ``tmp`` (flushed, renamed into place)."""
    meta_tmp = tmp / (META_FILE + ".tmp")
    with open(meta_tmp, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(meta_tmp, tmp / META_FILE)


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished temporary directory onto ``out`` (an existing ``out`` is put
    back when that fails)."""
    if out.exists():
        if not overwrite:
            raise FileExistsError(out)
        trash = staging_path(out, "old")
        os.replace(out, trash)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(trash, out)  # the previous partition back in place
            raise
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, out)
