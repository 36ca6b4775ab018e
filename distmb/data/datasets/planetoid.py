"""``planetoid:DIR``: the Planetoid files ``ind.<name>.{x,y,tx,ty,allx,ally,graph,test.index}``
of Cora, CiteSeer and PubMed (Yang et al. 2016, as distributed by Kipf & Welling).

The files are Python 2 pickles. They are read with :class:`RestrictedUnpickler`, which admits
only the globals these files need (numpy array reconstruction, ``defaultdict``/``list``, and
the scipy sparse matrix classes, replaced by a stand-in that just keeps their state), so a
tampered file cannot run code. scipy is not imported.

The split is the public one (PyG's ``Planetoid(split="public")``): train = the rows of ``y``,
val = the next 500 vertices, test = the vertices of ``test.index``.
"""

from __future__ import annotations

import collections
import copyreg
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from distmb.core.errors import InputError
from distmb.data.datasets.loader_utils import (
    argmax_rows,
    as_float32,
    csr_shape,
    csr_to_dense,
    one_line,
)
from distmb.data.graph import UNLABELED, Graph

#: File suffixes of one Planetoid dataset: ``ind.<name>.<suffix>``.
PLANETOID_SUFFIXES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")

#: Size of the public validation split: the vertices right after the training vertices.
PUBLIC_VAL_SIZE = 500


class _SparseMatrixState:
    """Stand-in for a pickled scipy sparse matrix: keeps the pickled state dict.

    The state of ``csr_matrix``/``csc_matrix`` holds ``data``, ``indices``, ``indptr`` and
    ``_shape`` (``shape`` in old scipy versions); :func:`_features` decodes it with numpy.
    Unpickling creates instances with ``__new__`` (no ``__init__``), so ``fmt`` is a class
    attribute of the per-format subclasses.
    """

    fmt = "csr"

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _stand_in_class(fmt: str) -> type[_SparseMatrixState]:
    """The class the unpickler returns for scipy's ``<fmt>_matrix`` / ``<fmt>_array``."""
    return type(f"{fmt}_matrix_state", (_SparseMatrixState,), {"fmt": fmt})


def _numpy_globals() -> dict[tuple[str, str], Any]:
    reconstruct = np.empty(0).__reduce__()[0]  # numpy(._)core.multiarray._reconstruct
    scalar = np.float64(0).__reduce__()[0]  # numpy(._)core.multiarray.scalar
    out: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out[(module, "_reconstruct")] = reconstruct
        out[(module, "scalar")] = scalar
    return out


def _sparse_globals() -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    for fmt in ("csr", "csc"):
        cls = _stand_in_class(fmt)
        for module in (f"scipy.sparse.{fmt}", f"scipy.sparse._{fmt}", "scipy.sparse"):
            out[(module, f"{fmt}_matrix")] = cls
            out[(module, f"{fmt}_array")] = cls
    return out


def _latin1_encode(text: str, encoding: str) -> bytes:
    """``_codecs.encode`` as Python 3 uses it to pickle ``bytes`` with protocol 2 (latin-1 only)."""
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refused to encode with {encoding!r}")
    return text.encode("latin1")


def _builtin_globals() -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {
        ("collections", "defaultdict"): collections.defaultdict,
        ("_codecs", "encode"): _latin1_encode,  # files re-saved by Python 3 with protocol 2
    }
    for module in ("__builtin__", "builtins"):
        out.update(
            {
                (module, "list"): list,
                (module, "dict"): dict,
                (module, "int"): int,
                (module, "object"): object,
            }
        )
    out[("__builtin__", "long")] = int
    for module in ("copy_reg", "copyreg"):
        out[(module, "_reconstructor")] = copyreg._reconstructor
    return out


#: Every global a Planetoid pickle may reference, and what it resolves to.
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    **_numpy_globals(),
    **_sparse_globals(),
    **_builtin_globals(),
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only :data:`_ALLOWED_GLOBALS`; anything else is refused.

    Args:
        file: binary file object.
        path: file name for error messages.
    """

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file, encoding="latin1")
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise InputError(
                f"{self.path}: refused to unpickle global {module}.{name} (a Planetoid file "
                "holds only numpy arrays, scipy sparse matrices and a dict of lists)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise InputError(f"{self.path}: refused to unpickle a persistent id")


def restricted_load(path: Path) -> Any:
    """Unpickle ``path`` with :class:`RestrictedUnpickler`; :class:`InputError` naming the file
    for a missing, truncated or corrupt file or a refused global."""
    try:
        with open(path, "rb") as f:
            return RestrictedUnpickler(f, path).load()
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except Exception as exc:  # truncated or corrupt pickles raise many exception types
        raise InputError(
            f"{path}: not a readable Planetoid pickle ({type(exc).__name__}: {one_line(exc)})"
        ) from None


def load_planetoid(directory: str, *, symmetrize: bool = True, name: str | None = None) -> Graph:
    """Load a Planetoid dataset with its public split.

    Args:
        directory: folder holding ``ind.<name>.*``.
        symmetrize: add every edge in reverse too (the Planetoid graphs are undirected).
        name: dataset name (``cora``, ``citeseer``, ``pubmed``); inferred from the file names
            when ``None``.

    Returns:
        A validated :class:`Graph`: features float32[N, F] (zero rows and :data:`UNLABELED`
        for vertices missing from ``test.index``, as CiteSeer's isolated vertices), labels
        int64[N], train = ``range(len(y))``, val = the next 500 vertices, test = sorted
        ``test.index``.
    """
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"{d}: no such directory (expected Planetoid files ind.<name>.*)")
    name = name or _infer_name(d)
    paths = {s: d / f"ind.{name}.{s}" for s in PLANETOID_SUFFIXES}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:
        raise InputError(
            f"{d}: missing {', '.join(missing)} (expected all of ind.{name}."
            f"{{{','.join(PLANETOID_SUFFIXES)}}})"
        )

    x, allx, tx = (_features(restricted_load(paths[s]), paths[s]) for s in ("x", "allx", "tx"))
    y, ally, ty = (_one_hot(restricted_load(paths[s]), paths[s]) for s in ("y", "ally", "ty"))
    test_index = _read_test_index(paths["test.index"])
    _check_consistent(paths, x, y, allx, ally, tx, ty, test_index)

    num_nodes = max(allx.shape[0], int(test_index.max()) + 1 if test_index.size else 0)
    features = np.zeros((num_nodes, allx.shape[1]), dtype=np.float32)
    features[: allx.shape[0]] = allx
    features[test_index] = tx  # row j of tx belongs to vertex test_index[j]
    labels = np.full(num_nodes, UNLABELED, dtype=np.int64)
    labels[: ally.shape[0]] = argmax_one_hot(ally)
    labels[test_index] = argmax_one_hot(ty)
    num_classes = ally.shape[1]

    src, dst = _edges(restricted_load(paths["graph"]), paths["graph"], num_nodes)
    notes: list[str] = []
    gap = num_nodes - allx.shape[0] - test_index.size
    if gap:
        notes.append(
            f"{gap} vertices missing from {paths['test.index'].name} (isolated in "
            "the source data): zero features, unlabelled"
        )
    splits = _public_split(y.shape[0], test_index, labels, notes)
    notes.append(f"{int((labels == UNLABELED).sum())} of {num_nodes} vertices unlabelled")
    return Graph.from_edges(
        name,
        src,
        dst,
        num_nodes,
        features,
        labels,
        *splits,
        num_classes,
        symmetrize=symmetrize,
        source=str(d / f"ind.{name}.*"),
        notes=notes,
    )


def _infer_name(d: Path) -> str:
    """The ``<name>`` of the ``ind.<name>.<suffix>`` files in ``d`` (exactly one)."""
    names = set()
    for entry in d.iterdir():
        for suffix in PLANETOID_SUFFIXES:
            tail = f".{suffix}"
            if entry.name.startswith("ind.") and entry.name.endswith(tail):
                stem = entry.name[len("ind.") : -len(tail)]
                if stem:
                    names.add(stem)
    if not names:
        raise InputError(f"{d}: no Planetoid files ind.<name>.{{{','.join(PLANETOID_SUFFIXES)}}}")
    if len(names) > 1:
        raise InputError(
            f"{d}: files of several Planetoid datasets ({', '.join(sorted(names))});"
            " keep one dataset per directory"
        )
    return names.pop()


def _features(obj: Any, path: Path) -> np.ndarray:
    """float32[rows, F] from a pickled sparse matrix (stand-in) or dense 2-D array."""
    if isinstance(obj, _SparseMatrixState):
        state = getattr(obj, "state", None)
        if not isinstance(state, dict):
            raise InputError(f"{path}: sparse matrix without its state (data, indices, ...)")
        shape_value = state.get("_shape", state.get("shape"))
        parts = [state.get(k) for k in ("data", "indices", "indptr")]
        if shape_value is None or any(p is None for p in parts):
            raise InputError(f"{path}: sparse matrix without data/indices/indptr/shape")
        shape = csr_shape(np.asarray(shape_value), f"{path}: sparse matrix shape")
        what = f"{path}: sparse matrix "
        if obj.fmt == "csr":
            return csr_to_dense(*parts, shape, what)
        return np.ascontiguousarray(csr_to_dense(*parts, shape[::-1], what).T)  # csc
    if isinstance(obj, np.ndarray) and obj.ndim == 2:
        return as_float32(obj, str(path))
    raise InputError(
        f"{path}: expected a feature matrix (sparse or 2-D array), got {type(obj).__name__}"
    )


def _one_hot(obj: Any, path: Path) -> np.ndarray:
    """A pickled one-hot label matrix [rows, C] as a numeric numpy array."""
    if not (isinstance(obj, np.ndarray) and obj.ndim == 2 and obj.dtype.kind in "biuf"):
        raise InputError(
            f"{path}: expected a one-hot label matrix [rows, classes], got "
            f"{type(obj).__name__}{list(getattr(obj, 'shape', []))}"
        )
    return obj


def argmax_one_hot(one_hot: np.ndarray) -> np.ndarray:
    """int64[rows]: column of the largest entry of each row; :data:`UNLABELED` for all-zero
    rows."""
    rows, cols = np.nonzero(one_hot)
    return argmax_rows(
        rows.astype(np.int64), cols.astype(np.int64), one_hot[rows, cols], one_hot.shape[0]
    )


def _read_test_index(path: Path) -> np.ndarray:
    """int64[T]: the vertex ids of ``ind.<name>.test.index`` (one per line), in file order."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not readable as text ({one_line(exc)})") from None
    ids = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ids.append(int(line))
        except ValueError:
            raise InputError(f"{path}: line {lineno}: expected a vertex id, got {line!r}") from None
    return np.asarray(ids, dtype=np.int64)


def _check_consistent(
    paths: dict[str, Path],
    x: np.ndarray,
    y: np.ndarray,
    allx: np.ndarray,
    ally: np.ndarray,
    tx: np.ndarray,
    ty: np.ndarray,
    test_index: np.ndarray,
) -> None:
    """The shapes of the Planetoid arrays fit together; x/y are the first rows of allx/ally."""

    def fail(suffix: str, message: str) -> None:
        raise InputError(f"{paths[suffix]}: {message}")

    if allx.shape[0] != ally.shape[0]:
        fail("ally", f"{ally.shape[0]} rows but allx has {allx.shape[0]}")
    if x.shape[0] != y.shape[0] or x.shape[0] > allx.shape[0]:
        fail("y", f"{y.shape[0]} rows; x has {x.shape[0]}, allx {allx.shape[0]}")
    if tx.shape[0] != ty.shape[0] or tx.shape[0] != test_index.size:
        fail("test.index", f"{test_index.size} ids but tx has {tx.shape[0]} rows, ty {ty.shape[0]}")
    for suffix, arr in (("x", x), ("tx", tx)):
        if arr.shape[1] != allx.shape[1]:
            fail(suffix, f"{arr.shape[1]} feature columns but allx has {allx.shape[1]}")
    for suffix, arr in (("y", y), ("ty", ty)):
        if arr.shape[1] != ally.shape[1]:
            fail(suffix, f"{arr.shape[1]} label columns but ally has {ally.shape[1]}")
    if not np.array_equal(x, allx[: x.shape[0]]) or not np.array_equal(y, ally[: y.shape[0]]):
        fail("x", "x/y are not the first rows of allx/ally")
    if y.shape[0] + PUBLIC_VAL_SIZE > ally.shape[0]:
        fail(
            "ally",
            f"{ally.shape[0]} rows, too few for {y.shape[0]} training and "
            f"{PUBLIC_VAL_SIZE} validation vertices",
        )
    if test_index.size:
        if test_index.min() < allx.shape[0]:
            fail(
                "test.index",
                f"vertex id {int(test_index.min())} collides with the {allx.shape[0]} rows of allx",
            )
        if np.unique(test_index).size != test_index.size:
            fail("test.index", "lists a vertex id twice")


def _edges(graph: Any, path: Path, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(src int64[E], dst int64[E]) of the adjacency dict ``{u: [v, ...]}`` (edges u -> v)."""
    if not isinstance(graph, dict):
        raise InputError(f"{path}: expected a dict of adjacency lists, got {type(graph).__name__}")
    src: list[int] = []
    dst: list[int] = []
    for u, neighbours in graph.items():
        if not isinstance(u, (int, np.integer)) or not isinstance(neighbours, (list, tuple)):
            raise InputError(
                f"{path}: expected int -> list of int entries, got "
                f"{type(u).__name__} -> {type(neighbours).__name__}"
            )
        src.extend([int(u)] * len(neighbours))
        dst.extend(neighbours)
    try:
        src_arr = np.asarray(src, dtype=np.int64)
        dst_arr = np.asarray(dst, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{path}: adjacency lists must hold integer vertex ids") from None
    bad = (src_arr < 0) | (src_arr >= num_nodes) | (dst_arr < 0) | (dst_arr >= num_nodes)
    if bad.any():
        e = int(np.argmax(bad))
        raise InputError(
            f"{path}: edge {int(src_arr[e])} -> {int(dst_arr[e])} has an endpoint "
            f"outside the {num_nodes} vertices"
        )
    return src_arr, dst_arr


def _public_split(
    num_train: int, test_index: np.ndarray, labels: np.ndarray, notes: list[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test) int64 ascending: ``range(num_train)``, the next 500, sorted
    ``test_index``. Unlabelled vertices are left out (and counted in ``notes``)."""
    train = np.arange(num_train, dtype=np.int64)
    val = np.arange(num_train, num_train + PUBLIC_VAL_SIZE, dtype=np.int64)
    test = np.sort(test_index)
    out = []
    dropped = []
    for split_name, idx in (("train", train), ("val", val), ("test", test)):
        keep = labels[idx] != UNLABELED
        if not keep.all():
            dropped.append(f"{int((~keep).sum())} {split_name}")
        out.append(idx[keep])
    notes.append(
        f"split: Planetoid public split (train = the {num_train} rows of y, val = the "
        f"next {PUBLIC_VAL_SIZE}, test = test.index) -> "
        f"{out[0].size}/{out[1].size}/{out[2].size}"
    )
    if dropped:
        notes.append(f"unlabelled vertices left out of the split: {', '.join(dropped)}")
    return out[0], out[1], out[2]
