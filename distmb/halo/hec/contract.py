"""The historical embedding cache (HEC, DistGNN-MB section 3.2): the contract every cache
implementation keeps, declared as the abstract base :class:`EmbeddingCache`, with the
argument validation they share.

Implementations: :class:`~distmb.halo.hec.host.HistoricalEmbeddingCache` (the C++ cache, host
memory) and :class:`~distmb.halo.hec.device.DeviceHistoricalCache` (torch tensors on any
device). For the same sequence of calls they return the same slots, hit masks and rows (bit for
bit), hold the same tag in the same slot with the same age and count the same events; their
checkpoints (:meth:`EmbeddingCache.state`) are interchangeable.

Contract (the project design notes, docs/design.md; made precise here):

- A cache has ``capacity`` lines of ``dim`` float32 values. A line is tagged by the ``VID_o``
  (int64, ``>= 0``) of the vertex whose embedding it holds. Lines ``[0, occupied)`` hold a
  tag: a new tag takes the free line ``occupied`` while there is one.
- Ages are counted in training iterations: :meth:`EmbeddingCache.advance` is called once per
  iteration and adds one to every age. A stored line has age 0.
- **Expiry.** A line *hits* while ``age <= lifespan`` and misses once ``age > lifespan``; with
  ``lifespan = 0`` a line only hits in the iteration it was stored. With
  :data:`LIFESPAN_UNBOUNDED` lines never expire (layer 0 holds input features, which never go
  stale). Expired lines are not removed eagerly: they miss, and are the first lines to be
  replaced (they are always the oldest).
- **Store** behaves as if the rows were stored one at a time in order. For each
  ``(tag, row)``: the line holding ``tag`` is overwritten (also when it has expired: it is
  refreshed to age 0); else a free line is taken; else the least recently *written* line is
  replaced (oldest-cache-line-first, OCF: lines of equal age go in the order they were
  stored). Consequently, when a tag occurs several times in one call, its **last** row is kept.
  Replacing an unexpired line of another tag counts as an ``eviction``, replacing an expired
  one as an ``expired_replacement``.
- A rejected call (:class:`ValueError`) leaves the cache unchanged.
- :meth:`EmbeddingCache.clear` drops every line; the clock and the counters are kept.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch

from distmb import _C

#: Slot returned by :meth:`EmbeddingCache.search` for an absent or expired tag.
HEC_MISS: int = int(_C.HEC_MISS)
#: Life-span of a cache whose lines never expire.
LIFESPAN_UNBOUNDED: int = int(_C.LIFESPAN_UNBOUNDED)
#: Keys of :meth:`EmbeddingCache.counters`, in order.
COUNTER_KEYS: tuple[str, ...] = ("lookups", "hits", "stores", "evictions", "expired_replacements")
#: Keys of :meth:`EmbeddingCache.state` (one cache's checkpoint), in order.
CACHE_STATE_KEYS: tuple[str, ...] = ("tags", "ages", "rows")
#: ``capacity * dim`` above this is refused (``INT64_MAX / 4 / 4``: byte offsets of the line
#: buffer, with room to spare, fit an int64).
MAX_CACHE_FLOATS: int = (2**63 - 1) // 4 // 4

#: Tags and slots: a numpy array, a tensor or a sequence of integers.
IndexLike = np.ndarray | torch.Tensor | Sequence[int]
#: Rows: a float32 numpy array or tensor.
RowsLike = np.ndarray | torch.Tensor


# -- argument validation ------------------------------------------------------------------------
def check_int(value: int, name: str, minimum: int, allow: int | None = None) -> int:
    """``value`` as an ``int`` when it is an integer (not a bool) ``>= minimum`` or equal to
    ``allow``.

    Raises:
        ValueError: otherwise, naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    value = int(value)
    if value < minimum and value != allow:
        extra = f" or {allow}" if allow is not None else ""
        raise ValueError(f"{name} must be >= {minimum}{extra} (got {value})")
    return value


def check_cache_shape(capacity: int, dim: int, lifespan: int) -> tuple[int, int, int]:
    """The constructor arguments of a cache, validated: ``capacity >= 1`` lines of
    ``dim >= 1`` floats (``capacity * dim <= MAX_CACHE_FLOATS``), ``lifespan >= 0`` or
    :data:`LIFESPAN_UNBOUNDED`.

    Raises:
        ValueError: a non-integer or out-of-range argument, or ``capacity * dim`` too large.
    """
    capacity = check_int(capacity, "capacity", 1)
    dim = check_int(dim, "dim", 1)
    lifespan = check_int(lifespan, "lifespan", 0, allow=LIFESPAN_UNBOUNDED)
    if capacity > MAX_CACHE_FLOATS // dim:
        raise ValueError("capacity * dim is too large")
    return capacity, dim, lifespan


def as_host_array(values: IndexLike | RowsLike, name: str) -> np.ndarray:
    """``values`` as a numpy array (a CPU tensor is viewed, detached, not copied).

    Raises:
        ValueError: a tensor that is not on the CPU.
    """
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU (got device {values.device})")
        return values.detach().numpy()
    return np.asarray(values)


def index_array(values: IndexLike, name: str) -> np.ndarray:
    """``values`` (host memory) as int64[n], 1-D and C-contiguous (no copy when it already is
    one).

    Raises:
        ValueError: not 1-D, not integers (bool and floating dtypes included), or a tensor
            that is not on the CPU.
    """
    arr = as_host_array(values, name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (got shape {list(arr.shape)})")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers (got dtype {arr.dtype})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_index_tensor(values: torch.Tensor, name: str) -> None:
    """A tensor of tags or slots (on any device) must be 1-D and hold integers, as
    :func:`index_array` requires of host arrays.

    Raises:
        ValueError: otherwise.
    """
    if values.dim() != 1:
        raise ValueError(f"{name} must be 1-D (got shape {list(values.shape)})")
    dtype = values.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise ValueError(f"{name} must hold integers (got dtype {dtype})")


def checked_rows(rows: RowsLike, m: int, dim: int) -> np.ndarray | torch.Tensor:
    """The rows of a store of ``m`` tags, validated as float32[m, dim]: a tensor (detached,
    on any device) or a numpy array (a nested sequence is converted, so a list of Python
    floats is float64 and refused). No dtype conversion, no copy.

    Raises:
        ValueError: another dtype, not 2-D, another width, or not ``m`` rows.
    """
    if isinstance(rows, torch.Tensor):
        rows = rows.detach()
        is_float32 = rows.dtype == torch.float32
    else:
        rows = np.asarray(rows)
        is_float32 = rows.dtype == np.float32
    if not is_float32:
        raise ValueError(f"rows must be float32 (got {rows.dtype})")
    if rows.ndim != 2 or rows.shape[1] != dim:
        raise ValueError(f"rows must have shape [m, {dim}] (got {list(rows.shape)})")
    if rows.shape[0] != m:
        raise ValueError(f"{m} tags but {rows.shape[0]} rows: they must match")
    return rows


def check_out(out: torch.Tensor, n: int, dim: int, device: torch.device) -> None:
    """A caller's output buffer must be a contiguous float32[n, dim] tensor on ``device``.

    Raises:
        ValueError: otherwise.
    """
    if not isinstance(out, torch.Tensor) or out.device != device:
        raise ValueError(f"out must be a torch tensor on {device}")
    if out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous float32 (got {out.dtype})")
    if tuple(out.shape) != (n, dim):
        raise ValueError(f"out has shape {list(out.shape)}, expected [{n}, {dim}]")


# -- the protocol ---------------------------------------------------------------------------------
class EmbeddingCache(ABC):
    """A fixed-size cache of float32 rows tagged by ``VID_o``, with the replacement and expiry
    rules of the module docstring. What the halo scheme
    (:class:`~distmb.halo.hec.scheme.HistoricalEmbeddingScheme`), checkpoints and tests use of
    a cache.

    Tensors given to or returned by a cache live on :attr:`device` (where its tables are);
    tags and slots may also be numpy arrays or sequences of integers, and stored rows numpy
    arrays. The arguments each implementation takes: ``capacity >= 1`` lines, ``dim >= 1``
    values per line, ``lifespan >= 0`` or :data:`LIFESPAN_UNBOUNDED`
    (:func:`check_cache_shape`).
    """

    # -- properties ---------------------------------------------------------------------------
    @property
    @abstractmethod
    def capacity(self) -> int:
        """Number of lines."""

    @property
    @abstractmethod
    def dim(self) -> int:
        """Width of a line (float32 values)."""

    @property
    @abstractmethod
    def lifespan(self) -> int:
        """Largest age that still hits, or :data:`LIFESPAN_UNBOUNDED`."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where the lines live, and the tensors of :meth:`load`, :meth:`lookup` and
        :meth:`lookup_into`."""

    @property
    @abstractmethod
    def clock(self) -> int:
        """Number of :meth:`advance` calls so far (not reset by :meth:`clear`)."""

    @property
    @abstractmethod
    def occupied(self) -> int:
        """Lines holding a tag, expired or not."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of valid lines: those holding a tag whose age is ``<= lifespan`` (the lines a
        search can hit)."""

    def __bool__(self) -> bool:
        """Always True: a cache object is not "false" because it is empty (``if cache:``
        tests presence, as with ``None``); use ``len(cache)`` for its contents."""
        return True

    def __repr__(self) -> str:
        ls = "unbounded" if self.lifespan == LIFESPAN_UNBOUNDED else str(self.lifespan)
        return (
            f"{type(self).__name__}(capacity={self.capacity}, dim={self.dim}, lifespan={ls}, "
            f"device={self.device}, occupied={self.occupied}, clock={self.clock})"
        )

    # -- operations -----------------------------------------------------------------------------
    @abstractmethod
    def search(self, tags: IndexLike) -> np.ndarray | torch.Tensor:
        """HECSearch: the slot of every tag.

        Args:
            tags: int[n] (any integer dtype), ``VID_o >= 0``.

        Returns:
            int64[n]: the slot holding each tag, or :data:`HEC_MISS` where the tag is absent or
            its line has expired (a numpy array for a host cache, a tensor on :attr:`device`
            otherwise). Counts ``n`` lookups and the hits.

        Raises:
            ValueError: not 1-D, not integers, or a negative tag.
        """

    @abstractmethod
    def load(self, slots: IndexLike, out: torch.Tensor | None = None) -> torch.Tensor:
        """HECLoad: gather lines.

        Args:
            slots: int[n], lines holding a tag (hits of a :meth:`search` made after the last
                :meth:`store` or :meth:`clear`; never :data:`HEC_MISS`).
            out: optional float32[n, dim] contiguous tensor on :attr:`device` to write into
                (e.g. the halo rows of a layer's input); allocated when omitted.

        Returns:
            float32[n, dim]: the rows (``out`` when given).

        Raises:
            ValueError: a slot that holds no line, or a malformed ``out``.
        """

    @abstractmethod
    def lookup(self, tags: IndexLike) -> tuple[torch.Tensor, torch.Tensor]:
        """Search and load in one call.

        Args:
            tags: int[n], ``VID_o >= 0``.

        Returns:
            ``(hit_mask, rows)``: bool[n] (True where the tag hits) and float32[n_hits, dim],
            the rows of the hits in the order of ``tags``. Counts lookups and hits like
            :meth:`search`.
        """

    @abstractmethod
    def lookup_into(self, tags: IndexLike, out: torch.Tensor) -> torch.Tensor:
        """Search and gather straight into a caller's buffer, without allocating rows: the
        halo scheme passes the halo rows of a layer's input.

        Args:
            tags: int[n], ``VID_o >= 0``.
            out: float32[n, dim] contiguous tensor on :attr:`device`. Row ``i`` receives the
                line of ``tags[i]`` on a hit and zeros on a miss.

        Returns:
            bool[n] on :attr:`device`: the hit mask. Counts lookups and hits like
            :meth:`search`.

        Raises:
            ValueError: malformed tags or ``out``.
        """

    @abstractmethod
    def store(self, tags: IndexLike, rows: RowsLike) -> None:
        """HECStore: write ``rows[i]`` under ``tags[i]`` as if one at a time in order (module
        docstring: same tag, else a free line, else the oldest line). A repeated tag keeps its
        last row. Stored lines get age 0.

        Args:
            tags: int[m], ``VID_o >= 0``.
            rows: float32[m, dim] (a tensor that requires grad is detached).

        Raises:
            ValueError: wrong dtype (no silent conversion from float64), shape or width, a
                negative tag, or different lengths. The cache is unchanged on error.
        """

    @abstractmethod
    def advance(self) -> None:
        """One training iteration has passed: every line's age grows by one."""

    @abstractmethod
    def clear(self) -> None:
        """Drop every line. The clock and the counters are kept."""

    # -- checkpointing ----------------------------------------------------------------------------
    @abstractmethod
    def state(self) -> dict[str, np.ndarray]:
        """The valid lines (age ``<= lifespan``) in slot order, as numpy arrays
        (:data:`CACHE_STATE_KEYS`): ``tags`` int64[v], ``ages`` int64[v], ``rows``
        float32[v, dim]. Expired lines are left out: they can never hit again. The row read
        counts ``v`` lookups and hits."""

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Replace the contents by ``state`` (from :meth:`state` of any implementation) with
        :func:`replay_state`: the same tags, rows and ages; the clock moves on by the largest
        age. Every implementation makes the same calls, so the same state restored into any
        of them leaves the same tags in the same slots (which may differ from the saved
        cache's).

        Raises:
            ValueError: arrays of the wrong shape or dtype, or a negative age.
        """
        replay_state(self, state)

    @abstractmethod
    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """``(tags, ages)``, int64[occupied] numpy arrays each: the tag and age of every line
        holding a tag, indexed by slot (expired lines included). For tests and diagnostics."""

    # -- statistics -------------------------------------------------------------------------------
    @abstractmethod
    def counters(self) -> dict[str, int]:
        """Counts since creation or :meth:`reset_counters`, keyed by :data:`COUNTER_KEYS`:
        ``lookups`` (tags searched), ``hits``, ``stores`` (rows stored), ``evictions``
        (unexpired lines of another tag replaced) and ``expired_replacements`` (expired lines
        of another tag replaced)."""

    @abstractmethod
    def reset_counters(self) -> None:
        """Set every counter to zero (e.g. at the start of an epoch)."""

    def hit_rate(self) -> float:
        """``hits / lookups`` since the last reset; 0.0 when nothing was looked up."""
        c = self.counters()
        return c["hits"] / c["lookups"] if c["lookups"] else 0.0


def replay_state(cache: EmbeddingCache, state: dict[str, np.ndarray]) -> None:
    """Replace the contents of ``cache`` by ``state`` (``tags`` int64[v], ``ages`` int64[v],
    ``rows`` float32[v, dim], as :meth:`EmbeddingCache.state` returns them): clear, then store
    the lines oldest first, with :meth:`~EmbeddingCache.advance` between age groups, so that
    the clock moves on by the largest age. The one restore procedure of every implementation:
    the same state restored into any leaves the same tags in the same slots.

    Raises:
        ValueError: arrays of the wrong shape or dtype, or a negative age.
    """
    tags = index_array(state["tags"], "tags")
    ages = index_array(state["ages"], "ages")
    rows = np.asarray(state["rows"])
    if ages.shape != tags.shape or (ages.size and int(ages.min()) < 0):
        raise ValueError("ages must be non-negative and match tags in length")
    cache.clear()
    if tags.size == 0:
        return
    order = np.argsort(-ages, kind="stable")
    tags, ages, rows = tags[order], ages[order], rows[order]
    bounds = np.flatnonzero(np.diff(ages)) + 1
    starts = np.concatenate([[0], bounds]).astype(np.int64)
    ends = np.concatenate([bounds, [tags.size]]).astype(np.int64)
    for start, end in zip(starts, ends, strict=True):
        cache.store(tags[start:end], rows[start:end])
        next_age = int(ages[end]) if end < tags.size else 0
        for _ in range(int(ages[start]) - next_age):
            cache.advance()
