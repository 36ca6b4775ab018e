"""Out-of-core adjacency: a part's CSR ``indices`` read from disk behind a static neighbour cache.

With ``--graph-layout ooc`` a rank keeps ``indptr`` in memory and leaves ``indices`` in its
file (a partition's ``indices.npy`` is read where it is: the data starts at the ``.npy``
header length). The in-neighbour lists a sampling layer needs are read with coalesced,
thread-parallel ``O_DIRECT`` reads (the row files' reader, ``distmb._C``; buffered with a
stated reason where the filesystem refuses direct I/O), except the lists of the vertices held
in a *static neighbour cache* (Ginex, section 3.2): the full lists of the vertices most likely
to be expanded, in one compact in-memory array filled once before training.

:class:`~distmb.pipeline.sample.NeighborSampler` accepts a :class:`NeighborFile` in place of the
``indices`` array and samples exactly the same blocks.

Memory: ``indptr`` (8 bytes per solid vertex, borrowed), the cached lists (at most the budget
given to :meth:`NeighborFile.fill`), the cache's address table (8 bytes per solid vertex, only
when the cache is not empty) and per-call buffers that grow with a batch's lists, never with
the part's edges.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distmb import _C
from distmb.core.errors import PartitionError
from distmb.data.store.format import part_dir_name
from distmb.data.store.rowfile import warn_fallback

if TYPE_CHECKING:
    from distmb.data.store.store import PartitionStore

#: Cache fill orders :meth:`NeighborFile.from_store` knows (see :func:`cache_priority`).
CACHE_PRIORITIES = ("degree", "ratio")
#: Entries of ``indices`` counted at a time by the ``"ratio"`` priority's out-degree pass.
_COUNT_CHUNK = 1 << 22
#: Bytes in one MiB (``cache_mb`` is in MiB, as ``--feature-cache-mb``).
_MIB = 1 << 20


def npy_data_offset(path: str | Path) -> tuple[int, np.dtype, tuple[int, ...], bool]:
    """Where the data of a ``.npy`` file starts, and what it holds.

    Args:
        path: a ``.npy`` file (format version 1, 2 or 3).

    Returns:
        ``(offset in bytes, dtype, shape, fortran_order)``.

    Raises:
        PartitionError: the file is missing or not a readable ``.npy`` file.
    """
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(f)
            else:  # version 3.0 (utf-8 field names): no public header reader
                arr = np.load(path, mmap_mode="r", allow_pickle=False)
                return int(arr.offset), arr.dtype, tuple(arr.shape), False
            return f.tell(), dtype, tuple(shape), bool(fortran)
    except (OSError, ValueError) as exc:
        raise PartitionError(f"{path}: missing or unreadable .npy file ({exc})") from None


def cache_priority(
    indptr: np.ndarray,
    kind: str = "degree",
    *,
    indices: np.ndarray | None = None,
    n_local: int | None = None,
) -> np.ndarray:
    """Vertices in the order a static neighbour cache takes them (most valuable first).

    Args:
        indptr: int64[n_solid + 1], the part's in-edge CSR row pointers.
        kind: ``"degree"``: by in-degree (list length), descending; in a symmetric graph the
            in-degree is the out-degree, so the vertices most often sampled as neighbours
            (hence expanded in the next layer) come first. No pass over the edges.
            ``"ratio"``: by out-degree / in-degree within the part, descending (Ginex and
            AliGraph's benefit / cost metric: expansions per cached byte); needs ``indices``
            and ``n_local`` and counts the out-degrees in one streaming pass over them (a
            memory map of the file is read in chunks, so nothing of size E is held).
            Vertices without in-edges come last (they need no read). Ties keep VID_p order.
        indices: int32 or int64[E] (may be a memory map), for ``"ratio"``.
        n_local: local vertices (solid and halo), for ``"ratio"``.

    Returns:
        int64[n_solid]: a permutation of the solid VID_p.
    """
    indptr = np.asarray(indptr)
    degree = np.diff(indptr).astype(np.int64)
    if kind == "degree":
        key = -degree.astype(np.float64)
    elif kind == "ratio":
        if indices is None or n_local is None:
            raise ValueError("cache_priority('ratio') needs indices and n_local")
        out_degree = np.zeros(int(n_local), dtype=np.int64)
        for start in range(0, int(indices.shape[0]), _COUNT_CHUNK):
            chunk = np.asarray(indices[start : start + _COUNT_CHUNK])
            out_degree += np.bincount(chunk, minlength=int(n_local))[: int(n_local)]
        ratio = out_degree[: degree.size] / np.maximum(degree, 1)
        key = np.where(degree > 0, -ratio, np.inf)
    else:
        raise ValueError(f"cache priority {kind!r}: expected one of {', '.join(CACHE_PRIORITIES)}")
    return np.argsort(key, kind="stable").astype(np.int64)


class NeighborFile:
    """In-neighbour lists of one part read from its ``indices`` file behind a static cache.

    Entry ``e`` of the part's CSR ``indices`` is at byte ``offset + e * itemsize`` of ``path``
    (native byte order); list ``v`` is entries ``[indptr[v], indptr[v + 1])``. Lists are
    served by :meth:`fetch` from the cache (see :meth:`fill`) or read from disk, and every
    entry read from disk is checked against ``[0, n_local)``. Calls on one object from several
    Python threads are safe but serialised; reads use the OpenMP thread count of the calling
    thread (``distmb._C.set_num_threads``).

    Args:
        path: the file holding ``indices`` (e.g. a part's ``indices.npy``).
        indptr: int64[n_solid + 1], non-decreasing from 0 to ``num_entries``; borrowed (a
            contiguous int64 array, memory-mapped ones included, is not copied).
        n_local: local vertices, solid and halo (entries are VID_p in ``[0, n_local)``).
        dtype: ``int32`` or ``int64``, the entries' type.
        offset: byte offset of entry 0 (the ``.npy`` header length; see :meth:`from_npy`).
        direct: read with ``O_DIRECT`` (bypassing the page cache) when the filesystem allows
            it; False: buffered reads.

    Raises:
        PartitionError: the file is missing or shorter than ``offset + E * itemsize``.
        ValueError: a malformed ``indptr`` or an unsupported ``dtype``.

    Attributes:
        direct: reads bypass the page cache.
        fallback_reason: why ``O_DIRECT`` was refused ("" when it was not asked for or not
            refused).
    """

    def __init__(
        self,
        path: str | Path,
        indptr: np.ndarray,
        n_local: int,
        *,
        dtype: np.dtype | type | str,
        offset: int,
        direct: bool = True,
    ) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise ValueError(
                f"neighbour file {self.path}: dtype must be int32 or int64, got {self.dtype}"
            )
        indptr = np.asarray(indptr)
        if indptr.dtype != np.int64 or indptr.ndim != 1 or indptr.size < 1:
            raise ValueError(
                f"neighbour file {self.path}: indptr must be a non-empty 1-D int64 array, got "
                f"{indptr.dtype}{list(indptr.shape)}"
            )
        self.indptr = np.ascontiguousarray(indptr)
        if not self.path.is_file():
            raise PartitionError(f"neighbour file {self.path} is missing or not a regular file")
        try:
            self._core = _C.NeighborFileCore(
                self.indptr,
                int(n_local),
                os.fspath(self.path),
                int(offset),
                self.dtype.itemsize,
                int(self.indptr[-1]),
                bool(direct),
            )
        except RuntimeError as exc:
            raise PartitionError(str(exc)) from None
        self.direct: bool = bool(self._core.direct)
        self.fallback_reason: str = str(self._core.fallback_reason)
        if direct and not self.direct:
            warn_fallback("neighbour file", self.path, self.fallback_reason)
        self.fill_seconds = 0.0

    # -- construction from files ------------------------------------------------------------
    @classmethod
    def from_npy(
        cls, path: str | Path, indptr: np.ndarray, n_local: int, *, direct: bool = True
    ) -> NeighborFile:
        """Open the ``indices`` ``.npy`` file at ``path`` in place (its data starts at the
        header length; no copy, no format change).

        Raises:
            PartitionError: not a 1-D C-order native int32 / int64 ``.npy`` of
                ``indptr[-1]`` entries, or the file is short.
        """
        offset, dtype, shape, fortran = npy_data_offset(path)
        expected = (int(np.asarray(indptr)[-1]),)
        if (
            dtype.name not in ("int32", "int64")
            or not dtype.isnative
            or shape != expected
            or (fortran and len(shape) > 1)
        ):
            raise PartitionError(
                f"{path}: {dtype}{list(shape)}, expected a native-order int32 or int64"
                f"{list(expected)} .npy file (the part's indices)"
            )
        return cls(path, indptr, n_local, dtype=dtype, offset=offset, direct=direct)

    @classmethod
    def from_store(
        cls,
        store: PartitionStore,
        cache_mb: float = 0.0,
        priority: str | np.ndarray = "degree",
        *,
        direct: bool = True,
    ) -> NeighborFile:
        """The neighbour file of a part's ``indices.npy``, its cache filled.

        Args:
            store: the part (its ``indptr`` is borrowed; its ``indices`` memory map is only
                read by the ``"ratio"`` priority's counting pass).
            cache_mb: neighbour cache budget in MiB (0: no cache).
            priority: ``"degree"`` or ``"ratio"`` (:func:`cache_priority`), or an explicit
                int64 array of solid VID_p, most valuable first.
            direct: as in :class:`NeighborFile`.

        Example::

            store = PartitionStore(directory, rank)
            adj = NeighborFile.from_store(store, cache_mb=64)
            sampler = NeighborSampler(store.indptr, adj, store.n_solid, store.n_local,
                                      fanouts, seed)
        """
        if cache_mb < 0:
            raise ValueError(f"cache_mb must be >= 0, got {cache_mb}")
        path = store.directory / part_dir_name(store.part) / "indices.npy"
        nf = cls.from_npy(path, store.indptr, store.n_local, direct=direct)
        if cache_mb > 0:
            if isinstance(priority, str):
                order = cache_priority(
                    nf.indptr, priority, indices=store.indices, n_local=store.n_local
                )
            else:
                order = np.asarray(priority, dtype=np.int64)
            nf.fill(order, int(cache_mb * _MIB))
        return nf

    # -- the cache ----------------------------------------------------------------------------
    def fill(self, vertices: np.ndarray, capacity_bytes: int) -> int:
        """Replace the static cache: the lists of ``vertices`` taken in the given order while
        the next list still fits in the budget (repeats are skipped), read from disk once.

        Args:
            vertices: int64[m] solid VID_p, most valuable first (:func:`cache_priority`).
            capacity_bytes: bytes of cached entries allowed (``degree * itemsize`` per list;
                the 8-byte-per-vertex address table is not charged).

        Returns:
            Vertices cached.

        Raises:
            IndexError: a vertex outside ``[0, n_solid)``.
            PartitionError: a short read or an entry outside ``[0, n_local)`` (the cache is
                then empty).
        """
        arr = np.ascontiguousarray(np.asarray(vertices), dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError(f"fill: vertices must be 1-D, got shape {list(arr.shape)}")
        start = time.perf_counter()
        try:
            return int(self._core.fill(arr, int(capacity_bytes)))
        except RuntimeError as exc:
            raise PartitionError(str(exc)) from None
        finally:
            self.fill_seconds = time.perf_counter() - start

    @property
    def cache_vertices(self) -> int:
        """Vertices whose lists are cached."""
        return int(self._core.cache_vertices)

    @property
    def cache_entries(self) -> int:
        """Entries (edges) held by the cache."""
        return int(self._core.cache_entries)

    @property
    def cache_bytes(self) -> int:
        """Memory held by the cache: its entries plus its address table, in bytes."""
        return int(self._core.cache_bytes)

    # -- reads --------------------------------------------------------------------------------
    def fetch(self, dst: Any) -> tuple[np.ndarray, np.ndarray]:
        """The in-neighbour lists of ``dst``, packed.

        Args:
            dst: int64[n] solid VID_p (any integer dtype; any order, repeats allowed).

        Returns:
            ``(starts, lists)``: ``starts`` int64[n + 1] and ``lists`` of :attr:`dtype`
            [starts[-1]]; ``lists[starts[i]:starts[i + 1]]`` equals
            ``indices[indptr[dst[i]]:indptr[dst[i] + 1]]``.

        Raises:
            IndexError: a destination outside ``[0, n_solid)``.
            PartitionError: a short read (file truncated after opening) or an entry outside
                ``[0, n_local)`` (corrupt file); the message names the file.
        """
        if hasattr(dst, "detach"):
            dst = dst.detach().cpu().numpy()
        arr = np.asarray(dst)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(
                f"NeighborFile({self.path}).fetch: dst must be a 1-D integer array, got "
                f"{arr.dtype}{list(arr.shape)}"
            )
        self._require_open()
        try:
            starts, raw = self._core.fetch(np.ascontiguousarray(arr, dtype=np.int64))
        except RuntimeError as exc:
            raise PartitionError(str(exc)) from None
        return starts, raw.view(self.dtype)

    # -- sizes --------------------------------------------------------------------------------
    @property
    def n_solid(self) -> int:
        return int(self._core.n_solid)

    @property
    def n_local(self) -> int:
        return int(self._core.n_local)

    @property
    def num_entries(self) -> int:
        """Entries (edges) of the CSR, ``indptr[-1]``."""
        return int(self._core.num_entries)

    @property
    def offset(self) -> int:
        """Byte offset of entry 0 in the file."""
        return int(self._core.data_offset)

    # -- counters -----------------------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        """Since the last :meth:`reset_counters`:

        - ``lists_requested``: destinations fetched (repeats counted; sampling counts every
          layer's destinations);
        - ``cache_hits``: of those, served from the cache; ``cache_misses`` = the rest
          (``cache_hits + cache_misses == lists_requested``), of which ``lists_read`` had
          entries and were read from disk (``entries_read`` entries);
        - ``bytes_read``: bytes of the coalesced, aligned read requests (``read_requests``);
        - ``read_seconds``: wall time of those reads, seconds;
        - ``cache_bytes``: memory the cache holds (not reset).
        """
        c = self._core.counters()
        return {
            "lists_requested": int(c["lists_requested"]),
            "cache_hits": int(c["cache_hits"]),
            "cache_misses": int(c["lists_requested"]) - int(c["cache_hits"]),
            "lists_read": int(c["lists_read"]),
            "entries_read": int(c["entries_read"]),
            "bytes_read": int(c["bytes_read"]),
            "read_requests": int(c["requests"]),
            "read_seconds": float(c["read_seconds"]),
            "cache_bytes": self.cache_bytes,
        }

    def reset_counters(self) -> None:
        self._core.reset_counters()

    # -- lifetime -----------------------------------------------------------------------------
    def _require_open(self) -> None:
        if self._core.closed:
            raise ValueError(f"NeighborFile({self.path}) is closed")

    @property
    def closed(self) -> bool:
        return bool(self._core.closed)

    def close(self) -> None:
        """Close the file descriptor (idempotent); the cache stays allocated until the
        object is dropped."""
        self._core.close()

    def __enter__(self) -> NeighborFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "direct" if self.direct else "buffered"
        return (
            f"NeighborFile({str(self.path)!r}, n_solid={self.n_solid}, n_local={self.n_local}, "
            f"entries={self.num_entries}, {self.dtype}, cached={self.cache_vertices} lists / "
            f"{self.cache_bytes} B, {mode})"
        )
