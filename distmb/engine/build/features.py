"""``--features``: the feature source a rank trains and evaluates with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distmb.config.train import TrainConfig
from distmb.core.errors import InputError
from distmb.core.machine import check_fits
from distmb.core.units import FLOAT32_BYTES
from distmb.data.local import LocalGraph
from distmb.data.store.neighborfile import NeighborFile
from distmb.pipeline.features.cached import STATIC_POLICIES, CachedFeatures, cache_rows
from distmb.pipeline.features.memory import PartFeatures
from distmb.pipeline.features.normalize import FeatureNormalization, NormalizedFeatures
from distmb.pipeline.features.presample import static_hot_ids
from distmb.pipeline.features.protocol import FeatureSource
from distmb.pipeline.features.storage import (
    StorageRangeError,
    in_memory,
    storage_dtype,
    stacked_table,
)
from distmb.pipeline.sample.host import NeighborSampler


@dataclass
class FeatureSources:
    """What :func:`open_features` returns.

    Attributes:
        train: the gather stage's source, by ``VID_p`` (halo rows when the partition holds
            them).
        cache: the out-of-core cache (``--features ooc``), else None.
        kind: ``memory``, ``mmap`` or ``ooc``.
        note: one line describing the choice, for the run's header.
        normalization: ``--normalize-features``, applied under both sources (None: none).
    """

    train: PartFeatures
    cache: CachedFeatures | None
    kind: str
    note: str
    normalization: FeatureNormalization | None = None

    def evaluation(self) -> PartFeatures:
        """The source of layer-wise evaluation, for the cache as it stands now: the training
        source, or (``ooc``) the cache read without changing it."""
        if self.cache is None:
            return self.train
        return cached_part(
            self.cache.lookup_only(), self.cache, self.train.n_solid, self.normalization
        )


def part_rows(
    rows: FeatureSource, n_solid: int, normalization: FeatureNormalization | None
) -> PartFeatures:
    """A part's features by ``VID_p`` from a source of all its rows (solid, then halo),
    normalised as read when ``normalization`` is given: the one place where
    ``--normalize-features`` enters the data path."""
    if normalization is not None:
        rows = NormalizedFeatures(rows, normalization)
    return PartFeatures(rows, n_solid=n_solid)


def cached_part(
    rows: FeatureSource,
    cache: CachedFeatures,
    n_solid: int,
    normalization: FeatureNormalization | None,
) -> PartFeatures:
    """:func:`part_rows` of ``rows``, a view of the out-of-core ``cache`` (itself, or its
    lookup-only view), normalised as read unless the cache normalises the rows it reads
    itself (:meth:`CachedFeatures.normalization_on_read`)."""
    return part_rows(rows, n_solid, cache.normalization_on_read(normalization))


def feature_kind(config: TrainConfig, local: LocalGraph) -> str:
    """``--features``, or its default: ``ooc`` for a partition in the ``ooc`` layout, else
    ``mmap``."""
    layout = local.store.feature_layout if local.store is not None else "npy"
    if config.features is None:
        return "ooc" if layout == "ooc" else "mmap"
    if config.features == "ooc" and layout != "ooc":
        where = local.store.directory if local.store is not None else "an in-memory dataset"
        raise InputError(
            f"--features ooc needs a partition whose features are in the ooc layout ({where} "
            "is not): make one with `distmb-partition --features-layout ooc`, or convert this "
            "one with `distmb-partition --convert DIR --features-layout ooc`"
        )
    return config.features


def open_features(
    local: LocalGraph,
    config: TrainConfig,
    adjacency: np.ndarray | NeighborFile | None = None,
    normalization: FeatureNormalization | None = None,
    *,
    convert: bool = True,
) -> FeatureSources:
    """The rank's feature sources for ``config.features`` (see :func:`feature_kind`), the
    table stored as ``config.feature_dtype`` (:func:`stored_rows`).

    Args:
        adjacency: what the rank's sampler reads in-neighbour lists from
            (:func:`distmb.engine.build.adjacency.open_adjacency`), for pre-sampling; default:
            ``local.indices``.
        normalization: ``--normalize-features``
            (:func:`distmb.pipeline.features.normalize.fit_normalization`), applied to every row the
            sources return; None: rows as stored.
        convert: store the table as ``config.feature_dtype`` here; False: leave it as the
            partition holds it (the GPU path's device stages store it in the host rows the GPU
            reads, and the host's readers then read those:
            :func:`~distmb.engine.build.device_stages.reading_host_rows`).

    Raises:
        InputError: ``--features ooc`` with a partition in another layout, or with
            ``--feature-dtype float16``; float16 with a table beyond its range.
    """
    kind = feature_kind(config, local)
    note_norm = f", normalised: {normalization.kind}" if normalization is not None else ""
    if kind == "ooc" and config.feature_dtype != "float32":
        if config.feature_dtype != "bfloat16":
            raise InputError(
                f"--feature-dtype {config.feature_dtype} with --features ooc: rows are read "
                "from the file as training needs them, so float16's range (65,504) cannot be "
                "checked first; use --feature-dtype bfloat16 (float32's range), or --features "
                "mmap or memory"
            )
    if kind != "ooc" and config.feature_dtype != "float32" and convert:
        solid = stored_rows(local.features, config.feature_dtype, normalization)
        halo = local.halo_features
        if halo is not None:
            halo = stored_rows(halo, config.feature_dtype, normalization, first_row=local.n_solid)
        table_mib = (solid.nbytes + (halo.nbytes if halo is not None else 0)) / 2**20
        note = (
            f"features: in memory as {config.feature_dtype} ({table_mib:.1f} MiB, read from "
            "the partition's float32 table"
            f"{', normalised first' if normalization is not None else ''})"
        )
        return FeatureSources(PartFeatures(solid, halo), None, kind, note, normalization)
    if kind != "ooc":
        solid, halo = local.features, local.halo_features
        # --features memory: read into RAM once (from .npy or the ooc row file); not where
        # the GPU path stores the table in another dtype and the host readers read that.
        if kind == "memory" and (convert or config.feature_dtype == "float32"):
            solid = in_memory(solid)
            halo = in_memory(halo) if halo is not None else None
        train = PartFeatures(solid, halo)
        if normalization is not None:
            train = part_rows(train, local.n_solid, normalization)
        return FeatureSources(train, None, kind, f"features: {kind}{note_norm}", normalization)
    assert local.store is not None and local.store.feature_file is not None
    rows = local.store.feature_file
    dtype = storage_dtype(config.feature_dtype)  # the cache's rows: float32 or bfloat16
    capacity = cache_rows(config.feature_cache_mb, rows.dim, rows.num_rows, dtype.itemsize)
    if config.cache_policy == "none":
        capacity = 0
    cache_bytes = capacity * rows.dim * dtype.itemsize
    check_fits("--feature-cache-mb", config.feature_cache_mb, cache_bytes)
    hot = None
    if config.cache_policy in STATIC_POLICIES and capacity:
        hot = _hot_ids(local, config, rows.num_rows, adjacency)
    # Two bytes: the cache normalises each row read, then rounds it (as stored_rows does).
    two_bytes = dtype != torch.float32
    transform = normalization.apply_ if two_bytes and normalization is not None else None
    cache = CachedFeatures(
        rows, config.cache_policy, capacity, hot_ids=hot, dtype=dtype, transform=transform
    )
    table_mb = rows.num_rows * rows.dim * FLOAT32_BYTES / 2**20
    note = (
        f"features: ooc {rows.path} ({table_mb:.1f} MiB, "
        f"{'O_DIRECT' if rows.direct else 'buffered: ' + str(rows.fallback_reason)}), "
        f"cache {config.cache_policy} {cache.capacity} rows "
        f"({100 * cache.capacity / max(rows.num_rows, 1):.1f} % of the table"
        f"{', as ' + config.feature_dtype if two_bytes else ''})"
    )
    if config.feature_cache_mb * 2**20 > rows.num_rows * rows.dim * dtype.itemsize and capacity:
        note += f"; --feature-cache-mb {config.feature_cache_mb:g} exceeds the table: all of it"
    train = cached_part(cache, cache, local.n_solid, normalization)
    return FeatureSources(train, cache, "ooc", note + note_norm, normalization)


def stored_rows(
    table: np.ndarray | torch.Tensor | Sequence[np.ndarray | torch.Tensor],
    feature_dtype: str,
    normalization: FeatureNormalization | None = None,
    first_row: int = 0,
) -> torch.Tensor:
    """``table`` (float32[n, F], memory-mapped or not; or a list of such tables, whose rows
    follow one another) stored as ``--feature-dtype`` ``feature_dtype`` in a new CPU tensor,
    normalised by ``normalization`` first (in float32, chunk by chunk:
    :func:`~distmb.pipeline.features.storage.stacked_table`). The one place where a rank's
    table is converted, for the CPU path's sources and the GPU path's host rows alike.

    Args:
        first_row: the id of ``table``'s first row (a part's halo rows follow its solid
            ones), for the error message.

    Raises:
        InputError: a value beyond the dtype's range (float16: 65504), naming its row and
            the flags that help.
    """
    transform = normalization.apply_ if normalization is not None else None
    try:
        tables = list(table) if isinstance(table, list | tuple) else [table]
        return stacked_table(tables, storage_dtype(feature_dtype), transform, first_row)
    except StorageRangeError as err:
        raise InputError(
            f"--feature-dtype {feature_dtype}: {err} (--feature-dtype bfloat16 keeps float32's "
            "range; --normalize-features scales the table first)"
        ) from None


def _hot_ids(
    local: LocalGraph,
    config: TrainConfig,
    num_rows: int,
    adjacency: np.ndarray | NeighborFile | None,
) -> np.ndarray:
    """The static cache's rows by priority: pre-sampling counts (``presc``; ties by
    in-degree) or in-degree (``degree``)."""
    store = local.store
    assert store is not None
    degree = np.asarray(store.in_degree[:num_rows])
    indices = adjacency if adjacency is not None else local.indices

    def make_sampler(seed: int) -> NeighborSampler:
        return NeighborSampler(
            local.indptr, indices, local.n_solid, local.n_local, config.fanout, seed
        )

    return static_hot_ids(
        config.cache_policy,
        degree,
        make_sampler,
        local.train_idx,
        config.batch_size,
        config.presample_epochs,
        config.seed,
    )
