"""What a reader with only the repository sees: no unfilled template placeholders, no paths of
the machine a figure was made on, no issue-tracker numbers, and results files whose recorded
commands can be re-run from a clone."""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The prose a reader reads: README, docs, and the results' and benchmarks' READMEs.
PROSE = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "results" / "README.md",
    ROOT / "benchmarks" / "README.md",
]
#: Text files of the repository that name commands or paths (code included).
TEXT_DIRS = ["distmb", "benchmarks", "tests", "slurm", "examples", "docs", "results"]
TEXT_SUFFIXES = {".py", ".md", ".sbatch", ".sh", ".json", ".txt", ".cfg", ".toml", ""}

#: A template name: upper-case words joined by underscores (``PEAK_KAMINPAR``).
TEMPLATE_NAME = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
#: Upper-case names that prose may use outside code spans without the code defining them:
#: the CPU feature flag of the bf16 dot-product instruction (``/proc/cpuinfo`` spells it so).
KNOWN_NAMES = {"AVX512_BF16"}
#: The development machines' checkouts, home folders and pytest's temporary folders.
MACHINE_PATH = re.compile(
    r"(?<![\w.])(/work/main\b|/root/|/home/[a-z]|/Users/[A-Za-z]|/tmp/pytest-)"
)
#: A reference to an issue tracker's entry instead of to what it means.
TRACKER_NUMBER = re.compile(r"\bissues? #?\d+|\btask #?\d+|#\d{2,}\b(?![\w-])", re.IGNORECASE)


def _prose_outside_code(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _code_names() -> str:
    """All of the source code's text, where a documented name must exist."""
    files = [*ROOT.glob("distmb/**/*.py"), *ROOT.glob("csrc/**/*.*"), *ROOT.glob("benchmarks/*.py")]
    return "\n".join(f.read_text(errors="replace") for f in files)


def _text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "setup.cfg"]
    for folder in TEXT_DIRS:
        for f in sorted((ROOT / folder).rglob("*")):
            parts = f.relative_to(ROOT).parts
            if (
                f.is_file()
                and f.suffix in TEXT_SUFFIXES
                and not any(p.startswith(".venv") or p == "__pycache__" for p in parts)
            ):
                files.append(f)
    return files


def test_no_unfilled_placeholders_in_the_prose():
    code = _code_names()
    found = [
        f"{f.relative_to(ROOT)}: {name}"
        for f in PROSE
        for name in sorted(set(TEMPLATE_NAME.findall(_prose_outside_code(f.read_text()))))
        if name not in KNOWN_NAMES and name not in code
    ]
    assert not found, (
        "upper-case names that nothing defines (unfilled placeholders?):\n" + "\n".join(found)
    )


def test_no_paths_of_the_development_machine():
    this = Path(__file__).resolve()
    found = []
    for f in _text_files():
        if f.resolve() == this:
            continue  # it names the patterns it looks for
        for number, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{f.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "absolute paths of a development machine:\n" + "\n".join(found)


def test_no_issue_tracker_numbers():
    this = Path(__file__).resolve()
    found = []
    for f in [ROOT / "README.md", *_text_files()]:
        if f.resolve() == this or f.suffix == ".json":
            continue
        for number, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if TRACKER_NUMBER.search(line):
                found.append(f"{f.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "tracker numbers tell a reader nothing; say what is meant:\n" + "\n".join(
        found
    )


def test_results_record_commands_relative_to_the_repository():
    """Every ``command`` a results file records runs from a clone: ``python benchmarks/...``,
    no interpreter or checkout of the machine it ran on."""
    commands = {}
    for path in sorted((ROOT / "results").glob("*.json")):
        record = json.loads(path.read_text())
        if isinstance(record, dict) and isinstance(record.get("command"), str):
            commands[path.name] = record["command"]
    assert commands, "no results file records its command"
    bad = {
        name: command
        for name, command in commands.items()
        if MACHINE_PATH.search(command) or re.search(r"(?<![\w.])/\S*(python|\.venv)", command)
    }
    assert not bad, bad


def test_the_checks_catch_what_they_look_for():
    """The patterns above fire on the cases they exist for (so the tests can fail)."""
    assert TEMPLATE_NAME.findall(_prose_outside_code("peak: PEAK_KAMINPAR, `DEFAULT_X`")) == [
        "PEAK_KAMINPAR"
    ]
    assert MACHINE_PATH.search("--old-so /work/main/distmb/_C.so")
    assert MACHINE_PATH.search("cd /root/.venv")
    assert not MACHINE_PATH.search("see ../main/x and ./work/main")
    assert TRACKER_NUMBER.search("the GPU path (issue 12; docs/cuda.md)")
    assert TRACKER_NUMBER.search("# Scaling model (Issue 14, part 5)")
    assert not TRACKER_NUMBER.search("--early-stop 50 evaluations; 12 issues of the format")


def _percent(value: float, digits: int = 1) -> str:
    """``value`` (a fraction) as the README writes it: a percentage rounded half up to
    ``digits`` decimals (a median of two runs, 0.8005, is 80.1 %)."""
    exact = Decimal(repr(value)) * 100
    return f"{exact.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)} %"


def test_readme_accuracy_tables_match_the_results_file():
    """The README's accuracy tables quote ``results/accuracy.json``: every number they show
    for a row is the file's, rounded as written (a re-measured file and a stale README, or
    the reverse, fail here)."""
    readme = (ROOT / "README.md").read_text()
    results = json.loads((ROOT / "results" / "accuracy.json").read_text())
    single, multi = results["single"], results["multi"]

    def row(first_cells: str) -> str:
        """The README table row that starts with ``first_cells``."""
        rows = [line for line in readme.splitlines() if line.startswith(first_cells)]
        assert len(rows) == 1, f"README rows starting {first_cells!r}: {rows}"
        return rows[0]

    sage = row("| Cora (public split) | GraphSAGE | ")
    assert f"| {_percent(single['cora_sage']['median'])} (median of seeds 0-2" in sage
    gat = row("| Cora (public split) | GAT | ")
    assert f"| {_percent(single['cora_gat']['median'])} (same seeds" in gat
    selected = row("| Cora (public split) | GraphSAGE, model selection | ")
    assert f"| {_percent(single['cora_sage_selected']['median'], 2)} at the best" in selected
    synthetic = row("| synthetic (default) | GraphSAGE | ")
    default = single["synthetic_default"]
    assert f"| {_percent(default['test_acc_epoch40'])} on one rank" in synthetic
    assert f"({_percent(default['test_acc_epoch10'])} after 10 epochs" in synthetic
    assert f"first-epoch loss {default['first_epoch_loss']:.2f}" in synthetic

    columns = ["1", "2-hec", "2-no-hec", "4-hec", "4-no-hec"]
    for name, first in [("cora", "| Cora | 30 |"), ("synthetic", "| synthetic (default) | 15 |")]:
        cells = [c.strip() for c in row(first).strip("|").split("|")[2:]]
        assert cells == [_percent(multi[name][c]) for c in columns], (name, cells)
