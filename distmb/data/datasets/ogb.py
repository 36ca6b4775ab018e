"""``ogb:DIR``: an OGB node-property-prediction directory as downloaded, read without ``ogb``.

Two layouts, as OGB ships them (``master.csv``'s ``binary`` column decides which a dataset
uses). The CSV layout (ogbn-arxiv, ogbn-products; all files gzip'd, without header)::

    DIR/raw/edge.csv.gz            E lines "src,dst"            (edge src -> dst)
    DIR/raw/node-feat.csv.gz       N lines of F numbers
    DIR/raw/node-label.csv.gz      N lines, one class id, or "nan" (unlabelled)
    DIR/raw/num-node-list.csv.gz   optional: one line, N
    DIR/raw/num-edge-list.csv.gz   optional: one line, E (lets the edge arrays be preallocated)
    DIR/split/<scheme>/{train,valid,test}.csv.gz   one vertex id per line

The binary layout (ogbn-papers100M) replaces the ``raw/`` CSV files by ``raw/data.npz`` and
``raw/node-label.npz``. A directory with ``raw/edge.csv.gz`` is read as CSV
(:mod:`distmb.data.datasets.ogb_csv`), else one with ``raw/data.npz`` as binary
(:mod:`distmb.data.datasets.ogb_npz`); both give an
:class:`~distmb.data.datasets.ogb_arrays.OgbArrays`.

Either is converted once to a binary cache ``DIR/distmb-cache/``
(:mod:`distmb.data.datasets.ogb_cache`: ``.npy`` files plus ``meta.json`` recording the size
and mtime of every source file). Later loads read the cache (edges and features
memory-mapped, read-only) while the sources are unchanged. The cache is built in a temporary
directory inside DIR and renamed into place, so an interrupted build never leaves a cache
that looks valid; an invalid cache is rebuilt.
"""

from __future__ import annotations

from pathlib import Path

from distmb.core.errors import InputError
from distmb.data.datasets.loader_utils import SPLIT_NAMES, unlabelled_note
from distmb.data.datasets.ogb_arrays import LAYOUTS, SPLIT_LAYOUT, OgbArrays
from distmb.data.datasets.ogb_csv import read_csv_layout
from distmb.data.datasets.ogb_npz import read_npz_layout
from distmb.data.graph import Graph

#: Split file of each split array, in ``split/<scheme>/``.
_SPLIT_FILES = dict(zip(SPLIT_NAMES, ("train.csv.gz", "valid.csv.gz", "test.csv.gz"), strict=True))
#: Split file of OGB's own saver that is a torch pickle (never read).
_PICKLED_SPLIT = "split_dict.pt"


def load_ogb(directory: str, *, symmetrize: bool = True) -> Graph:
    """Load an OGB node-property-prediction directory (see the module docstring).

    Args:
        directory: the dataset directory (``ogbn_products/``, ``ogbn-arxiv/``); its basename
            names the graph (``ogbn_products`` -> ``ogbn-products``).
        symmetrize: add every edge in reverse too (OGB stores each undirected edge once).

    Returns:
        A validated :class:`Graph`: features float32[N, F] (a read-only memory map when read
        from the cache or from an uncompressed ``data.npz``), labels int64[N]
        (:data:`UNLABELED` for ``nan``), the OGB split.
    """
    arrays, notes, source = read_ogb_arrays(directory)
    return Graph.from_edges(
        dataset_name(Path(directory)),
        arrays.src,
        arrays.dst,
        arrays.labels.shape[0],
        arrays.features,
        arrays.labels,
        arrays.train_idx,
        arrays.val_idx,
        arrays.test_idx,
        arrays.num_classes,
        symmetrize=symmetrize,
        source=source,
        notes=notes,
    )


def read_ogb_arrays(directory: str) -> tuple[OgbArrays, list[str], str]:
    """The arrays of an OGB directory without building the graph: edges and features
    memory-mapped (from the cache, converted on a first load, or from an uncompressed
    ``data.npz``), labels and splits in memory.

    Returns:
        (arrays, notes on what was read, the source to name in graph errors).
    """
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"{d}: no such directory (expected an OGB dataset with {LAYOUTS})")
    raw = d / "raw"
    binary = not (raw / "edge.csv.gz").is_file() and (raw / "data.npz").is_file()
    scheme, splits = locate_split(d)
    notes: list[str] = []
    schemes = _schemes(d)
    if len(schemes) > 1:
        notes.append(
            f"several split schemes in {d / 'split'} ({', '.join(schemes)}); "
            f"used {scheme!r}, the first in sorted order"
        )
    if binary:
        arrays, source = read_npz_layout(d, scheme, splits, notes)
    else:
        arrays = read_csv_layout(d, scheme, splits, notes)
        source = str(d)
    notes.append(
        f"split: OGB split/{scheme} ({arrays.train_idx.size}/"
        f"{arrays.val_idx.size}/{arrays.test_idx.size})"
    )
    notes.append(unlabelled_note(arrays.labels))
    return arrays, notes, source


def dataset_name(d: Path) -> str:
    """The directory's basename, ``ogbn_x``/``ogbn-x`` normalised to ``ogbn-x``."""
    base = d.resolve().name
    if base.lower().startswith("ogbn"):
        return "ogbn-" + base[len("ogbn") :].lstrip("-_").replace("_", "-")
    return base


def _schemes(d: Path) -> list[str]:
    split_root = d / "split"
    if not split_root.is_dir():
        return []
    return sorted(p.name for p in split_root.iterdir() if p.is_dir())


def locate_split(d: Path) -> tuple[str, dict[str, Path]]:
    """(scheme, split file of each of :data:`SPLIT_NAMES`): the first ``split/<scheme>/`` in
    sorted order; :class:`InputError` naming the first file missing."""
    schemes = _schemes(d)
    if not schemes:
        raise InputError(f"{d / 'split'}: no split scheme directory (expected {LAYOUTS})")
    scheme = schemes[0]
    splits = {k: d / "split" / scheme / f for k, f in _SPLIT_FILES.items()}
    for path in splits.values():
        if not path.is_file():
            hint = ""
            if (path.parent / _PICKLED_SPLIT).is_file():
                hint = f"; {_PICKLED_SPLIT} there is a torch pickle and is not read"
            raise InputError(f"{path}: no such file (expected {SPLIT_LAYOUT}){hint}")
    return scheme, splits
