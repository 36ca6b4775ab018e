"""The temporary siblings of a partition directory ``OUT``, named as every temporary of the
project (:mod:`distmb.core.temporaries`): ``.OUT.tmp-HOST-PID``, the partition being written
(renamed onto ``OUT`` once complete), and ``.OUT.old-HOST-PID``, the partition an
``--overwrite`` replaces (:func:`~distmb.partition.writer.publish` moves ``OUT`` there, renames
the new partition onto ``OUT`` and deletes it; when that rename fails it moves it back onto
``OUT``).

A writer killed on the way (``SIGKILL``, a lost node) leaves its sibling behind, possibly
large. The next write to the same ``OUT`` removes the siblings of writers that are gone
(:func:`~distmb.core.temporaries.remove_stale_temporaries`: named after this host and a
process id that no longer exists here; a sibling of another host is left alone: its writer
may still run there). The host-less ``.OUT.tmp-PID`` / ``.OUT.old-PID`` of older versions
are judged by this host's process ids too: ``OUT`` has one writer at a time (a second
writer's rename would replace the first's partition or fail), so a live writer of an older
version on another host is no case to keep. A ``.old`` sibling is removed only while
``OUT`` exists: otherwise the writer died between its two renames and the sibling holds the
only copy of the previous partition.
"""

from __future__ import annotations

from pathlib import Path

from distmb.core.temporaries import TMP_KIND, remove_stale_temporaries, temporary_path

#: Kind of the sibling that holds the partition an ``--overwrite`` replaces.
OLD_KIND = "old"
#: Kinds of siblings: the partition being written, the one being replaced.
STAGING_KINDS = (TMP_KIND, OLD_KIND)


def staging_path(out: Path, kind: str, pid: int | None = None) -> Path:
    """``.OUT.KIND-HOST-PID`` beside ``out`` (``kind`` in :data:`STAGING_KINDS`; ``pid``:
    this process by default).

    Raises:
        ValueError: ``kind`` is not one of :data:`STAGING_KINDS`.
    """
    if kind not in STAGING_KINDS:
        raise ValueError(f"staging kind must be one of {', '.join(STAGING_KINDS)}, got {kind!r}")
    return temporary_path(out, kind, pid)


def remove_stale_staging(out: Path) -> list[Path]:
    """Delete the siblings of ``out`` whose writer is gone (module docstring); returns them.
    A sibling that cannot be deleted is left (the write goes on)."""
    removed = remove_stale_temporaries(out.parent, name=out.name, kind=TMP_KIND)
    if out.exists():
        removed += remove_stale_temporaries(out.parent, name=out.name, kind=OLD_KIND)
    return removed
