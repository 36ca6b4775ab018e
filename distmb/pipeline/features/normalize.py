"""``--normalize-features``: one transform applied to every input feature row read.

- ``row``: each row divided by the sum of its values; rows summing to 0 stay 0. This is
  PyG's ``NormalizeFeatures`` on non-negative rows that sum to 0 or at least 1, such as
  bag-of-words features (PyG also subtracts the table's minimum and divides by at least 1).
- ``standard``: per column ``(x - mean) / std``, ``mean`` and ``std`` (population, ddof 0)
  over the training vertices of *all* ranks (gathered sums), so one rank and P ranks
  normalise alike; columns whose ``std`` is 0 are only centred.

:class:`NormalizedFeatures` wraps a :class:`~distmb.pipeline.features.protocol.FeatureSource` and
applies
the transform to the rows it reads; :func:`distmb.engine.build.features.open_features` puts it
under the training and the evaluation sources (so halo rows, the exact baseline's remote
rows and layer-wise evaluation all see it). The partition's files are never written. The
transform and its statistics travel in checkpoints (:meth:`FeatureNormalization.state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distmb.comm import RankGroup
from distmb.core.errors import InputError
from distmb.pipeline.features.protocol import FeatureSource

#: Input feature normalisations of ``--normalize-features``.
NORMALIZATIONS: tuple[str, ...] = ("none", "row", "standard")

#: Training rows read at a time while computing the ``standard`` statistics.
STATS_CHUNK_ROWS = 65536


@dataclass(frozen=True)
class FeatureNormalization:
    """A row transform of input features.

    Args:
        kind: ``row`` or ``standard`` (``none`` is no object at all).
        mean: float32[F], the column means of the training rows (``standard``), else None.
        std: float32[F], their population standard deviations (``standard``), else None.
    """

    kind: str
    mean: torch.Tensor | None = None
    std: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.kind not in NORMALIZATIONS[1:]:
            raise ValueError(f"FeatureNormalization: unknown kind {self.kind!r}")
        if self.kind == "standard" and (self.mean is None or self.std is None):
            raise ValueError("FeatureNormalization: standard needs mean and std")

    @property
    def divisor(self) -> torch.Tensor:
        """float32[F]: ``std`` with its zeros replaced by 1 (``standard`` only)."""
        assert self.std is not None
        return torch.where(self.std > 0, self.std, torch.ones_like(self.std))

    def apply_(self, rows: torch.Tensor) -> torch.Tensor:
        """Normalise ``rows`` (float32[n, F]) in place and return them."""
        if self.kind == "row":
            sums = rows.sum(dim=1, keepdim=True)
            rows.div_(torch.where(sums == 0, torch.ones_like(sums), sums))
        else:
            assert self.mean is not None
            rows.sub_(self.mean).div_(self.divisor)
        return rows

    def state(self) -> dict[str, Any]:
        """What a checkpoint stores (``"feature_norm"``): the kind and, for ``standard``, the
        float32 statistics."""
        state: dict[str, Any] = {"kind": self.kind}
        if self.kind == "standard":
            state.update(mean=self.mean, std=self.std)
        return state

    @classmethod
    def from_state(cls, state: Any, dim: int, where: str) -> FeatureNormalization:
        """The normalisation a checkpoint stored (:meth:`state`), checked against ``dim``
        input features.

        Raises:
            InputError: naming ``where`` (the checkpoint file) and what is wrong.
        """
        kind = state.get("kind") if isinstance(state, dict) else None
        if kind not in NORMALIZATIONS[1:]:
            raise InputError(f"{where}: feature normalisation {kind!r} is not one of row, standard")
        if kind == "row":
            return cls("row")
        stats = [state.get("mean"), state.get("std")]
        for name, value in zip(("mean", "std"), stats, strict=True):
            if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
                raise InputError(f"{where}: feature normalisation {name} is not a float32 tensor")
            if tuple(value.shape) != (dim,) or not bool(torch.isfinite(value).all()):
                raise InputError(
                    f"{where}: feature normalisation {name} must hold {dim} finite values, "
                    f"got shape {list(value.shape)}"
                )
        if bool((stats[1] < 0).any()):
            raise InputError(f"{where}: feature normalisation std holds negative values")
        return cls("standard", stats[0], stats[1])


def fit_normalization(
    kind: str,
    features: np.ndarray,
    train_idx: np.ndarray,
    comm: RankGroup,
) -> FeatureNormalization | None:
    """The normalisation ``--normalize-features kind`` asks for (None for ``none``).

    ``standard`` reads this rank's training rows (in chunks; a memory map is only read) and
    calls two all-reduces on every rank: the count and column sums (-> mean), then the
    column sums of squared deviations from that mean (-> std). Sums are float64.

    Args:
        features: float32[n_solid, F], this rank's solid rows as stored (any layout).
        train_idx: int64[n_train], this rank's training vertices (``VID_p``, solid).
        comm: the ranks (every rank calls this, with its own training rows).
    """
    if kind == "none":
        return None
    if kind == "row":
        return FeatureNormalization("row")
    ids = np.sort(np.asarray(train_idx, dtype=np.int64))
    dim = int(features.shape[1])
    sums = np.zeros(dim + 1, dtype=np.float64)  # [count, column sums]
    for rows in _chunks(features, ids):
        sums[0] += rows.shape[0]
        sums[1:] += rows.sum(axis=0)
    total = comm.allreduce_sum(sums)
    if total[0] == 0:
        raise InputError("--normalize-features standard: no training vertices on any rank")
    mean = total[1:] / total[0]
    squares = np.zeros(dim, dtype=np.float64)
    for rows in _chunks(features, ids):
        squares += ((rows - mean) ** 2).sum(axis=0)
    std = np.sqrt(comm.allreduce_sum(squares) / total[0])
    return FeatureNormalization(
        "standard",
        torch.from_numpy(mean.astype(np.float32)),
        torch.from_numpy(std.astype(np.float32)),
    )


def _chunks(features: np.ndarray, ids: np.ndarray):
    """float64[k, F] blocks of ``features[ids]``, :data:`STATS_CHUNK_ROWS` rows at a time."""
    for start in range(0, ids.size, STATS_CHUNK_ROWS):
        yield np.asarray(features[ids[start : start + STATS_CHUNK_ROWS]], dtype=np.float64)


class NormalizedFeatures(FeatureSource):
    """``source``'s rows, normalised as they are read.

    Args:
        source: the rows (ids, counters and planning are ``source``'s).
        normalization: the transform.
    """

    def __init__(self, source: FeatureSource, normalization: FeatureNormalization) -> None:
        super().__init__(source.num_rows, source.dim)
        self.source = source
        self.normalization = normalization
        self.wants_trace = source.wants_trace
        self.uses_collectives = source.uses_collectives

    @property
    def has_halo(self) -> bool:
        return self.source.has_halo

    def inspect(self, traces: list[np.ndarray]) -> None:
        self.source.inspect(traces)

    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        before = self.source.bytes_read
        self.source._read_into(ids, out)
        self.bytes_read += self.source.bytes_read - before
        self.normalization.apply_(out)
