"""Convert an existing partition's feature rows between the ``npy`` and ``ooc`` layouts in
place (``distmb-partition --convert DIR --features-layout ooc``), without partitioning again.

Crash safety: the new files are written first, under names the old layout does not use;
then ``partition.json`` is replaced atomically (the switch); then the old files are removed.
A crash before the switch leaves the old partition valid (a re-run overwrites the partial new
files), a crash after it leaves the new one valid (a re-run removes the leftovers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from distmb.core.atomic import write_atomic
from distmb.core.errors import InputError
from distmb.core.progress import Progress
from distmb.data.store.format import (
    FEATURE_LAYOUTS,
    META_FILE,
    NPY_FEATURE_ARRAYS,
    OOC_FEATURE_FILE,
    part_dir_name,
)
from distmb.data.store.rowfile import write_row_file
from distmb.data.store.store import STAMP_FILE, PartitionStore, read_meta
from distmb.partition.writer import ooc_feature_meta, save_npy


def layout_files(layout: str, replicated: bool) -> tuple[str, ...]:
    """File names (in a part's directory) that hold the feature rows in ``layout``."""
    if layout == "ooc":
        return (OOC_FEATURE_FILE,)
    return tuple(f"{name}.npy" for name in NPY_FEATURE_ARRAYS[: 2 if replicated else 1])


def convert_features(
    directory: str | os.PathLike[str], layout: str, progress: Progress | None = None
) -> dict[str, Any]:
    """Rewrite every part's feature rows of the partition in ``directory`` in ``layout``
    (``"npy"`` or ``"ooc"``), checking each part's files first.

    Returns:
        The new ``partition.json`` contents (unchanged when already in ``layout``; leftovers
        of an interrupted conversion are removed then).

    Raises:
        InputError: unknown layout; PartitionError: the partition does not verify.
    """
    log = progress or Progress(quiet=True)
    if layout not in FEATURE_LAYOUTS:
        raise InputError(
            f"--features-layout must be one of {', '.join(FEATURE_LAYOUTS)}, got {layout!r}"
        )
    root = Path(directory)
    meta = read_meta(root)
    current = str(meta.get("feature_layout", "npy"))
    replicated = bool(meta["partitioner"].get("replicate_halo_features", False))
    old_names = layout_files(current, replicated)
    if current == layout:
        _remove_leftovers(root, meta, replicated)
        log(f"{root}: features already in the {layout} layout")
        return meta
    files = dict(meta["files"])
    feature_file: dict[str, Any] | None = None
    for part in range(int(meta["num_parts"])):
        store = PartitionStore(root, part)  # verified: never convert corrupt rows
        pdir = root / part_dir_name(part)
        if layout == "ooc":
            tables = [store.features]
            if replicated:
                assert store.halo_features is not None
                tables.append(store.halo_features)
            info = write_row_file(pdir / OOC_FEATURE_FILE, tables)
            files[f"{part_dir_name(part)}/{OOC_FEATURE_FILE}"] = info["sha256"]
            feature_file = ooc_feature_meta(info)
        else:
            arrays = {"features": store.features}
            if replicated:
                arrays["halo_features"] = store.halo_features
            for name, table in arrays.items():
                files[f"{part_dir_name(part)}/{name}.npy"] = save_npy(
                    pdir / f"{name}.npy", np.ascontiguousarray(table)
                )
        for name in old_names:
            files.pop(f"{part_dir_name(part)}/{name}", None)
        if store.feature_file is not None:
            store.feature_file.close()
        del store
        log(f"part {part}: features written in the {layout} layout")
    new_meta = {k: v for k, v in meta.items() if k not in ("feature_layout", "feature_file")}
    new_meta["feature_layout"] = layout
    if feature_file is not None:
        new_meta["feature_file"] = feature_file
    new_meta["files"] = dict(sorted(files.items()))
    text = json.dumps(new_meta, indent=1) + "\n"
    write_atomic(root / META_FILE, lambda f: f.write(text.encode()), "partition")  # the switch
    _remove_leftovers(root, new_meta, replicated)
    log(f"{root}: converted from the {current} to the {layout} layout")
    return new_meta


def _remove_leftovers(root: Path, meta: dict[str, Any], replicated: bool) -> None:
    """Remove feature files of the layout ``meta`` does not use (what a conversion left
    behind) and the parts' verification stamps (their file lists changed)."""
    layout = str(meta.get("feature_layout", "npy"))
    other = [name for lay in FEATURE_LAYOUTS if lay != layout for name in layout_files(lay, True)]
    for part in range(int(meta["num_parts"])):
        pdir = root / part_dir_name(part)
        for name in other:
            rel = f"{part_dir_name(part)}/{name}"
            if rel not in meta["files"] and (pdir / name).is_file():
                (pdir / name).unlink()
        (pdir / STAMP_FILE).unlink(missing_ok=True)
