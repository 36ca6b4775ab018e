"""Feature tables in this process's memory (or memory-mapped from a partition's files)."""

from __future__ import annotations

import numpy as np
import torch

from distmb.pipeline.features.protocol import FeatureSource, as_row_table, take_rows
from distmb.pipeline.rows import TABLE_DTYPES


class ArrayFeatures(FeatureSource):
    """One table: ids are its row numbers.

    Args:
        table: float[num_rows, dim], a numpy array (a read-only ``np.memmap`` is read in
            place, through the OS page cache) or a CPU tensor: float32, or a table stored
            in two bytes a value (``--feature-dtype``: float16 or bfloat16, see
            :mod:`~distmb.pipeline.features.storage`), whose rows are gathered as float32.

    Attributes:
        row_bytes: bytes one row occupies in ``table`` (what a gather reads per row).
    """

    def __init__(self, table: np.ndarray | torch.Tensor) -> None:
        if table.ndim != 2:
            raise ValueError(f"ArrayFeatures: table must be 2-D, got shape {list(table.shape)}")
        super().__init__(table.shape[0], table.shape[1])
        self.table = table
        self._rows = as_row_table(table)
        itemsize = table.itemsize if isinstance(table, np.ndarray) else table.element_size()
        self.row_bytes = self.dim * itemsize

    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        take_rows(self._rows, ids, out)
        self.bytes_read += ids.size * self.row_bytes

    def _table_in_place(self, ids: np.ndarray) -> torch.Tensor | None:
        t = self._rows
        if isinstance(t, torch.Tensor) and t.dtype in TABLE_DTYPES and t.is_contiguous():
            self.bytes_read += ids.size * self.row_bytes
            return t
        return None


class ConcatFeatures(FeatureSource):
    """Two sources stacked: ids ``[0, head.num_rows)`` read ``head``, the next
    ``tail.num_rows`` ids read ``tail`` (shifted down by ``head.num_rows``)."""

    def __init__(self, head: FeatureSource, tail: FeatureSource) -> None:
        if head.dim != tail.dim:
            raise ValueError(f"ConcatFeatures: row widths differ ({head.dim} and {tail.dim})")
        super().__init__(head.num_rows + tail.num_rows, head.dim)
        self.head = head
        self.tail = tail
        self.wants_trace = head.wants_trace or tail.wants_trace

    def inspect(self, traces: list[np.ndarray]) -> None:
        # Each part sees its share of every gather, as ``_read_into`` will request it.
        split = self.head.num_rows
        arrays = [np.asarray(t) for t in traces]
        if self.head.wants_trace:
            self.head.inspect([t[t < split] for t in arrays])
        if self.tail.wants_trace:
            self.tail.inspect([t[t >= split] - split for t in arrays])

    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        # ``ids`` were checked against this source's range: read the parts directly, without
        # checking (and scanning) them again in ``gather``.
        split = self.head.num_rows
        if not ids.size or int(ids.max()) < split:
            self.head._read_into(ids, out)
            return
        in_tail = ids >= split
        n_head = ids.size - int(np.count_nonzero(in_tail))
        if not in_tail[:n_head].any():
            # Head ids first, tail ids after (a block's sources end with its halo leaves):
            # each part reads straight into its slice of ``out``, no copy in between.
            self.head._read_into(ids[:n_head], out[:n_head])
            self.tail._read_into(ids[n_head:] - split, out[n_head:])
            return
        head_pos = torch.from_numpy(np.flatnonzero(~in_tail))
        tail_pos = torch.from_numpy(np.flatnonzero(in_tail))
        out[head_pos] = _read(self.head, ids[~in_tail])
        out[tail_pos] = _read(self.tail, ids[in_tail] - split)

    def _table_in_place(self, ids: np.ndarray) -> torch.Tensor | None:
        # Head ids only (a block without halo leaves): the head's table as it is.
        if ids.size and int(ids.max()) >= self.head.num_rows:
            return None
        return self.head._table_in_place(ids)

    def counters(self) -> dict[str, int]:
        return {
            "rows_served": self.rows_served,
            "bytes_read": self.head.bytes_read + self.tail.bytes_read,
        }


def _read(source: FeatureSource, ids: np.ndarray) -> torch.Tensor:
    """float32[ids.size, dim]: ``source``'s rows of already checked ``ids``."""
    out = torch.empty((ids.size, source.dim), dtype=torch.float32)
    source._read_into(ids, out)
    return out


class PartFeatures(ConcatFeatures):
    """A part's features by ``VID_p``: solid rows ``[0, n_solid)``, then the halo vertices'
    rows (replicated by ``--replicate-halo-features``, or received in an exchange) when
    there are any.

    Args:
        solid: float32[n_solid, F] (may be memory-mapped) or a source of them; with
            ``n_solid``, a source of all the part's rows (solid, then halo).
        halo: float32[n_halo, F] or None: then only the rows of ``solid`` can be gathered
            (without ``n_solid``, :attr:`has_halo` is False and halo rows come from the halo
            scheme).
        n_solid: the solid rows of ``solid`` when it also holds the halo rows (one table for
            both, as the out-of-core layout stores them); default: all its rows.
    """

    def __init__(
        self,
        solid: np.ndarray | torch.Tensor | FeatureSource,
        halo: np.ndarray | None = None,
        *,
        n_solid: int | None = None,
    ) -> None:
        head = solid if isinstance(solid, FeatureSource) else ArrayFeatures(solid)
        tail = ArrayFeatures(halo if halo is not None else np.empty((0, head.dim), np.float32))
        super().__init__(head, tail)
        self.n_solid = head.num_rows if n_solid is None else int(n_solid)
        if not 0 <= self.n_solid <= head.num_rows:
            raise ValueError(f"PartFeatures: n_solid {n_solid} outside [0, {head.num_rows}]")

    @property
    def has_halo(self) -> bool:
        """Whether halo ids (``>= n_solid``) can be gathered."""
        return self.num_rows > self.n_solid
