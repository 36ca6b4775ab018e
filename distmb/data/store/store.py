"""One part of a partition directory, memory-mapped and validated."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np

from distmb.core.atomic import write_atomic
from distmb.core.errors import PartitionError
from distmb.data.store.format import (
    FEATURE_LAYOUTS,
    FORMAT_VERSION,
    META_FILE,
    NODE_PART_FILE,
    NPY_FEATURE_ARRAYS,
    NPY_READ_ERRORS,
    OOC_FEATURE_FILE,
    PART_ARRAYS,
    ArraySpec,
    part_dir_name,
)
from distmb.data.store.rowfile import RowFile

#: Bytes read per step when verifying checksums.
_HASH_BLOCK = 1 << 24

#: Per part: the files last verified (size, mtime, sha256), so later opens skip the hashing
#: while nothing changed. Not listed in ``partition.json``; a stale or foreign stamp only
#: costs a new verification.
STAMP_FILE = ".verified.json"

#: Rows per step when checking features for NaN/Inf.
_FINITE_ROWS = 1 << 16

#: ``verify`` of :class:`PartitionStore`: ``"auto"`` hashes and range-checks a part's files
#: unless its stamp shows these very files (same size and mtime) passed before; ``"always"``
#: ignores the stamp; ``"never"`` (``--no-verify``) skips the hashing and the features' scan,
#: not the cheap range checks of the ids (unless the stamp vouches for the files).
Verify = Literal["auto", "always", "never"]

_REQUIRED_META = (
    "format_version",
    "graph_name",
    "graph_sha256",
    "num_parts",
    "num_nodes",
    "num_edges",
    "feat_dim",
    "num_classes",
    "partitioner",
    "parts",
    "files",
)
_PART_COUNTS = (
    "n_solid",
    "n_halo",
    "n_local",
    "n_edges",
    "n_train",
    "n_val",
    "n_test",
    "n_send",
)


def read_meta(directory: str | Path) -> dict[str, Any]:
    """Read and check ``DIR/partition.json``; raise :class:`PartitionError` naming the file."""
    path = Path(directory) / META_FILE
    if not Path(directory).is_dir():
        raise PartitionError(f"{directory}: not a partition directory (no such directory)")
    try:
        with open(path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise PartitionError(f"{path}: missing; is {directory} a distmb partition?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PartitionError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise PartitionError(f"{path}: expected a JSON object")
    missing = [k for k in _REQUIRED_META if k not in meta]
    if missing:
        raise PartitionError(f"{path}: missing keys {missing}")
    if meta["format_version"] != FORMAT_VERSION:
        raise PartitionError(
            f"{path}: format version {meta['format_version']}, this distmb reads version "
            f"{FORMAT_VERSION}; re-run distmb-partition"
        )
    if not isinstance(meta["parts"], list) or len(meta["parts"]) != meta["num_parts"]:
        raise PartitionError(f"{path}: 'parts' must list num_parts={meta['num_parts']} entries")
    return meta


def _check_range(path: Path, values: np.ndarray, lo: int, hi: int) -> None:
    """Raise naming ``path``, the first offending index and the bound ``[lo, hi)``."""
    arr = np.asarray(values)
    if not arr.size:
        return
    if int(arr.min()) >= lo and int(arr.max()) < hi:
        return
    i = int(np.argmax((arr < lo) | (arr >= hi)))
    raise PartitionError(f"{path}: value {int(arr[i])} at index {i} is outside [{lo}, {hi})")


def _read_stamp(path: Path) -> dict[str, list] | None:
    try:
        with open(path) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return None
    return stamp.get("files") if isinstance(stamp, dict) else None


def _write_stamp(path: Path, files: dict[str, list]) -> None:
    text = json.dumps({"files": files})
    try:
        write_atomic(path, lambda f: f.write(text.encode()))
    except OSError:
        pass  # read-only partition: verified again next time


def sha256_file(path: Path) -> str:
    """sha256 hex digest of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


class PartitionStore:
    """Part ``part`` of the partition in ``directory`` (format version 1), memory-mapped.

    Arrays (see docs/partition-format.md; ``VID_p``: solid ``[0, n_solid)``, then halo):
        indptr: int64[n_solid + 1], in-edge CSR of the solid vertices.
        indices: int32 or int64[n_edges], sources as VID_p.
        orig_ids: int64[n_local], VID_o of every local vertex.
        halo_owner: int32[n_halo], part owning each halo vertex.
        features: float32[n_solid, feat_dim]; labels: int64[n_solid].
        train_idx, val_idx, test_idx: int64, VID_p of solid vertices.
        in_degree: int64[n_local], in-degree in the whole graph.
        send_ptr: int64[num_parts + 1], send_ids: int32 or int64[n_send]; the solid
            vertices that part j holds as halo are ``send_ids[send_ptr[j]:send_ptr[j+1]]``.
        halo_features: float32[n_halo, feat_dim] or None (``--replicate-halo-features``).
        feature_layout: ``"npy"`` (the two arrays above are ``.npy`` files) or ``"ooc"``
            (one aligned raw row file, :attr:`feature_file`; ``features`` and
            ``halo_features`` are then read-only memory maps of it).
        feature_file: the ``ooc`` layout's :class:`~distmb.data.store.rowfile.RowFile` (solid
            rows, then halo rows when replicated), else None.

    Args:
        directory: the partition directory (holds ``partition.json``).
        part: which part to open, in ``[0, num_parts)``.
        verify: check every file's sha256 against ``partition.json`` and every array's
            values against its bounds (ids inside their ranges, ``indptr`` non-decreasing,
            features finite): ``"auto"`` (default) once per version of the files, recorded in
            a stamp; ``"always"`` (or True); ``"never"`` (or False): no sha256 and no scan of
            the features, but the ids' range checks still (one pass over the id arrays).

    Raises:
        PartitionError: naming the file and what was expected, for a missing, truncated,
            mistyped, altered (sha256) or out-of-range file, and the index and bound.
    """

    indptr: np.ndarray
    indices: np.ndarray
    orig_ids: np.ndarray
    halo_owner: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    in_degree: np.ndarray
    send_ptr: np.ndarray
    send_ids: np.ndarray
    halo_features: np.ndarray | None

    def __init__(self, directory: str | Path, part: int, *, verify: Verify | bool = "auto") -> None:
        self.directory = Path(directory)
        self.meta = read_meta(self.directory)
        self.num_parts = int(self.meta["num_parts"])
        if not 0 <= part < self.num_parts:
            raise PartitionError(
                f"{self.directory}: part {part} requested, the partition has parts "
                f"0..{self.num_parts - 1}"
            )
        self.part = part
        counts = self.meta["parts"][part]
        missing = [k for k in _PART_COUNTS if k not in counts]
        if missing:
            raise PartitionError(f"{self.directory / META_FILE}: part {part} lacks {missing}")
        self.counts: dict[str, int] = {k: int(counts[k]) for k in _PART_COUNTS}
        self.feat_dim = int(self.meta["feat_dim"])
        self.num_classes = int(self.meta["num_classes"])
        mode = {True: "always", False: "never"}.get(verify, verify)  # type: ignore[arg-type]
        if mode not in ("auto", "always", "never"):
            raise ValueError(f"verify must be 'auto', 'always' or 'never', got {verify!r}")
        self.verify = mode
        self.feature_layout = str(self.meta.get("feature_layout", "npy"))
        if self.feature_layout not in FEATURE_LAYOUTS:
            raise PartitionError(
                f"{self.directory / META_FILE}: feature_layout {self.feature_layout!r}, "
                f"expected one of {', '.join(FEATURE_LAYOUTS)}"
            )
        self.feature_file: RowFile | None = None
        for spec in PART_ARRAYS:
            if self.feature_layout == "ooc" and spec.name in NPY_FEATURE_ARRAYS:
                continue
            setattr(self, spec.name, self._open(spec))
        if self.feature_layout == "ooc":
            self._open_feature_file()
        self._check_consistency()
        if mode != "never":
            self._verify(use_stamp=mode == "auto")
        elif not self._stamp_vouches(self._seen_files()):
            self._check_ids()  # cheap: no hashing, no scan of the features

    # -- sizes -----------------------------------------------------------------------------
    @property
    def n_solid(self) -> int:
        return self.counts["n_solid"]

    @property
    def n_halo(self) -> int:
        return self.counts["n_halo"]

    @property
    def n_local(self) -> int:
        return self.counts["n_local"]

    def send_list(self, peer: int) -> np.ndarray:
        """VID_p of this part's solid vertices that ``peer`` holds as halo vertices."""
        return self.send_ids[self.send_ptr[peer] : self.send_ptr[peer + 1]]

    def graph_identity(self) -> dict[str, Any]:
        """Name, sizes and sha256 of the graph this partition was made from."""
        keys = ("graph_name", "graph_sha256", "num_nodes", "num_edges", "feat_dim", "num_classes")
        return {k: self.meta[k] for k in keys}

    # -- loading ---------------------------------------------------------------------------
    def node_part(self) -> np.ndarray:
        """int32[num_nodes]: the owning part of every ``VID_o`` (the partition-wide
        ``node_part.npy``, memory-mapped).

        Raises:
            PartitionError: the file is missing, unreadable, of another dtype or shape, or
                names a part outside ``[0, num_parts)``.
        """
        path = self.directory / NODE_PART_FILE
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except NPY_READ_ERRORS as exc:
            raise PartitionError(f"{path}: missing or unreadable .npy file ({exc})") from None
        expected = (int(self.meta["num_nodes"]),)
        if arr.dtype != np.int32 or arr.shape != expected:
            raise PartitionError(
                f"{path}: {arr.dtype}{list(arr.shape)}, expected int32{list(expected)}"
            )
        if arr.size and not (0 <= int(arr.min()) and int(arr.max()) < self.num_parts):
            raise PartitionError(f"{path}: part ids outside [0, {self.num_parts})")
        recorded = self.meta["files"].get(NODE_PART_FILE)
        if self.verify != "never" and recorded is not None and sha256_file(path) != recorded:
            raise PartitionError(
                f"{path}: sha256 does not match {META_FILE}; file altered or corrupt"
            )
        return arr

    def _expected_shape(self, spec: ArraySpec) -> tuple[int, ...]:
        dims = []
        for sym in spec.shape:
            if sym == "F":
                dims.append(self.feat_dim)
            elif sym == "P+1":
                dims.append(self.num_parts + 1)
            elif sym.endswith("+1"):
                dims.append(self.counts[sym[:-2]] + 1)
            else:
                dims.append(self.counts[sym])
        return tuple(dims)

    def _open(self, spec: ArraySpec) -> np.ndarray | None:
        rel = f"{part_dir_name(self.part)}/{spec.name}.npy"
        path = self.directory / rel
        files = self.meta["files"]
        if rel not in files:
            if spec.optional:
                return None
            raise PartitionError(f"{self.directory / META_FILE}: no entry for {rel}")
        if not path.is_file():
            raise PartitionError(f"{path}: missing (listed in {META_FILE})")
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except NPY_READ_ERRORS as exc:
            raise PartitionError(f"{path}: unreadable .npy file ({exc})") from None
        if arr.dtype.name not in spec.dtypes:
            raise PartitionError(f"{path}: dtype {arr.dtype}, expected {' or '.join(spec.dtypes)}")
        expected = self._expected_shape(spec)
        if arr.shape != expected:
            raise PartitionError(f"{path}: shape {list(arr.shape)}, expected {list(expected)}")
        return arr

    @property
    def replicated(self) -> bool:
        """Whether the partition stores halo vertices' features (``--replicate-halo-features``;
        the same for every part, even one without halo vertices)."""
        if self.feature_layout == "ooc":
            return bool(self.meta["partitioner"].get("replicate_halo_features", False))
        return self.halo_features is not None

    def _open_feature_file(self) -> None:
        """Open the ``ooc`` layout's row file; ``features``/``halo_features`` become views."""
        meta_path = self.directory / META_FILE
        info = self.meta.get("feature_file")
        keys = ("name", "dtype", "row_stride", "align")
        if not isinstance(info, dict) or any(k not in info for k in keys):
            raise PartitionError(
                f"{meta_path}: feature_layout 'ooc' needs a 'feature_file' entry with {list(keys)}"
            )
        if info["name"] != OOC_FEATURE_FILE or info["dtype"] != "float32":
            raise PartitionError(
                f"{meta_path}: feature_file must be {OOC_FEATURE_FILE!r} of float32, got "
                f"{info['name']!r} of {info['dtype']!r}"
            )
        rel = f"{part_dir_name(self.part)}/{OOC_FEATURE_FILE}"
        if rel not in self.meta["files"]:
            raise PartitionError(f"{meta_path}: no entry for {rel}")
        if not isinstance(self.meta["partitioner"], dict):
            raise PartitionError(f"{meta_path}: 'partitioner' must be an object")
        rows = self.n_solid + (self.n_halo if self.replicated else 0)
        try:
            stride, align = int(info["row_stride"]), int(info["align"])
        except (TypeError, ValueError):
            raise PartitionError(
                f"{meta_path}: feature_file row_stride/align must be integers"
            ) from None
        self.feature_file = RowFile(self.directory / rel, rows, self.feat_dim, stride, align=align)
        table = self.feature_file.as_array()
        self.features = table[: self.n_solid]
        self.halo_features = table[self.n_solid :] if self.replicated else None

    def _check_consistency(self) -> None:
        """Cheap structural checks (O(num_parts) reads) on top of shapes and dtypes."""
        where = self.directory / part_dir_name(self.part)
        if self.n_local != self.n_solid + self.n_halo:
            raise PartitionError(f"{self.directory / META_FILE}: n_local != n_solid + n_halo")
        if self.indptr[0] != 0 or self.indptr[-1] != self.indices.shape[0]:
            raise PartitionError(f"{where}/indptr.npy: must run from 0 to len(indices)")
        if self.send_ptr[0] != 0 or self.send_ptr[-1] != self.send_ids.shape[0]:
            raise PartitionError(f"{where}/send_ptr.npy: must run from 0 to len(send_ids)")
        if self.send_ptr[self.part + 1] != self.send_ptr[self.part]:
            raise PartitionError(f"{where}/send_ptr.npy: a part cannot send to itself")

    # -- verification ----------------------------------------------------------------------
    def _part_files(self) -> dict[str, Path]:
        prefix = f"{part_dir_name(self.part)}/"
        return {rel: self.directory / rel for rel in self.meta["files"] if rel.startswith(prefix)}

    def _seen_files(self) -> dict[str, list]:
        """``{relative path: [size, mtime_ns, recorded sha256]}`` of this part's files."""
        stats = {rel: path.stat() for rel, path in self._part_files().items()}
        return {
            rel: [s.st_size, s.st_mtime_ns, self.meta["files"][rel]] for rel, s in stats.items()
        }

    def _stamp_vouches(self, seen: dict[str, list]) -> bool:
        """Whether this part's stamp records a verification of these very files."""
        return _read_stamp(self.directory / part_dir_name(self.part) / STAMP_FILE) == seen

    def _verify(self, use_stamp: bool) -> None:
        """sha256 of every file of this part (in parallel: hashing releases the GIL) and the
        value checks; skipped when the stamp vouches for these files. Writes the stamp after
        a pass (atomically; a read-only partition is simply verified every time)."""
        files = self._part_files()
        seen = self._seen_files()
        stamp_path = self.directory / part_dir_name(self.part) / STAMP_FILE
        if use_stamp and self._stamp_vouches(seen):
            return
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            digests = dict(zip(files, pool.map(sha256_file, files.values()), strict=True))
        for rel, digest in digests.items():
            if digest != self.meta["files"][rel]:
                raise PartitionError(
                    f"{files[rel]}: sha256 does not match {META_FILE}; file altered or corrupt"
                )
        self._check_values()
        _write_stamp(stamp_path, seen)

    def _check_values(self) -> None:
        """Every id inside its range, ``indptr`` non-decreasing, features finite: a crafted or
        damaged part fails here, naming the file, the index and the bound, instead of deep in
        a kernel."""
        self._check_ids()
        self._check_features()

    def _check_ids(self) -> None:
        """Every id inside its range and ``indptr`` non-decreasing (one pass over the id
        arrays; also under ``--no-verify``)."""
        where = self.directory / part_dir_name(self.part)
        num_nodes = int(self.meta["num_nodes"])
        bounds = {
            "indices": (0, self.n_local),
            "orig_ids": (0, num_nodes),
            "halo_owner": (0, self.num_parts),
            "labels": (-1, self.num_classes),  # -1: unlabelled (UNLABELED)
            "train_idx": (0, self.n_solid),
            "val_idx": (0, self.n_solid),
            "test_idx": (0, self.n_solid),
            "send_ids": (0, self.n_solid),
            "in_degree": (0, num_nodes + 1),
        }
        for name, (lo, hi) in bounds.items():
            _check_range(where / f"{name}.npy", getattr(self, name), lo, hi)
        if np.any(np.asarray(self.halo_owner) == self.part):
            i = int(np.flatnonzero(np.asarray(self.halo_owner) == self.part)[0])
            raise PartitionError(
                f"{where}/halo_owner.npy: index {i} names this part ({self.part}) as the owner "
                "of one of its own halo vertices"
            )
        steps = np.diff(np.asarray(self.indptr))
        if steps.size and int(steps.min()) < 0:
            i = int(np.argmax(steps < 0))
            raise PartitionError(f"{where}/indptr.npy: decreases at index {i + 1}")

    def _check_features(self) -> None:
        """Every feature finite (a pass over the feature tables, in chunks)."""
        where = self.directory / part_dir_name(self.part)
        for name in ("features", "halo_features"):
            table = getattr(self, name)
            if table is None:
                continue
            for start in range(0, table.shape[0], _FINITE_ROWS):
                chunk = np.asarray(table[start : start + _FINITE_ROWS])
                bad = ~np.isfinite(chunk)
                if bad.any():
                    row = start + int(np.argmax(bad.any(axis=1)))
                    raise PartitionError(f"{where}/{name}.npy: row {row} holds NaN or Inf")

    def __repr__(self) -> str:
        return (
            f"PartitionStore({str(self.directory)!r}, part={self.part}/{self.num_parts}, "
            f"solid={self.n_solid}, halo={self.n_halo}, edges={self.counts['n_edges']})"
        )
