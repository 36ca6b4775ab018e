"""Writes a partition directory in format version 1 (see docs/partition-format.md).

Everything goes into a temporary sibling directory that is renamed onto the final name only
once every file and ``partition.json`` (with sha256 checksums) are complete, so a crash never
leaves a partition that looks valid.
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
    INT32_LIMIT,
    META_FILE,
    NODE_PART_FILE,
    OOC_FEATURE_FILE,
    part_dir_name,
)
from distmb.data.graph import Graph
from distmb.data.rowfile import write_row_file
from distmb.errors import InputError
from distmb.progress import Progress, meter


class _HashingWriter:
    """File wrapper that feeds every written byte to a sha256."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "wb")  # noqa: SIM115 - closed in save_npy
        self.sha = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        self.sha.update(data)
        return self.file.write(data)


def save_npy(path: Path, array: np.ndarray) -> str:
    """Save ``array`` as ``.npy`` (no pickle) and return the file's sha256 hex digest."""
    out = _HashingWriter(path)
    try:
        np.lib.format.write_array(out, np.ascontiguousarray(array), allow_pickle=False)
        out.file.flush()
        os.fsync(out.file.fileno())
    finally:
        out.file.close()
    return out.sha.hexdigest()


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


def _index_dtype(limit: int) -> type:
    return np.int32 if limit <= INT32_LIMIT else np.int64


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
    part_meta: list[dict[str, int]] = []
    halos: list[tuple[np.ndarray, np.ndarray]] = []  # (halo VID_o, halo owner) per part

    bar = meter("writing parts", parts, "parts", rate_unit="vertices")
    for p in range(parts):
        view = _C.extract_part(graph.indptr, graph.indices, part_of, p, scratch)
        solid, halo = view["solid"], view["halo"]
        n_solid, n_halo = solid.size, halo.size
        halo_owner = part_of[halo]
        orig_ids = np.concatenate([solid, halo])
        arrays: dict[str, np.ndarray] = {
            "indptr": view["indptr"],
            "indices": view["indices"].astype(_index_dtype(n_solid + n_halo)),
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
        if features_layout == "npy":
            arrays["features"] = graph.features[solid]
            if replicate_halo_features:
                arrays["halo_features"] = graph.features[halo]
        counts["n_edges"] = int(view["indices"].size)
        counts["cut_edges"] = int(view["cut_edges"])
        del view
        pdir = tmp / part_dir_name(p)
        pdir.mkdir()
        for name, arr in arrays.items():
            files[f"{part_dir_name(p)}/{name}.npy"] = save_npy(pdir / f"{name}.npy", arr)
        del arrays
        if features_layout == "ooc":
            rows = orig_ids if replicate_halo_features else solid
            info = write_row_file(pdir / OOC_FEATURE_FILE, graph.features[rows], atomic=False)
            files[f"{part_dir_name(p)}/{OOC_FEATURE_FILE}"] = info["sha256"]
            feature_file = ooc_feature_meta(info)
        halos.append((halo, halo_owner))
        part_meta.append(counts)
        log(f"part {p}: {n_solid} solid, {n_halo} halo, {counts['n_edges']} in-edges written")
        bar.update(1, items=n_solid + n_halo)
    bar.close()

    # Send lists: part i sends to part j the solid vertices of i that are halo in j.
    vid_p = local_ids(part_of, parts)
    for i in range(parts):
        chunks = [
            vid_p[halo[owner == i]] if j != i else np.zeros(0, np.int64)
            for j, (halo, owner) in enumerate(halos)
        ]
        send_ptr = np.zeros(parts + 1, dtype=np.int64)
        send_ptr[1:] = np.cumsum([c.size for c in chunks])
        send_ids = np.concatenate(chunks).astype(_index_dtype(part_meta[i]["n_solid"]))
        pdir = part_dir_name(i)
        files[f"{pdir}/send_ptr.npy"] = save_npy(tmp / pdir / "send_ptr.npy", send_ptr)
        files[f"{pdir}/send_ids.npy"] = save_npy(tmp / pdir / "send_ids.npy", send_ids)
        part_meta[i]["n_send"] = int(send_ids.size)
    log("send lists written")

    identity = graph.identity()
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
