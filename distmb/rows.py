"""Rows of a table read in place by id (:class:`IndexedRows`).

The loader's gather stage copies block 0's input rows out of the feature table (150k rows of a
products-shaped batch, ~6 ms on two cores), and the first layer then reads the copy once more.
A layer whose kernels can read through row ids (the fused :class:`~distmb.nn.SAGEConv`: its
aggregation and the self term of its UPDATE) takes the rows where they are instead: the
loader hands it an :class:`IndexedRows` (``--gather-in-place``), and anything else turns it
into a tensor with :meth:`IndexedRows.materialize`.

This module imports nothing of distmb's, so the feature sources and the layers can both use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class IndexedRows:
    """The rows ``table[ids]``, not copied: row ``i`` is ``table[ids[i]]``.

    Attributes:
        table: float32[N, F], C-contiguous, on the CPU (a feature table; may share a read-only
            memory map, which is never written).
        ids: int64[n], contiguous, each in ``[0, N)``: the maker checks them (a
            :class:`~distmb.features.FeatureSource` does, and the kernels check them again).

    Raises:
        ValueError: a table or ids of another dtype, rank, layout or device.
    """

    table: Tensor
    ids: Tensor

    def __post_init__(self) -> None:
        t, ids = self.table, self.ids
        if t.dtype != torch.float32 or t.dim() != 2 or not t.is_contiguous() or t.is_cuda:
            raise ValueError(
                "IndexedRows: table must be a contiguous float32 [N, F] CPU tensor, got "
                f"{t.dtype}{list(t.shape)} on {t.device}"
            )
        if ids.dtype != torch.int64 or ids.dim() != 1 or not ids.is_contiguous() or ids.is_cuda:
            raise ValueError(
                "IndexedRows: ids must be a contiguous int64 [n] CPU tensor, got "
                f"{ids.dtype}{list(ids.shape)} on {ids.device}"
            )

    # -- the parts of the tensor interface the layers' checks read ---------------------------
    @property
    def shape(self) -> torch.Size:
        """``(n, F)``."""
        return torch.Size((self.ids.shape[0], self.table.shape[1]))

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

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
    def prefix(self, n: int) -> IndexedRows:
        """Rows ``[0, n)`` (a block's destinations), still in place."""
        if not 0 <= n <= len(self):
            raise ValueError(f"IndexedRows.prefix: n={n} outside [0, {len(self)}]")
        return IndexedRows(self.table, self.ids[:n])

    def materialize(self) -> Tensor:
        """float32[n, F]: the rows copied into a new tensor (thread-parallel ``index_select``)."""
        return torch.index_select(self.table, 0, self.ids)

    def kernel_source(self) -> tuple[np.ndarray, np.ndarray]:
        """``(table, ids)`` as numpy views, the form the C++ kernels take an indexed source in."""
        return self.table.numpy(), self.ids.numpy()


def materialized(x: Tensor | IndexedRows) -> Tensor:
    """``x`` as a tensor: :meth:`IndexedRows.materialize` for in-place rows, else ``x``."""
    return x.materialize() if isinstance(x, IndexedRows) else x
