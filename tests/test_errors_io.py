"""Nothing silent: every tool (train, partition, predict, report) that cannot write an output
(a full filesystem, ``/dev/full``, an injected ``ENOSPC``) stops with one line naming what it
was writing and where, exit code 74, the previous file intact and no temporary file left;
``distmb-report`` on a file that is not a ``--results`` file; ``distmb-partition``'s flags
checked before any data is loaded; a bad flag under ``mpiexec`` reported once."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli, run_train_cli
from test_distributed import mpirun

from distmb.cli.partition import main as partition_main
from distmb.cli.predict import main as predict_main
from distmb.cli.report import main as report_main
from distmb.core.atomic import write_atomic
from distmb.core.dirlock import LOCK_FILE
from distmb.core.errors import EXIT_BAD_INPUT, EXIT_OUTPUT_FAILED, OutputError
from distmb.core.temporaries import TMP_INFIX, temporary_path

#: A graph small enough that a run of one epoch takes well under a second.
TINY = "synthetic:nodes=300,avg_degree=4,feat_dim=8,classes=3"
TRAIN = [
    "--dataset", TINY, "--layers", "2", "--fanout", "3,3", "--hidden", "8",
    "--batch-size", "100", "--no-progress", "--epochs", "1", "--threads", "1",
]  # fmt: skip
PARTITION = ["--dataset", TINY, "--parts", "2", "--quiet", "--threads", "1"]
#: ``strerror`` of ENOSPC, as the error lines end.
NO_SPACE = os.strerror(errno.ENOSPC)
PREVIOUS = b"the previous file\n"


def error_lines(err: str) -> list[str]:
    """The ``PROG: error: ...`` lines of a command's stderr."""
    return [line for line in err.splitlines() if ": error: " in line]


def assert_one_line(code: int, err: str, prog: str, message: str, exit_code: int) -> None:
    """The command exited with ``exit_code`` after exactly one error line, ``prog: error:
    message``, and no traceback."""
    assert code == exit_code, err
    assert "Traceback" not in err, err
    assert error_lines(err) == [f"{prog}: error: {message}"], err


def temporaries(directory: Path) -> list[Path]:
    """The atomic writers' temporary files (``.NAME.tmp-HOST-PID``) under ``directory``."""
    return [p for p in directory.rglob(f"*{TMP_INFIX}*")]


def tree_digest(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory``, by relative path."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def fail_replace_onto(monkeypatch: pytest.MonkeyPatch, target: Callable[[Path], bool]) -> None:
    """``os.replace`` fails with ENOSPC when renaming a temporary (``.NAME.tmp-HOST-PID``) onto
    a path ``target`` accepts: the last step of every atomic write and of the partition
    writer's publication."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if TMP_INFIX in Path(src).name and target(Path(dst)):
            raise OSError(errno.ENOSPC, NO_SPACE)
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


# -- a real full filesystem ---------------------------------------------------------------
@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (mounting needs root with CAP_SYS_ADMIN: skipped elsewhere)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(filesystem: Path) -> None:
    """Take every free block of ``filesystem`` (a filler file written until ENOSPC)."""
    with open(filesystem / "filler", "wb", buffering=0) as f:
        block = b"\0" * 4096
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


# -- the mechanism -----------------------------------------------------------------------
def test_write_atomic_reports_the_os_error_of_a_library_that_hides_it(tmp_path: Path) -> None:
    """``torch.save`` turns a failed write into a RuntimeError; ``write_atomic`` reports the
    write's own OSError. The temporary file is made a link to /dev/full (every write fails
    with ENOSPC, no root needed); the previous file stays and the link is removed."""
    path = tmp_path / "state.pt"
    path.write_bytes(PREVIOUS)
    temporary_path(path).symlink_to("/dev/full")
    with pytest.raises(OutputError) as exc:
        write_atomic(path, lambda f: torch.save({"w": torch.zeros(10_000)}, f), "checkpoint")
    assert str(exc.value) == f"cannot write checkpoint {path}: {NO_SPACE}"
    assert exc.value.exit_code == EXIT_OUTPUT_FAILED and isinstance(exc.value, OSError)
    assert path.read_bytes() == PREVIOUS and not temporaries(tmp_path)


def test_write_atomic_never_replaces_a_device(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="/dev/full: exists and is not a regular file"):
        write_atomic("/dev/full", lambda f: f.write(b"x"), "results")
    assert Path("/dev/full").is_char_device()


# -- train: --results, --checkpoint-dir ---------------------------------------------------
def test_results_on_dev_full(capsys) -> None:
    code, _, err = run_train_cli([*TRAIN, "--results", "/dev/full"], capsys)
    assert_one_line(
        code, err, "distmb.train", f"cannot write results /dev/full: {NO_SPACE}",
        EXIT_OUTPUT_FAILED,
    )  # fmt: skip


def test_results_short_write_leaves_no_half_record(tmp_path: Path, capsys, monkeypatch) -> None:
    """The disk fills in the middle of a record: half of it is written, then ENOSPC; the
    file is cut back to its previous bytes."""
    results = tmp_path / "results.jsonl"
    results.write_bytes(b'{"epoch": 0, "loss": 1.0}\n')
    real_write = os.write

    def write(fd: int, data) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}") != str(results):
            return real_write(fd, data)
        if len(data) > 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, NO_SPACE)

    monkeypatch.setattr(os, "write", write)
    code, _, err = run_train_cli([*TRAIN, "--results", str(results)], capsys)
    monkeypatch.undo()
    assert_one_line(
        code, err, "distmb.train", f"cannot write results {results}: {NO_SPACE}",
        EXIT_OUTPUT_FAILED,
    )  # fmt: skip
    assert results.read_bytes() == b'{"epoch": 0, "loss": 1.0}\n'


@pytest.mark.parametrize("name", ["checkpoint.pt", "best.pt"])
def test_checkpoint_write_fails(tmp_path: Path, capsys, monkeypatch, name: str) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / name).write_bytes(PREVIOUS)
    fail_replace_onto(monkeypatch, lambda dst: dst == ckpt / name)
    argv = [*TRAIN, "--checkpoint-dir", str(ckpt), "--overwrite-checkpoint"]
    code, _, err = run_train_cli(argv, capsys)
    monkeypatch.undo()
    assert_one_line(
        code, err, "distmb.train", f"cannot write checkpoint {ckpt / name}: {NO_SPACE}",
        EXIT_OUTPUT_FAILED,
    )  # fmt: skip
    assert (ckpt / name).read_bytes() == PREVIOUS and not temporaries(ckpt)


def test_checkpoint_on_dev_full_through_torch_save(tmp_path: Path, capsys) -> None:
    """torch.save's own failure (a RuntimeError about the zip container) is reported as the
    write's ENOSPC: the checkpoint's temporary file is made a link to /dev/full."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "checkpoint.pt").write_bytes(PREVIOUS)
    temporary_path(ckpt / "checkpoint.pt").symlink_to("/dev/full")
    argv = [*TRAIN, "--checkpoint-dir", str(ckpt), "--overwrite-checkpoint"]
    code, _, err = run_train_cli(argv, capsys)
    assert_one_line(
        code, err, "distmb.train",
        f"cannot write checkpoint {ckpt / 'checkpoint.pt'}: {NO_SPACE}", EXIT_OUTPUT_FAILED,
    )  # fmt: skip
    assert (ckpt / "checkpoint.pt").read_bytes() == PREVIOUS and not temporaries(ckpt)


@pytest.mark.parametrize("flag", ["--results", "--checkpoint-dir"])
def test_train_outputs_on_a_full_filesystem(tiny_fs: Path, capsys, flag: str) -> None:
    previous = PREVIOUS
    if flag == "--results":
        target = tiny_fs / "results.jsonl"
        # One whole page (tmpfs allocates pages): the next record needs a new one.
        head = b'{"epoch": 0, "loss": 1.0, "pad": "'
        previous = head + b"x" * (4096 - len(head) - 3) + b'"}\n'
        target.write_bytes(previous)
        argv = ["--results", str(target)]
    else:
        (tiny_fs / "ckpt").mkdir()
        # The directory's lock record is rewritten in place (a page of its own, freed first).
        (tiny_fs / "ckpt" / LOCK_FILE).write_bytes(b" " * 4096)
        target = tiny_fs / "ckpt" / "best.pt"  # written first: the best epoch so far
        target.write_bytes(PREVIOUS)
        argv = ["--checkpoint-dir", str(tiny_fs / "ckpt"), "--overwrite-checkpoint"]
    fill(tiny_fs)
    code, _, err = run_train_cli([*TRAIN, *argv], capsys)
    what = "results" if flag == "--results" else "checkpoint"
    assert_one_line(
        code, err, "distmb.train", f"cannot write {what} {target}: {NO_SPACE}",
        EXIT_OUTPUT_FAILED,
    )  # fmt: skip
    assert target.read_bytes() == previous and not temporaries(tiny_fs)


# -- distmb-partition --out -----------------------------------------------------------------
def test_partition_publish_fails(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "parts"
    code, _, err = run_cli(partition_main, [*PARTITION, "--out", str(out)], capsys)
    assert code == 0, err
    before = tree_digest(out)
    fail_replace_onto(monkeypatch, lambda dst: dst == out)
    argv = [*PARTITION, "--out", str(out), "--overwrite", "--seed", "1"]
    code, _, err = run_cli(partition_main, argv, capsys)
    monkeypatch.undo()
    assert_one_line(
        code, err, "distmb-partition", f"cannot write partition {out}: {NO_SPACE}",
        EXIT_OUTPUT_FAILED,
    )  # fmt: skip
    assert tree_digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts"]  # no temporary directory


def test_partition_spill_into_a_full_tmpdir(tmp_path: Path, monkeypatch) -> None:
    """The partitioner's spilled arrays (graphs over 64 MiB) go to TMPDIR: a full one is
    the same one line. The spill file is made /dev/full (every write fails with ENOSPC)."""
    from distmb.partition import spill

    name = tmp_path / "distmb-spill-features-x"
    name.write_bytes(b"")
    full = os.open("/dev/full", os.O_WRONLY)
    monkeypatch.setattr(spill.tempfile, "mkstemp", lambda **kwargs: (full, str(name)))
    with pytest.raises(OutputError) as exc:
        spill._write_unlinked(np.zeros(1000, dtype=np.float32), tmp_path, "features")
    assert str(exc.value) == f"cannot write spilled features into {tmp_path}: {NO_SPACE}"
    assert not name.exists()


def test_partition_on_a_full_filesystem(tiny_fs: Path, capsys) -> None:
    out = tiny_fs / "parts"
    code, _, err = run_cli(partition_main, [*PARTITION, "--out", str(out)], capsys)
    assert code == 0, err
    before = tree_digest(out)
    fill(tiny_fs)
    argv = [*PARTITION, "--out", str(out), "--overwrite", "--seed", "1"]
    code, _, err = run_cli(partition_main, argv, capsys)
    assert_one_line(
        code, err, "distmb-partition", f"cannot write partition {out}: {NO_SPACE}",
        EXIT_OUTPUT_FAILED,
    )  # fmt: skip
    assert tree_digest(out) == before
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["filler", "parts"]


# -- distmb-predict --out -------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of one epoch on :data:`TINY`."""
    from distmb.cli.train import main as train_main

    ckpt = tmp_path_factory.mktemp("ckpt")
    assert train_main([*TRAIN, "--checkpoint-dir", str(ckpt)]) == 0
    return ckpt / "checkpoint.pt"


def test_predict_output_fails(tmp_path: Path, capsys, monkeypatch, checkpoint: Path) -> None:
    out = tmp_path / "pred"
    argv = ["--checkpoint", str(checkpoint), "--out", str(out), "--threads", "1"]
    code, _, err = run_cli(predict_main, argv, capsys)
    assert code == 0, err
    previous = (out / "logits.npy").read_bytes()
    fail_replace_onto(monkeypatch, lambda dst: dst == out / "logits.npy")
    code, _, err = run_cli(predict_main, [*argv, "--overwrite"], capsys)
    monkeypatch.undo()
    assert_one_line(
        code, err, "distmb.predict",
        f"cannot write prediction {out / 'logits.npy'}: {NO_SPACE}", EXIT_OUTPUT_FAILED,
    )  # fmt: skip
    assert (out / "logits.npy").read_bytes() == previous and not temporaries(out)


def test_predict_on_a_full_filesystem(tiny_fs: Path, capsys, checkpoint: Path) -> None:
    """The gathered outputs are memory maps: space is allocated before the first store, so a
    full disk is this one line, not a SIGBUS."""
    out = tiny_fs / "pred"
    argv = ["--checkpoint", str(checkpoint), "--out", str(out), "--threads", "1"]
    fill(tiny_fs)
    code, _, err = run_cli(predict_main, argv, capsys)
    assert code == EXIT_OUTPUT_FAILED, err
    (line,) = error_lines(err)
    assert line.startswith(f"distmb.predict: error: cannot write prediction {out}/")
    assert line.endswith(NO_SPACE) and "Traceback" not in err
    assert not temporaries(out)


# -- distmb-report ----------------------------------------------------------------------------
def test_report_plot_write_fails(tmp_path: Path, capsys, monkeypatch) -> None:
    results = tmp_path / "r.jsonl"
    results.write_text('{"epoch": 0, "loss": 1.0, "train_acc": 0.5, "val_acc": 0.5}\n')
    png = tmp_path / "r.jsonl.png"
    png.write_bytes(PREVIOUS)
    fail_replace_onto(monkeypatch, lambda dst: dst == png)
    code, _, err = run_cli(report_main, [str(results)], capsys)
    monkeypatch.undo()
    assert_one_line(
        code, err, "distmb.report", f"cannot write plot {png}: {NO_SPACE}",
        EXIT_OUTPUT_FAILED,
    )  # fmt: skip
    assert png.read_bytes() == PREVIOUS and not temporaries(tmp_path)


EXPECTED = "expected a --results file of python -m distmb.train: one JSON object per line"


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        ("checkpoint", "not a text file"),
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a text file"),
        (b"[1, 2]\n", "1: a JSON list, not an object"),
        (b'{"epoch": 0, "loss": 1}\n"text"\n', "2: a JSON str, not an object"),
        (b"{}\n", "no per-epoch records (is it a --results file?)"),
    ],
)
def test_report_on_a_file_that_is_not_jsonl(tmp_path: Path, capsys, contents, message) -> None:
    path = tmp_path / "input"
    if contents == "checkpoint":
        torch.save({"model": {"w": torch.ones(3)}}, path)
    else:
        path.write_bytes(contents)
    code, _, err = run_cli(report_main, [str(path)], capsys)
    assert code == EXIT_BAD_INPUT and "Traceback" not in err, err
    (line,) = error_lines(err)
    sep = ":" if message[0].isdigit() else ": "
    assert line.startswith(f"distmb.report: error: {path}{sep}{message}"), line
    if "record" not in message:
        assert line.endswith(f"({EXPECTED})"), line


def test_report_refuses_a_device(capsys) -> None:
    code, _, err = run_cli(report_main, ["/dev/null"], capsys)
    assert_one_line(
        code, err, "distmb.report", f"/dev/null: not a regular file ({EXPECTED})",
        EXIT_BAD_INPUT,
    )  # fmt: skip


# -- distmb-partition: flags checked before any data --------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--train-tolerance", "5"], "--train-tolerance must be in [0, 1), got 5.0"),
        (["--train-tolerance", "nan"], "--train-tolerance must be in [0, 1), got nan"),
        (["--vertex-tolerance", "-0.1"], "--vertex-tolerance must be in [0, 1), got -0.1"),
        (["--memory-budget", "0"], "--memory-budget must be a finite number > 0 (GiB), got 0.0"),
        (["--memory-budget", "inf"], "--memory-budget must be a finite number > 0 (GiB), got inf"),
        (["--seed", "-1"], "--seed must be in [0, 9223372036854775807], got -1"),
        (["--split-seed", "-2"], "--split-seed must be in [0, 9223372036854775807], got -2"),
        (["--assignment", "{missing}"], "--assignment {missing}: no such file"),
        (["--assignment", "{floats}"], "--assignment {floats}: expected a one-dimensional"),
        (["--assignment", "{part9}"], "--assignment {part9}: vertex 0 is in part 9, outside"),
        (["--dataset", ""], "--dataset must not be empty"),
        (["--out", ""], "--out must not be empty"),
        (["--assignment", ""], "--assignment must not be empty"),
    ],
)
def test_partition_flags_are_checked_before_loading(
    tmp_path: Path, capsys, monkeypatch, argv: list[str], message: str
) -> None:
    files = {"missing": tmp_path / "missing.npy", "floats": tmp_path / "floats.npy"}
    files["part9"] = tmp_path / "part9.npy"
    np.save(files["floats"], np.zeros(300))
    np.save(files["part9"], np.full(300, 9, dtype=np.int32))
    argv = [a.format(**files) for a in argv]
    message = message.format(**files)

    def load_dataset(*args, **kwargs):
        raise AssertionError("the dataset was loaded before the flags were checked")

    monkeypatch.setattr("distmb.data.load_dataset", load_dataset)
    base = ["--dataset", TINY, "--parts", "2", "--out", str(tmp_path / "p"), "--quiet"]
    code, _, err = run_cli(partition_main, [*base, *argv], capsys)
    assert code == EXIT_BAD_INPUT and "Traceback" not in err, err
    (line,) = error_lines(err)
    assert line.startswith(f"distmb-partition: error: {message}"), line
    assert not (tmp_path / "p").exists()


# -- usage errors under mpiexec: printed once ---------------------------------------------
@pytest.mark.parametrize(
    ("ranks", "argv", "expected"),
    [
        (2, ["-m", "distmb.train", "--lr", "inf"], "--lr must be a finite number, got inf"),
        (2, ["-m", "distmb.train", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (
            2,
            ["-m", "distmb.partition", "--parts", "2", "--out", "p", "--memory-budget", "-1"],
            "--memory-budget must be a finite number > 0 (GiB), got -1.0",
        ),
    ],
)
def test_usage_error_under_mpiexec_is_printed_once(
    tmp_path: Path, ranks: int, argv: list[str], expected: str
) -> None:
    proc = mpirun(ranks, argv, timeout=120)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-2000:]
    assert proc.stderr.count(expected) == 1, proc.stderr[-2000:]
    assert "[rank" not in proc.stderr and "Abort" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("usage:") == (1 if "unrecognized" in expected else 0)
