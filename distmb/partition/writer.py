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
from pathlib import Path
from typing import Any

import numpy as np

from distmb import _C
from distmb.data.format import (
    FEATURE_LAYOUTS,
    FORMAT_VERSION,
    META_FILE,
    NODE_PART_FILE,
    OOC_FEATURE_FILE,
    index_dtype,
    part_dir_name,
)
from distmb.data.graph import Graph
from distmb.data.rowfile import RowTake, write_row_file
from distmb.errors import InputError
from distmb.progress import Progress, meter, peak_rss_bytes

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


def peak_memory_record(num_edges: int, feature_bytes: int) -> dict[str, float | int]:
    """``partition.json``'s ``peak_memory``: this process' high-water mark so far (Linux
    ``ru_maxrss``, loading the graph included), also per directed edge, in total and beyond
    the feature table."""
    peak = peak_rss_bytes()
    edges = max(num_edges, 1)
    return {
        "peak_rss_bytes": peak,
        "feature_bytes": int(feature_bytes),
        "bytes_per_edge": round(peak / edges, 2),
        "bytes_per_edge_beyond_features": round((peak - feature_bytes) / edges, 2),
    }


def ooc_feature_meta(info: dict[str, Any]) -> dict[str, Any]:
    """``partition.json``'s ``feature_file`` entry for the ``ooc`` layout, from what
    :func:`~distmb.data.rowfile.write_row_file` returned (the same for every part: the
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
    """
    log = progress or Progress(quiet=True)
    if features_layout not in FEATURE_LAYOUTS:
        raise InputError(
            f"--features-layout must be one of {', '.join(FEATURE_LAYOUTS)}, got "
            f"{features_layout!r}"
        )
    out = Path(out_dir)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create {tmp} ({exc.strerror})") from None
    try:
        meta = _write_all(
            graph, part_of, tmp, parts, partitioner, replicate_halo_features, features_layout, log
        )
        _publish(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


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
    in_degree = graph.in_degree()
    scratch = np.full(graph.num_nodes, -1, dtype=np.int64)
    vid_p = local_ids(part_of, parts)
    n_solid_of = np.bincount(part_of, minlength=parts)
    # halo_counts[j, i]: halo vertices of part j owned by part i (the send list i -> j).
    halo_counts = np.zeros((parts, parts), dtype=np.int64)
    group_dtype = index_dtype(int(n_solid_of.max(initial=0)))
    scratch_dir = tmp / _SCRATCH_DIR
    scratch_dir.mkdir()
    part_meta: list[dict[str, int]] = []

    bar = meter("writing parts", parts, "parts", rate_unit="vertices")
    for p in range(parts):
        view = _C.extract_part(graph.indptr, graph.indices, part_of, p, scratch)
        solid, halo = view["solid"], view["halo"]
        n_solid, n_halo = solid.size, halo.size
        halo_owner = part_of[halo]
        orig_ids = np.concatenate([solid, halo])
        arrays: dict[str, np.ndarray] = {
            "indptr": view["indptr"],
            "indices": view["indices"],  # int32 when n_local fits (index_dtype), else int64
            "orig_ids": orig_ids,
            "halo_owner": halo_owner,
            "labels": graph.labels[solid],
            "in_degree": in_degree[orig_ids],
        }
        counts = {"n_solid": n_solid, "n_halo": n_halo, "n_local": n_solid + n_halo}
        for split in ("train", "val", "test"):
            idx = getattr(graph, f"{split}_idx")
            mine = idx[part_of[idx] == p]
            arrays[f"{split}_idx"] = np.searchsorted(solid, mine).astype(np.int64)
            counts[f"n_{split}"] = int(mine.size)
        counts["n_edges"] = int(view["indices"].size)
        counts["cut_edges"] = int(view["cut_edges"])
        del view
        pdir = tmp / part_dir_name(p)
        pdir.mkdir()
        for name, arr in arrays.items():
            files[f"{part_dir_name(p)}/{name}.npy"] = save_npy(pdir / f"{name}.npy", arr)
        del arrays
        rel = part_dir_name(p)
        if features_layout == "npy":
            files[f"{rel}/features.npy"] = save_rows(
                pdir / "features.npy", RowTake(graph.features, solid)
            )
            if replicate_halo_features:
                files[f"{rel}/halo_features.npy"] = save_rows(
                    pdir / "halo_features.npy", RowTake(graph.features, halo)
                )
        else:
            rows = orig_ids if replicate_halo_features else solid
            info = write_row_file(
                pdir / OOC_FEATURE_FILE, RowTake(graph.features, rows), atomic=False
            )
            files[f"{rel}/{OOC_FEATURE_FILE}"] = info["sha256"]
            feature_file = ooc_feature_meta(info)
        # This part's halo as VID_p in their owners, grouped by owner (VID_o order within).
        order = np.argsort(halo_owner, kind="stable")
        vid_p[halo[order]].astype(group_dtype).tofile(scratch_dir / f"halo-{p}.bin")
        halo_counts[p] = np.bincount(halo_owner, minlength=parts)
        del order, orig_ids, solid, halo, halo_owner
        part_meta.append(counts)
        log(f"part {p}: {n_solid} solid, {n_halo} halo, {counts['n_edges']} in-edges written")
        bar.update(1, items=n_solid + n_halo)
    bar.close()
    del in_degree, scratch, vid_p

    # Send lists: part i sends to part j the solid vertices of i that are halo in j, which is
    # group i of part j's scratch file.
    group_start = np.cumsum(halo_counts, axis=1) - halo_counts  # [j, i]: offset of group i
    for i in range(parts):
        send_ptr = np.zeros(parts + 1, dtype=np.int64)
        send_ptr[1:] = np.cumsum(halo_counts[:, i])
        rel = f"{part_dir_name(i)}/send_ids.npy"
        out = NpyWriter(tmp / rel, index_dtype(int(n_solid_of[i])), (int(send_ptr[-1]),))
        try:
            for j in range(parts):
                with open(scratch_dir / f"halo-{j}.bin", "rb") as f:
                    f.seek(int(group_start[j, i]) * group_dtype.itemsize)
                    chunk = np.fromfile(f, dtype=group_dtype, count=int(halo_counts[j, i]))
                out.write(chunk.astype(out.dtype, copy=False))
        except BaseException:
            out.abort()
            raise
        files[rel] = out.close()
        files[f"{part_dir_name(i)}/send_ptr.npy"] = save_npy(
            tmp / part_dir_name(i) / "send_ptr.npy", send_ptr
        )
        part_meta[i]["n_send"] = int(send_ptr[-1])
    shutil.rmtree(scratch_dir)
    log("send lists written")

    identity = graph.identity()
    feature_bytes = graph.num_nodes * graph.feat_dim * np.dtype(graph.features.dtype).itemsize
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "graph_name": graph.name,
        "graph_sha256": identity["sha256"],
        "num_parts": parts,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "feat_dim": graph.feat_dim,
        "num_classes": graph.num_classes,
        "partitioner": {**partitioner, "replicate_halo_features": replicate_halo_features},
        "edge_cut": int(sum(m["cut_edges"] for m in part_meta)),
        "feature_layout": features_layout,
        **({"feature_file": feature_file} if feature_file is not None else {}),
        "parts": part_meta,
        "files": dict(sorted(files.items())),
        "notes": list(graph.notes),
        "peak_memory": peak_memory_record(graph.num_edges, feature_bytes),
    }
    meta_tmp = tmp / (META_FILE + ".tmp")
    with open(meta_tmp, "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(meta_tmp, tmp / META_FILE)
    return meta


def _publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished temporary directory onto ``out``."""
    if out.exists():
        if not overwrite:
            raise FileExistsError(out)
        trash = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, trash)
        os.replace(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, out)
