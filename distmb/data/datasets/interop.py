"""Graphs from PyTorch Geometric and DGL, in memory: :func:`from_pyg` and :func:`from_dgl`.

Both read the object's attributes only (neither library is imported here, so a stand-in
with the same attributes converts as well) and build the graph through
:meth:`Graph.from_edges`: validated, self-loops and duplicate edges removed, symmetrised by
default, like every file loader. The result trains (``LocalGraph.from_graph``) and
partitions (``distmb.partition_graph``) without files in between.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from distmb.core.errors import InputError
from distmb.data.graph import Graph

#: The masks of the three splits, in (train, val, test) order.
SPLITS = ("train", "val", "test")


def from_pyg(data: Any, *, name: str = "pyg", symmetrize: bool = True) -> Graph:
    """A PyG ``Data`` (homogeneous) as a :class:`Graph`.

    Reads ``x`` float[N, F], ``y`` int[N] (``-1``: unlabelled), ``edge_index`` int[2, E]
    (row 0 the sources, row 1 the targets: PyG's ``source_to_target`` flow) and the
    ``train_mask``, ``val_mask``, ``test_mask`` bool[N]. ``num_classes`` is ``max(y) + 1``.

    Args:
        data: the ``torch_geometric.data.Data`` (or any object with those attributes).
        name: the graph's name (in its identity, checkpoints and logs).
        symmetrize: add every edge in reverse too (the default of every loader).

    Raises:
        InputError: naming ``from_pyg``, the missing or malformed field and what was
            expected.
    """
    where = "from_pyg"
    x = _field(data, "x", where, "node features float[N, F]")
    y = _field(data, "y", where, "node labels int[N]")
    edge_index = _array(_field(data, "edge_index", where, "edges int[2, E]"))
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise InputError(
            f"{where}: edge_index must be int[2, E] (sources, targets), got shape "
            f"{list(edge_index.shape)}"
        )
    masks = [_field(data, f"{split}_mask", where, "a bool[N] mask") for split in SPLITS]
    return _graph(where, name, x, y, edge_index[0], edge_index[1], masks, symmetrize)


def from_dgl(
    graph: Any,
    *,
    name: str = "dgl",
    symmetrize: bool = True,
    feat: str = "feat",
    label: str = "label",
) -> Graph:
    """A ``DGLGraph`` (one node and one edge type) as a :class:`Graph`.

    Reads ``graph.edges()`` (sources, destinations), ``graph.num_nodes()`` and the node data
    ``ndata[feat]`` float[N, F], ``ndata[label]`` int[N] (``-1``: unlabelled),
    ``ndata["train_mask"]``, ``["val_mask"]``, ``["test_mask"]`` bool[N], as DGL's built-in
    datasets (``dgl.data.CoraGraphDataset()[0]``) have them.

    Args:
        graph: the ``dgl.DGLGraph`` (or any object with ``edges()``, ``num_nodes()`` and
            ``ndata``).
        name: the graph's name.
        symmetrize: add every edge in reverse too.
        feat, label: the node-data keys of the features and the labels.

    Raises:
        InputError: naming ``from_dgl``, the missing or malformed field and what was
            expected.
    """
    where = "from_dgl"
    for method in ("edges", "num_nodes"):
        if not callable(getattr(graph, method, None)):
            raise InputError(
                f"{where}: expected a DGLGraph, got {type(graph).__name__} (no {method}())"
            )
    ntypes = getattr(graph, "ntypes", None)
    etypes = getattr(graph, "canonical_etypes", None)
    if (ntypes is not None and len(ntypes) > 1) or (etypes is not None and len(etypes) > 1):
        raise InputError(
            f"{where}: a heterogeneous graph ({len(ntypes or [])} node types, "
            f"{len(etypes or [])} edge types); convert one with dgl.to_homogeneous first"
        )
    ndata = getattr(graph, "ndata", None)
    if ndata is None:
        raise InputError(f"{where}: the graph has no ndata")

    def node_field(key: str, expected: str) -> Any:
        if key not in ndata:
            raise InputError(
                f"{where}: ndata has no {key!r} ({expected}); it has {sorted(ndata.keys())}"
            )
        return ndata[key]

    x = node_field(feat, "node features float[N, F]")
    y = node_field(label, "node labels int[N]")
    masks = [node_field(f"{split}_mask", "a bool[N] mask") for split in SPLITS]
    src, dst = graph.edges()
    num_nodes = int(graph.num_nodes())
    x_arr = _array(x)
    if x_arr.ndim != 2 or x_arr.shape[0] != num_nodes:
        raise InputError(
            f"{where}: ndata[{feat!r}] must be float[{num_nodes}, F] (num_nodes() rows), got "
            f"shape {list(x_arr.shape)}"
        )
    return _graph(where, name, x_arr, y, _array(src), _array(dst), masks, symmetrize)


def _field(obj: Any, key: str, where: str, expected: str) -> Any:
    value = getattr(obj, key, None)
    if value is None:
        raise InputError(f"{where}: the data has no {key!r} ({expected})")
    return value


def _array(value: Any) -> np.ndarray:
    """A torch tensor (any device) or array-like as a numpy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _graph(
    where: str,
    name: str,
    x: Any,
    y: Any,
    src: Any,
    dst: Any,
    masks: list[Any],
    symmetrize: bool,
) -> Graph:
    """Check the fields' shapes and dtypes, then :meth:`Graph.from_edges`."""
    features = _array(x)
    if features.ndim != 2 or features.dtype.kind not in "fiub":
        raise InputError(
            f"{where}: node features must be a 2-D numeric array [N, F], got "
            f"{features.dtype}{list(features.shape)}"
        )
    n = features.shape[0]
    labels = _array(y)
    if labels.shape != (n,) or labels.dtype.kind not in "iu":
        raise InputError(
            f"{where}: labels must be int[{n}] (one class per node; multi-label targets are not "
            f"supported), got {labels.dtype}{list(labels.shape)}"
        )
    src_arr, dst_arr = _array(src), _array(dst)
    for what, arr in (("sources", src_arr), ("targets", dst_arr)):
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise InputError(
                f"{where}: edge {what} must be int[E], got {arr.dtype}{list(arr.shape)}"
            )
    split_ids = []
    for split, mask in zip(SPLITS, masks, strict=True):
        m = _array(mask)
        if m.dtype != np.bool_ or m.shape != (n,):
            raise InputError(
                f"{where}: {split}_mask must be bool[{n}] (one split; pick a column of a 2-D "
                f"mask first), got {m.dtype}{list(m.shape)}"
            )
        split_ids.append(np.flatnonzero(m).astype(np.int64))
    labelled = labels[labels >= 0]
    num_classes = int(labelled.max()) + 1 if labelled.size else 0
    return Graph.from_edges(
        name,
        src_arr.astype(np.int64),
        dst_arr.astype(np.int64),
        n,
        np.ascontiguousarray(features, dtype=np.float32),
        labels.astype(np.int64),
        *split_ids,
        num_classes,
        symmetrize=symmetrize,
        source=where,
    )
