"""The in-memory graph every dataset loader produces and the partitioner consumes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from distmb.core.errors import InputError
from distmb.data.csr import CsrBuild, EdgeChunks, array_chunks, build_csr, csr_edge_chunks

#: Label of a vertex without a class (allowed outside the train/val/test splits).
UNLABELED = -1

#: Rows checked per chunk when scanning features for NaN/Inf (bounds the temporary memory).
_FINITE_CHECK_ROWS = 1 << 16

#: Entries of ``indices`` converted per step when hashing (bounds the temporary to 32 MiB).
_HASH_CHUNK = 1 << 22


#: More classes than labelled vertices are refused above this many (a stray label such as
#: 10**9 would otherwise size every per-class buffer and the output layer).
MAX_CLASSES_WITHOUT_DATA = 1024


def max_classes(n_labelled: int) -> int:
    """The most classes a graph with ``n_labelled`` labelled vertices may declare: every
    class could be observed, or at most :data:`MAX_CLASSES_WITHOUT_DATA` for small graphs."""
    return max(n_labelled, MAX_CLASSES_WITHOUT_DATA)


#: Above this many classes, labels that use under half of the ids get a warning note.
SPARSE_CLASS_MIN = 16


@dataclass
class Graph:
    """A node-classification graph held in memory.

    Attributes:
        name: dataset name (``"cora"``, ``"synthetic"``, ...).
        indptr: int64[num_nodes + 1], CSR row pointers of the **in-edges**.
        indices: int32 or int64[num_edges], ``indices[indptr[v]:indptr[v+1]]`` are the sources
            ``u`` of the edges ``u -> v``, ascending and distinct. The loaders build int32
            whenever the vertex count allows (:func:`~distmb.data.store.format.index_dtype`); int64
            is accepted for any graph.
        features: float32[num_nodes, feat_dim], finite (may be a read-only memory map).
        labels: int64[num_nodes], class in ``[0, num_classes)`` or :data:`UNLABELED`.
        train_idx, val_idx, test_idx: int64 vertex ids (ascending, disjoint, labelled).
        num_classes: number of classes.
        notes: human-readable record of what loading did (symmetrised, self-loops dropped...).
        symmetric: True when every edge ``u -> v`` is known to have its reverse
            (set by :meth:`from_edges` with ``symmetrize=True``).
    """

    name: str
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int
    notes: list[str] = field(default_factory=list)
    symmetric: bool = False

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        """Number of directed in-edges (an undirected edge counts twice)."""
        return int(self.indices.shape[0])

    @property
    def feat_dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the graph's arrays (structure, features, labels, splits)."""
        arrays = (
            self.indptr,
            self.indices,
            self.features,
            self.labels,
            self.train_idx,
            self.val_idx,
            self.test_idx,
        )
        return int(sum(a.nbytes for a in arrays))

    def in_degree(self) -> np.ndarray:
        """int64[num_nodes]: number of in-edges of every vertex."""
        return np.diff(self.indptr)

    @classmethod
    def from_edges(
        cls,
        name: str,
        src: np.ndarray,
        dst: np.ndarray,
        num_nodes: int,
        features: np.ndarray,
        labels: np.ndarray,
        train_idx: np.ndarray,
        val_idx: np.ndarray,
        test_idx: np.ndarray,
        num_classes: int,
        *,
        symmetrize: bool = True,
        source: str = "<edges>",
        notes: list[str] | None = None,
    ) -> Graph:
        """Build a validated graph from COO edges ``src[e] -> dst[e]`` (1-D integer arrays of
        one length; int32 and int64 ones, memory-mapped ones included, are read in place).

        Self-loops and duplicate edges are removed; with ``symmetrize`` (the default: the
        paper trains on undirected graphs) every edge is also added in reverse. ``source``
        names the input in error messages. What was done is recorded in ``notes``. The CSR
        is built chunk by chunk (:func:`~distmb.data.csr.build_csr`).
        """
        src, dst = np.asarray(src), np.asarray(dst)
        for what, a in (("edge sources", src), ("edge targets", dst)):
            if a.ndim != 1:
                raise InputError(f"{source}: {what} must be a 1-D array, got shape {list(a.shape)}")
            if a.size and not np.issubdtype(a.dtype, np.integer):
                raise InputError(f"{source}: {what} must be integers, got {a.dtype}")
        if src.shape != dst.shape:
            raise InputError(f"{source}: {src.shape[0]} edge sources but {dst.shape[0]} targets")
        return cls.from_edge_chunks(
            name,
            array_chunks(src, dst),
            num_nodes,
            features,
            labels,
            train_idx,
            val_idx,
            test_idx,
            num_classes,
            symmetrize=symmetrize,
            source=source,
            notes=notes,
        )

    @classmethod
    def from_edge_chunks(
        cls,
        name: str,
        chunks: EdgeChunks,
        num_nodes: int,
        features: np.ndarray,
        labels: np.ndarray,
        train_idx: np.ndarray,
        val_idx: np.ndarray,
        test_idx: np.ndarray,
        num_classes: int,
        *,
        symmetrize: bool = True,
        source: str = "<edges>",
        notes: list[str] | None = None,
    ) -> Graph:
        """:meth:`from_edges` for edges that arrive in chunks (``chunks()`` is called twice;
        see :data:`~distmb.data.csr.EdgeChunks`), so a loader never holds all of them."""
        build = build_csr(chunks, int(num_nodes), symmetrize=symmetrize, source=source)
        return cls.from_csr_build(
            name,
            build,
            features,
            labels,
            train_idx,
            val_idx,
            test_idx,
            num_classes,
            symmetric=symmetrize,
            source=source,
            notes=notes,
        )

    @classmethod
    def from_csr_build(
        cls,
        name: str,
        build: CsrBuild,
        features: np.ndarray,
        labels: np.ndarray,
        train_idx: np.ndarray,
        val_idx: np.ndarray,
        test_idx: np.ndarray,
        num_classes: int,
        *,
        symmetric: bool,
        source: str = "<edges>",
        notes: list[str] | None = None,
    ) -> Graph:
        """A validated graph around a CSR from :func:`~distmb.data.csr.build_csr` (built with
        ``symmetrize=symmetric``); appends the build's note to ``notes``."""
        notes = list(notes or [])
        notes.append(build.note(symmetric))
        graph = cls(
            name=name,
            indptr=build.indptr,
            indices=build.indices,
            features=features,
            labels=labels,
            train_idx=train_idx,
            val_idx=val_idx,
            test_idx=test_idx,
            num_classes=int(num_classes),
            notes=notes,
            symmetric=symmetric,
        )
        graph.validate(source)
        graph.notes.extend(sparse_class_notes(graph.labels, graph.num_classes))
        return graph

    def validate(
        self, source: str = "<graph>", *, feature_rows: tuple[int, int] | None = None
    ) -> None:
        """Check every invariant of the class docstring; raise :class:`InputError` naming
        ``source`` and the offending array on the first violation.

        ``feature_rows``: ``(lo, hi)`` checks only those rows' features for NaN/Inf (each
        rank of the distributed writer checks its share); default all."""
        n = self.num_nodes
        _check(
            self.indptr.dtype == np.int64 and self.indptr.ndim == 1,
            source,
            f"indptr must be int64[num_nodes + 1], got "
            f"{self.indptr.dtype}{list(self.indptr.shape)}",
        )
        _check(
            self.indices.dtype in (np.int32, np.int64) and self.indices.ndim == 1,
            source,
            "indices must be int32 or int64[num_edges], got "
            f"{self.indices.dtype}{list(self.indices.shape)}",
        )
        _check(
            n >= 0 and self.indptr[0] == 0 and self.indptr[-1] == self.indices.shape[0],
            source,
            "indptr must start at 0 and end at len(indices)",
        )
        _check(
            bool(np.all(self.indptr[1:] >= self.indptr[:-1])),
            source,
            "indptr must be non-decreasing",
        )
        if self.indices.size:
            _check(
                int(self.indices.min()) >= 0 and int(self.indices.max()) < n,
                source,
                f"edge endpoints must lie in [0, {n})",
            )
        f = self.features
        _check(
            isinstance(f, np.ndarray) and f.ndim == 2 and f.shape[0] == n,
            source,
            f"features must be a [num_nodes={n}, feat_dim] array, got shape {list(np.shape(f))}",
        )
        _check(f.dtype == np.float32, source, f"features must be float32, got {f.dtype}")
        first, last = feature_rows if feature_rows is not None else (0, n)
        for lo in range(first, last, _FINITE_CHECK_ROWS):
            block = f[lo : min(lo + _FINITE_CHECK_ROWS, last)]
            if not np.isfinite(block).all():
                bad = lo + int(np.argwhere(~np.isfinite(block))[0, 0])
                raise InputError(f"{source}: features contain NaN or Inf (first at vertex {bad})")
        y = self.labels
        _check(
            isinstance(y, np.ndarray) and y.dtype == np.int64 and y.shape == (n,),
            source,
            f"labels must be int64[num_nodes={n}], got "
            f"{getattr(y, 'dtype', type(y))}{list(np.shape(y))}",
        )
        _check(self.num_classes >= 1, source, f"num_classes must be >= 1, got {self.num_classes}")
        labelled = y != UNLABELED
        if n:
            bad = labelled & ((y < 0) | (y >= self.num_classes))
            if bad.any():
                v = int(np.argmax(bad))
                raise InputError(
                    f"{source}: label {int(y[v])} of vertex {v} is outside [0, {self.num_classes})"
                )
        n_labelled = int(labelled.sum())
        if self.num_classes > max_classes(n_labelled):
            raise InputError(
                f"{source}: {self.num_classes} classes (largest class id "
                f"{self.num_classes - 1}) for {n_labelled} labelled vertices; class ids must "
                "be 0..K-1 with K at most the number of labelled vertices: relabel the classes"
            )
        seen = np.zeros(n, dtype=bool)
        for split in ("train_idx", "val_idx", "test_idx"):
            idx = getattr(self, split)
            _check(
                isinstance(idx, np.ndarray) and idx.dtype == np.int64 and idx.ndim == 1,
                source,
                f"{split} must be a 1-D int64 array",
            )
            if idx.size == 0:
                continue
            _check(
                int(idx.min()) >= 0 and int(idx.max()) < n,
                source,
                f"{split} holds vertex ids outside [0, {n})",
            )
            _check(
                bool(np.all(idx[1:] > idx[:-1])),
                source,
                f"{split} must be ascending without repeats",
            )
            _check(not seen[idx].any(), source, f"{split} overlaps an earlier split")
            _check(bool(labelled[idx].all()), source, f"{split} contains unlabelled vertices")
            seen[idx] = True

    def identity(self) -> dict[str, object]:
        """What identifies this graph: name, sizes and a sha256 of structure and labels.

        Partitions and checkpoints record it so a mismatch is caught, not trained on.
        """
        chunks = (
            self.indices[lo : lo + _HASH_CHUNK] for lo in range(0, self.num_edges, _HASH_CHUNK)
        )
        return {
            "name": self.name,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "feat_dim": self.feat_dim,
            "num_classes": self.num_classes,
            "sha256": graph_sha256(self.indptr, chunks, self.labels),
        }

    def summary(self) -> str:
        """One line: name, vertices, edges, features, classes and split sizes."""
        return (
            f"{self.name}: {self.num_nodes} vertices, {self.num_edges} in-edges, "
            f"{self.feat_dim} features, {self.num_classes} classes, "
            f"train/val/test {self.train_idx.size}/{self.val_idx.size}/{self.test_idx.size}"
        )


def graph_sha256(indptr: np.ndarray, index_chunks: Iterable[np.ndarray], labels: np.ndarray) -> str:
    """The sha256 of :meth:`Graph.identity`: over ``indptr`` (int64[num_nodes + 1]), the
    in-edge ``indices`` as int64, given as consecutive chunks in order, and ``labels``
    (int64[num_nodes]).

    Indices are hashed as int64 whatever their dtype, so the identity is the same for an
    int32 and an int64 copy of one graph (and for partitions written before int32)."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(indptr, dtype=np.int64).data)
    for chunk in index_chunks:
        h.update(np.ascontiguousarray(chunk, dtype=np.int64).data)
    h.update(np.ascontiguousarray(labels).data)
    return h.hexdigest()


def sparse_class_notes(labels: np.ndarray, num_classes: int) -> list[str]:
    """The warning ``Graph.notes`` gets when labels use under half of many class ids."""
    used = int(np.unique(labels[labels != UNLABELED]).size)
    if num_classes > SPARSE_CLASS_MIN and used < num_classes // 2:
        return [
            f"warning: the labels use {used} of {num_classes} class ids (largest "
            f"{num_classes - 1}): the model gets {num_classes} outputs; "
            "relabel the classes to 0..K-1 if that is not intended"
        ]
    return []


def csr_row_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """int64[lengths.sum()]: the positions ``starts[i] + [0, lengths[i])`` of every row ``i``,
    concatenated (the entries of CSR rows ``i`` given their ``indptr`` starts and lengths)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    first = np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths)
    return np.repeat(first, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def undirected_csr(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr: int64[num_nodes + 1], indices: int32|int64[num_edges'])``: the graph's
    adjacency with every edge in both directions, as METIS and KaMinPar need it.

    A symmetric graph (``graph.symmetric``) is returned as is, without a copy; a directed one
    is symmetrised into new arrays (self-loops and duplicates dropped), built chunk by chunk
    from its CSR (:func:`~distmb.data.csr.build_csr`).
    """
    if graph.symmetric:
        return graph.indptr, graph.indices
    build = build_csr(
        csr_edge_chunks(graph.indptr, graph.indices),
        graph.num_nodes,
        symmetrize=True,
        dtype=graph.indices.dtype,
    )
    return build.indptr, build.indices


def _check(ok: bool, source: str, message: str) -> None:
    if not ok:
        raise InputError(f"{source}: {message}")
