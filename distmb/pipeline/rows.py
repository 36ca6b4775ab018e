"""Rows of a table read in place by id (:class:`IndexedRows`).

The loader's gather stage copies block 0's input rows out of the feature table (150k rows of a
products-shaped batch, ~6.5 ms on two cores), and the first layer then reads the copy once
more. A layer whose kernels can read through row ids (the fused :class:`~distmb.nn.SAGEConv`'s
aggregation) takes the neighbours' rows where they are instead: the
loader hands it an :class:`IndexedRows` (unless ``--no-gather-in-place``), with the
destinations' own rows gathered as its ``head``, and anything else turns it
into a tensor with :meth:`IndexedRows.materialize`.

A table may be stored in two bytes a value (``--feature-dtype``: :data:`TABLE_DTYPES`); the
rows are float32 to every reader (the aggregation kernel widens each value as it reads it).

This module imports nothing of distmb's, so the feature sources and the layers can both use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

#: The dtypes a table read in place may be stored in; its rows are read as float32.
TABLE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True, eq=False)
class IndexedRows:
    """The rows ``table[ids]``, not copied: row ``i`` is ``table[ids[i]]``.

    Attributes:
        table: [N, F] of :data:`TABLE_DTYPES`, C-contiguous, on the CPU (a feature table;
            may share a read-only memory map, which is never written). Its rows are read as
            float32 whatever it stores (:attr:`dtype`).
        ids: int64[n], contiguous, each in ``[0, N)``: the maker checks them (a
            :class:`~distmb.pipeline.features.FeatureSource` does, and the kernels check them
            again).
        head: float32[m, F] (m <= n, contiguous) or None: the first ``m`` rows already
            gathered. A layer reads its destinations' own rows (a prefix) from it
            sequentially, and only the scattered neighbour rows through the ids.

    Raises:
        ValueError: a table, ids or head of another dtype, rank, layout, size or device.
    """

    table: Tensor
    ids: Tensor
    head: Tensor | None = None

    def __post_init__(self) -> None:
        t, ids = self.table, self.ids
        if t.dtype not in TABLE_DTYPES or t.dim() != 2 or not t.is_contiguous() or t.is_cuda:
            raise ValueError(
                "IndexedRows: table must be a contiguous float32, bfloat16 or float16 [N, F] "
                "CPU tensor, got "
                f"{t.dtype}{list(t.shape)} on {t.device}"
            )
        if ids.dtype != torch.int64 or ids.dim() != 1 or not ids.is_contiguous() or ids.is_cuda:
            raise ValueError(
                "IndexedRows: ids must be a contiguous int64 [n] CPU tensor, got "
                f"{ids.dtype}{list(ids.shape)} on {ids.device}"
            )
        head = self.head
        if head is not None and (
            head.dtype != torch.float32
            or head.dim() != 2
            or head.shape[0] > ids.shape[0]
            or head.shape[1] != t.shape[1]
            or not head.is_contiguous()
            or head.is_cuda
        ):
            raise ValueError(
                f"IndexedRows: head must be a contiguous float32 [m <= {ids.shape[0]}, "
                f"{t.shape[1]}] CPU tensor, got {head.dtype}{list(head.shape)} on {head.device}"
            )

    # -- the parts of the tensor interface the layers' checks read ---------------------------
    @property
    def shape(self) -> torch.Size:
        """``(n, F)``."""
        return torch.Size((self.ids.shape[0], self.table.shape[1]))

    @property
    def dtype(self) -> torch.dtype:
        """float32: the dtype of the rows as every reader gets them (the table may store
        them in two bytes a value)."""
        return torch.float32

    @property
    def device(self) -> torch.device:
        return self.table.device

    @property
    def requires_grad(self) -> bool:
        """Always False: the rows are inputs (features), never trained."""
        return False

    def dim(self) -> int:
        return 2

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    # -- use ---------------------------------------------------------------------------------
    def prefix(self, n: int) -> Tensor | IndexedRows:
        """Rows ``[0, n)`` (a block's destinations): a view of :attr:`head` when it holds
        them, else still in place."""
        if not 0 <= n <= len(self):
            raise ValueError(f"IndexedRows.prefix: n={n} outside [0, {len(self)}]")
        if self.head is not None and n <= self.head.shape[0]:
            return self.head[:n]
        return IndexedRows(self.table, self.ids[:n])

    def materialize(self) -> Tensor:
        """float32[n, F]: the rows copied into a new tensor (thread-parallel ``index_select``,
        widened to float32 from a two-byte table)."""
        if self.head is None:
            return self._take(self.ids)
        m = self.head.shape[0]
        return torch.cat([self.head, self._take(self.ids[m:])])

    def _take(self, ids: Tensor) -> Tensor:
        """float32 rows ``ids`` of the table."""
        return torch.index_select(self.table, 0, ids).to(torch.float32)

    def kernel_source(self) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """The form the C++ UPDATE kernels take an indexed source in: ``(table, ids)`` as numpy
        views of a float32 table; a two-byte table's rows, which those kernels do not read,
        gathered as float32 (:meth:`materialize`)."""
        if self.table.dtype != torch.float32:
            return self.materialize().numpy()
        return self.table.numpy(), self.ids.numpy()

    def table_bits(self) -> tuple[np.ndarray, str]:
        """The table as the aggregation kernel reads it in place: ``(float32 array,
        "float32")``, or for a two-byte table its values' bits as an int16 array and the
        dtype's name (``"bfloat16"``, ``"float16"``)."""
        t = self.table
        if t.dtype == torch.float32:
            return t.numpy(), "float32"
        return t.view(torch.int16).numpy(), str(t.dtype).removeprefix("torch.")


def materialized(x: Tensor | IndexedRows) -> Tensor:
    """``x`` as a tensor: :meth:`IndexedRows.materialize` for in-place rows, else ``x``."""
    return x.materialize() if isinstance(x, IndexedRows) else x
