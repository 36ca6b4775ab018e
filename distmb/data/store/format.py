"""The on-disk partition format, version 1: names, dtypes and shapes of every file.

The writer (``partition/``) and the reader (:class:`distmb.data.PartitionStore`) both take
their file lists from here, so the two cannot drift apart. docs/partition-format.md describes
the format for people.
"""

from __future__ import annotations

import tokenize
import zipfile
from dataclasses import dataclass

import numpy as np

#: What ``np.load`` raises on a damaged or forged ``.npy``/``.npz`` file: unreadable bytes,
#: a truncated body, a bad zip, or a header that ``ast.literal_eval`` cannot parse.
NPY_READ_ERRORS = (
    ValueError,
    OSError,
    EOFError,
    SyntaxError,
    MemoryError,
    tokenize.TokenError,
    zipfile.BadZipFile,
)

FORMAT_VERSION = 1
META_FILE = "partition.json"
#: VID_o -> owning part, int32[num_nodes], at the top of the partition directory.
NODE_PART_FILE = "node_part.npy"
#: Indices are stored as int32 when every local id fits, else int64.
INT32_LIMIT = np.iinfo(np.int32).max


def index_dtype(count: int) -> np.dtype:
    """The dtype of ids in ``[0, count)``: int32 when ``count <= INT32_LIMIT``, else int64.

    The one rule for every id array the package builds: a graph's ``indices``, a part's
    ``indices`` and ``send_ids``.
    """
    return np.dtype(np.int32 if count <= INT32_LIMIT else np.int64)


#: How a partition stores its feature rows (``partition.json``'s ``feature_layout``; absent
#: means ``"npy"``): ``"npy"``: ``features.npy`` (+ ``halo_features.npy``) per part;
#: ``"ooc"``: one raw row file per part for out-of-core reads (:data:`OOC_FEATURE_FILE`).
FEATURE_LAYOUTS: tuple[str, ...] = ("npy", "ooc")
#: The ``ooc`` layout's row file of a part: its solid rows, then its replicated halo rows
#: when the partition has them; rows at aligned offsets (``distmb.data.store.rowfile``).
OOC_FEATURE_FILE = "features.bin"
#: The arrays a part stores as ``.npy`` only in the ``npy`` feature layout.
NPY_FEATURE_ARRAYS: tuple[str, ...] = ("features", "halo_features")


def part_dir_name(part: int) -> str:
    """Sub-directory of part ``part``: ``part-<i>``."""
    return f"part-{part}"


@dataclass(frozen=True)
class ArraySpec:
    """One ``.npy`` file of a part.

    Attributes:
        name: file stem (``indptr`` -> ``part-<i>/indptr.npy``).
        dtypes: accepted dtypes (the first is what the writer uses by default).
        shape: symbolic shape; each entry is a count key of the part's metadata
            (``n_solid``, ``n_halo``, ...), ``"+1"`` suffix for CSR pointers, or ``"F"``
            for the feature width.
        optional: present only for some partitioner options.
    """

    name: str
    dtypes: tuple[str, ...]
    shape: tuple[str, ...]
    optional: bool = False


PART_ARRAYS: tuple[ArraySpec, ...] = (
    ArraySpec("indptr", ("int64",), ("n_solid+1",)),
    ArraySpec("indices", ("int32", "int64"), ("n_edges",)),
    ArraySpec("orig_ids", ("int64",), ("n_local",)),
    ArraySpec("halo_owner", ("int32",), ("n_halo",)),
    ArraySpec("features", ("float32",), ("n_solid", "F")),
    ArraySpec("labels", ("int64",), ("n_solid",)),
    ArraySpec("train_idx", ("int64",), ("n_train",)),
    ArraySpec("val_idx", ("int64",), ("n_val",)),
    ArraySpec("test_idx", ("int64",), ("n_test",)),
    ArraySpec("in_degree", ("int64",), ("n_local",)),
    ArraySpec("send_ptr", ("int64",), ("P+1",)),
    ArraySpec("send_ids", ("int32", "int64"), ("n_send",)),
    ArraySpec("halo_features", ("float32",), ("n_halo", "F"), optional=True),
)
