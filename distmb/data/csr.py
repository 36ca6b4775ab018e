"""COO edges -> in-edge CSR in bounded memory: the edges arrive in chunks, twice.

:func:`build_csr` drives the three C++ passes of ``csrc/kernels/graph.cpp`` (count, scatter, finish)
over a re-iterable source of edge chunks, in arrays it owns: ``indptr`` int64[n + 1] and
``indices`` of :func:`~distmb.data.store.format.index_dtype` (int32 when the vertex count allows).
Besides the result it holds one chunk at a time, so a loader never materialises an int64
copy of its edges, a symmetrised copy, or a raw array next to the final one (the rows are
sorted and de-duplicated in place). The result does not depend on the chunking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from distmb.core.errors import InputError
from distmb.data.store.format import index_dtype

#: Edges per chunk of the built-in chunk sources (a chunk's int64 pair is 64 MiB).
EDGE_CHUNK = 1 << 22

#: A source of edge chunks: each call returns a fresh iterable of ``(src, dst)`` pairs of equal
#: length 1-D integer arrays (the same chunks on every call; :func:`build_csr` calls it twice).
EdgeChunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]

_ID_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


@dataclass
class CsrBuild:
    """What :func:`build_csr` returns.

    Attributes:
        indptr: int64[num_nodes + 1].
        indices: int32 or int64[indptr[-1]], the sources of every vertex's in-edges,
            ascending and distinct per row.
        input_edges: edges read from the chunks.
        self_loops: input edges ``v -> v`` (dropped unless ``drop_self_loops=False``).
        duplicates: CSR entries merged because the same edge occurred again.
    """

    indptr: np.ndarray
    indices: np.ndarray
    input_edges: int
    self_loops: int
    duplicates: int

    def note(self, symmetrize: bool) -> str:
        """The line ``Graph.notes`` records about the build."""
        return build_note(
            self.input_edges, self.self_loops, self.duplicates, self.indices.shape[0], symmetrize
        )


def build_note(
    input_edges: int, self_loops: int, duplicates: int, in_edges: int, symmetrize: bool
) -> str:
    """The line ``Graph.notes`` records about a CSR build (:meth:`CsrBuild.note`; the
    distributed writer sums the counts over its ranks)."""
    how = "symmetrised (each edge added in both directions); " if symmetrize else "kept directed; "
    return (
        f"{input_edges} input edges; {how}{self_loops} self-loops removed; "
        f"{duplicates} duplicate entries merged; {in_edges} in-edges"
    )


def array_chunks(src: np.ndarray, dst: np.ndarray, chunk: int = EDGE_CHUNK) -> EdgeChunks:
    """The chunk source of two equal-length edge arrays (memory-mapped ones included):
    consecutive slices of ``chunk`` edges, no copies."""

    def chunks() -> Iterable[tuple[np.ndarray, np.ndarray]]:
        for lo in range(0, src.shape[0], chunk):
            yield src[lo : lo + chunk], dst[lo : lo + chunk]

    return chunks


def csr_edge_chunks(
    indptr: np.ndarray,
    indices: np.ndarray,
    chunk: int = EDGE_CHUNK,
    *,
    rows_are_targets: bool = True,
) -> EdgeChunks:
    """The edges of a CSR as a chunk source, by blocks of rows of about ``chunk`` entries (a
    row longer than that is one block).

    Args:
        indptr: int64[n + 1].
        indices: integer[nnz], the column of every entry (read in place).
        rows_are_targets: True for an in-edge CSR (entry ``u`` of row ``v`` is ``u -> v``),
            False for an adjacency matrix by rows (entry ``v`` of row ``u`` is ``u -> v``).
    """
    n = indptr.shape[0] - 1
    row_dtype = indices.dtype if indices.dtype in _ID_DTYPES else np.dtype(np.int64)

    def chunks() -> Iterable[tuple[np.ndarray, np.ndarray]]:
        lo = 0
        while lo < n:
            target = int(indptr[lo]) + chunk
            hi = max(lo + 1, int(np.searchsorted(indptr, target, side="right")) - 1)
            hi = min(hi, n)
            rows = np.repeat(np.arange(lo, hi, dtype=row_dtype), np.diff(indptr[lo : hi + 1]))
            cols = indices[indptr[lo] : indptr[hi]]
            yield (cols, rows) if rows_are_targets else (rows, cols)
            lo = hi

    return chunks


def build_csr(
    chunks: EdgeChunks,
    num_nodes: int,
    *,
    symmetrize: bool,
    drop_self_loops: bool = True,
    dtype: np.dtype | type | None = None,
    source: str = "<edges>",
) -> CsrBuild:
    """The in-edge CSR of the edges ``src[e] -> dst[e]`` that ``chunks()`` yields.

    Args:
        chunks: see :data:`EdgeChunks`; ids may be any integer dtype (int32 and int64 are
            read in place, others converted one chunk at a time).
        num_nodes: vertices; every id must lie in ``[0, num_nodes)``.
        symmetrize: also add every edge in reverse.
        drop_self_loops: drop ``v -> v``.
        dtype: of ``indices``; default :func:`~distmb.data.store.format.index_dtype` of
            ``num_nodes`` (int32 up to 2**31 - 1 vertices).
        source: names the input in error messages.

    Raises:
        InputError: naming ``source`` and the first edge with an id outside the range, or a
            chunk that is not a pair of equal-length 1-D integer arrays.
    """
    if num_nodes < 0:
        raise InputError(f"{source}: number of vertices must be >= 0, got {num_nodes}")
    out_dtype = index_dtype(num_nodes) if dtype is None else np.dtype(dtype)
    if out_dtype not in _ID_DTYPES:
        raise ValueError(f"build_csr: dtype must be int32 or int64, got {out_dtype}")
    if out_dtype == np.int32 and num_nodes > np.iinfo(np.int32).max:
        raise ValueError(f"build_csr: {num_nodes} vertices do not fit int32 ids")
    from distmb import _C

    counts = np.zeros(num_nodes + 1, dtype=np.int64)
    edges = self_loops = 0
    for src, dst in chunks():
        src, dst = _id_pair(src, dst, source)
        try:
            self_loops += _C.csr_count(
                src, dst, num_nodes, symmetrize, drop_self_loops, edges, counts
            )
        except IndexError as exc:  # std::out_of_range from the kernel
            raise InputError(f"{source}: {exc}") from None
        edges += src.shape[0]
    np.cumsum(counts, out=counts)  # counts[v] = row v's first slot; counts[-1] = total
    total = int(counts[-1])
    indices = np.empty(total, dtype=out_dtype)
    scattered = 0
    for src, dst in chunks():
        src, dst = _id_pair(src, dst, source)
        _C.csr_scatter(src, dst, symmetrize, drop_self_loops, scattered, counts, indices)
        scattered += src.shape[0]
    if scattered != edges:
        raise RuntimeError(f"{source}: the edge chunks changed between the two passes")
    kept = int(_C.csr_finish(counts, indices))
    if kept < total:
        indices.resize(kept, refcheck=False)  # realloc: shrinks in place, no second copy
    return CsrBuild(
        indptr=counts,
        indices=indices,
        input_edges=edges,
        self_loops=self_loops,
        duplicates=total - kept,
    )


def _id_pair(src: np.ndarray, dst: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
    """A chunk as two C-contiguous arrays of one id dtype the kernels read in place."""
    src, dst = np.asarray(src), np.asarray(dst)
    for what, a in (("edge sources", src), ("edge targets", dst)):
        if a.ndim != 1:
            raise InputError(f"{source}: {what} must be a 1-D array, got shape {list(a.shape)}")
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"{source}: {what} must be integers, got {a.dtype}")
    if src.shape != dst.shape:
        raise InputError(f"{source}: {src.shape[0]} edge sources but {dst.shape[0]} targets")
    dtype = src.dtype if src.dtype == dst.dtype and src.dtype in _ID_DTYPES else np.int64
    return np.ascontiguousarray(src, dtype=dtype), np.ascontiguousarray(dst, dtype=dtype)
