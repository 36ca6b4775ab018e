"""The temporaries of writers (``.NAME.KIND-HOST-PID``) and the one sweep that removes those
of dead writers: atomic writes, partition staging siblings, checkpoint directories."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from distmb.core.atomic import atomic_path, write_atomic
from distmb.core.dirlock import DirectoryInUse, release_directory
from distmb.core.errors import OutputError
from distmb.core.temporaries import MAX_PID, remove_stale_temporaries, temporary_path
from distmb.engine.outputs import prepare_checkpoint_dir
from distmb.partition.staging import remove_stale_staging, staging_path
from distmb.partition.writer import publish

#: A process id no process has (Linux's pid_max is at most 2**22).
DEAD = 999_999_999
HOST = socket.gethostname()


def touch(directory: Path, names: list[str]) -> None:
    for name in names:
        (directory / name).write_bytes(b"half written")


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_temporary_path_names_the_target_host_and_writer(tmp_path):
    target = tmp_path / "checkpoint.pt"
    assert temporary_path(target) == tmp_path / f".checkpoint.pt.tmp-{HOST}-{os.getpid()}"
    assert temporary_path(target, "old", 7) == tmp_path / f".checkpoint.pt.old-{HOST}-7"
    with pytest.raises(ValueError, match="alphanumeric word"):
        temporary_path(target, "tmp-x")


def test_the_sweep_removes_dead_writers_of_this_host_only(tmp_path):
    """Each name against the rule written out by hand: this host (or no host, the older
    naming) and a pid neither this process nor alive here."""
    alive, mine = os.getppid(), os.getpid()
    stale = [
        f".a.tmp-{HOST}-{DEAD}",  # dead local writer
        f".b.npy.tmp-{DEAD}",  # the older, host-less naming, dead here
    ]
    kept = [
        f".a.tmp-{HOST}-{alive}",  # live writer
        f".a.tmp-{HOST}-{mine}",  # this process's own write in progress
        f".a.tmp-elsewhere-{DEAD}",  # another host: judged there, never here
        f".a.tmp-{HOST}-{MAX_PID + 1}",  # no process id at all
        f"a.tmp-{HOST}-{DEAD}",  # not hidden: not a temporary
        f".a.tmp-{HOST}-x{DEAD}",  # pid not a number
        f".a.tmp-{HOST}-",  # no pid
        f".a.tmp--{DEAD}",  # empty host
        f".a.tmpx-{HOST}-{DEAD}",  # another infix
        f".a.old-{HOST}-{DEAD}",  # another kind
        f"..tmp-{HOST}-{DEAD}",  # no target name
        "a",
    ]
    touch(tmp_path, stale + kept)
    (tmp_path / f".d.tmp-{HOST}-{DEAD}").mkdir()  # a directory, with its contents
    (tmp_path / f".d.tmp-{HOST}-{DEAD}" / "part-0").mkdir()
    (tmp_path / f".d.tmp-{HOST}-{DEAD}" / "part-0" / "x.npy").write_bytes(b"x")
    removed = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == sorted([*stale, f".d.tmp-{HOST}-{DEAD}"])
    assert names(tmp_path) == sorted(kept)


def test_the_sweep_keeps_other_targets_other_kinds_and_hostless_names_when_told(tmp_path):
    touch(
        tmp_path,
        [
            f".out.tmp-{HOST}-{DEAD}",
            f".out.tmp-{DEAD}",
            f".out2.tmp-{HOST}-{DEAD}",  # another target
            f".ou.tmp-{HOST}-{DEAD}",
            f".out.old-{HOST}-{DEAD}",
        ],
    )
    removed = remove_stale_temporaries(tmp_path, name="out", hostless=False)
    assert [p.name for p in removed] == [f".out.tmp-{HOST}-{DEAD}"]
    removed = remove_stale_temporaries(tmp_path, name="out")
    assert [p.name for p in removed] == [f".out.tmp-{DEAD}"]
    removed = remove_stale_temporaries(tmp_path, name="out", kind="old")
    assert [p.name for p in removed] == [f".out.old-{HOST}-{DEAD}"]
    assert names(tmp_path) == sorted([f".out2.tmp-{HOST}-{DEAD}", f".ou.tmp-{HOST}-{DEAD}"])


def test_a_stale_link_goes_its_target_stays(tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep").write_bytes(b"1")
    link = tmp_path / f".x.tmp-{HOST}-{DEAD}"
    link.symlink_to(target)
    assert remove_stale_temporaries(tmp_path) == [link]
    assert (target / "keep").read_bytes() == b"1" and not link.is_symlink()


# -- atomic writes -------------------------------------------------------------------------
def test_write_atomic_writes_the_temporary_then_renames_it(tmp_path):
    """While ``write`` runs, the bytes go to ``.NAME.tmp-HOST-PID`` and the target keeps its
    previous bytes; a sweep meanwhile keeps this process's temporary; afterwards the target
    holds the new bytes and no temporary is left. A failed write leaves the target as it
    was."""
    path = tmp_path / "state.json"
    path.write_bytes(b"previous")
    seen = {}

    def write(f) -> None:
        f.write(b"new")
        f.flush()
        seen["tmp"] = temporary_path(path).read_bytes()
        seen["target"] = path.read_bytes()
        seen["swept"] = remove_stale_temporaries(tmp_path)

    write_atomic(path, write)
    assert seen == {"tmp": b"new", "target": b"previous", "swept": []}
    assert path.read_bytes() == b"new" and names(tmp_path) == ["state.json"]

    def fail(f) -> None:
        f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError, match="No space left"):
        write_atomic(path, fail)
    assert path.read_bytes() == b"new" and names(tmp_path) == ["state.json"]
    with atomic_path(path) as tmp:
        assert tmp == temporary_path(path)
        tmp.write_bytes(b"by name")
    assert path.read_bytes() == b"by name" and names(tmp_path) == ["state.json"]


# -- partition staging ---------------------------------------------------------------------
def test_staging_names_and_the_old_sibling_kept_without_out(tmp_path):
    """``.OUT.old-HOST-PID`` of a dead writer is the previous partition: removed only while
    OUT exists (else it is the only copy); ``.OUT.tmp`` goes either way."""
    out = tmp_path / "p"
    assert staging_path(out, "tmp", 5) == tmp_path / f".p.tmp-{HOST}-5"
    with pytest.raises(ValueError, match="staging kind must be one of tmp, old"):
        staging_path(out, "new")
    touch(tmp_path, [f".p.tmp-{HOST}-{DEAD}", f".p.old-{HOST}-{DEAD}", f".p.old-{DEAD}"])
    assert [p.name for p in remove_stale_staging(out)] == [f".p.tmp-{HOST}-{DEAD}"]
    out.mkdir()
    removed = remove_stale_staging(out)
    assert sorted(p.name for p in removed) == sorted([f".p.old-{HOST}-{DEAD}", f".p.old-{DEAD}"])
    assert names(tmp_path) == ["p"]


def test_publish_puts_the_old_partition_back_when_the_rename_fails(tmp_path, monkeypatch):
    out, tmp = tmp_path / "p", staging_path(tmp_path / "p", "tmp")
    out.mkdir()
    (out / "partition.json").write_text("old")
    tmp.mkdir()
    (tmp / "partition.json").write_text("new")
    real = os.replace

    def replace(src, dst):
        if Path(src) == tmp:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="No space left"):
        publish(tmp, out, overwrite=True)
    assert (out / "partition.json").read_text() == "old"
    assert names(tmp_path) == sorted(["p", tmp.name])  # no .old left: it is OUT again
    monkeypatch.undo()
    publish(tmp, out, overwrite=True)
    assert (out / "partition.json").read_text() == "new" and names(tmp_path) == ["p"]


# -- checkpoint directories ----------------------------------------------------------------
def test_a_held_checkpoint_dir_is_not_swept_by_a_refused_run(tmp_path):
    """A host-less temporary (older naming) may be a live run's on another host; the run
    holding the directory keeps it, and a second run is refused before it sweeps. Once the
    holder is gone, the next run removes it; a rank that does not hold the directory removes
    only the temporaries named after its host."""
    legacy, local = f".checkpoint.pt.tmp-{DEAD}", f".checkpoint.pt.tmp-{HOST}-{DEAD}"
    touch(tmp_path, [legacy])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from distmb.core.dirlock import hold_directory; "
            "hold_directory(sys.argv[1], '--checkpoint-dir'); print('held', flush=True); "
            "sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(DirectoryInUse):
            prepare_checkpoint_dir(str(tmp_path), resume=False, overwrite=False)
        assert (tmp_path / legacy).exists()
    finally:
        holder.stdin.close()
        holder.wait()
    touch(tmp_path, [local])
    prepare_checkpoint_dir(str(tmp_path), resume=False, overwrite=False, hold=False)
    assert (tmp_path / legacy).exists() and not (tmp_path / local).exists()
    prepare_checkpoint_dir(str(tmp_path), resume=False, overwrite=False)
    release_directory(tmp_path)
    assert not (tmp_path / legacy).exists()
