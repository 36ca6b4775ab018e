"""The package layers of distmb, checked from the source.

Every ``import`` and ``from ... import`` statement in ``distmb/**/*.py`` is read with :mod:`ast`
(those inside functions and under ``if TYPE_CHECKING:`` count too; relative imports are
resolved), each module is mapped to its package (the first folder under ``distmb/``), and four
rules are checked:

* a module imports only its own package or packages below it in :data:`LAYERS` (``partition``
  and ``pipeline`` are independent: neither imports the other; the extension ``distmb._C`` is
  importable by all; the entry points may import anything);
* no two files import each other, directly or through others (no strongly connected component of
  the file-level import graph has more than one file);
* no file is longer than :data:`MAX_LINES` lines;
* every imported distmb module exists (a path left stale by a move fails here, not at run time).

The ``test_checker_*`` tests run the checker on a small synthetic package that breaks each rule.

``docs/design.md`` opens with the map of the packages these rules enforce.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "distmb"

#: The packages, lowest first: a module may import its own package and those before it.
LAYERS: tuple[str, ...] = (
    "core", "comm", "data", "partition", "pipeline", "nn", "halo", "config", "engine", "cli",
)  # fmt: skip
#: Pairs of packages that must not import each other although one is listed below the other.
INDEPENDENT: frozenset[frozenset[str]] = frozenset({frozenset({"partition", "pipeline"})})
#: Top-level modules that only start things; they may import any package.
ENTRY_MODULES: frozenset[str] = frozenset(
    {"distmb", "distmb.train", "distmb.predict", "distmb.report"}
)
#: The compiled extension: importable from every package.
EXTENSION = "distmb._C"
MAX_LINES = 600


@dataclass(frozen=True)
class Import:
    """One resolved import of a distmb module by another.

    Attributes:
        importer: the importing module's dotted name, e.g. ``distmb.data.graph``.
        target: the imported module's dotted name (a source file's, :data:`EXTENSION`, or a
            name that no file has: see :func:`missing_modules`).
        path: the importer's file, relative to the repository root.
        line: the 1-based line of the statement.
        statement: the statement's source text.
    """

    importer: str
    target: str
    path: str
    line: int
    statement: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.statement}"


def module_name(path: str) -> str:
    """The dotted module name of a source file path such as ``distmb/data/__init__.py``."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str | None:
    """The layer package of a module (``core`` ... ``cli``), or None for an entry point.

    Entry points are ``distmb/__init__.py``, the top-level shims (``distmb.train`` ...) and every
    ``__main__`` module.
    """
    parts = module.split(".")
    if module in ENTRY_MODULES or parts[-1] == "__main__" or len(parts) < 2:
        return None
    return parts[1]


def resolve_imports(sources: dict[str, str]) -> list[Import]:
    """All imports of distmb modules made by the given source files.

    Args:
        sources: file path relative to the repository root (``distmb/...py``) -> source text.

    Returns:
        One :class:`Import` per imported distmb module per statement, in file order.
    """
    modules = {module_name(path) for path in sources}
    packages = {module_name(path) for path in sources if path.endswith("/__init__.py")}

    def module_of(base: str, name: str) -> str:
        """What ``from base import name`` imports: the submodule ``base.name`` if there is
        one, else ``base`` itself (``name`` is then one of its attributes)."""
        full = f"{base}.{name}"
        return full if full in modules or full == EXTENSION else base

    found: list[Import] = []
    for path, text in sources.items():
        importer = module_name(path)
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text, filename=path)):
            if isinstance(node, ast.Import):
                targets = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    # A package's own __init__ is its anchor; a plain module's is its parent.
                    anchor = importer.split(".")
                    if importer not in packages:
                        anchor.pop()
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = {module_of(base, alias.name) for alias in node.names}
            else:
                continue
            statement = " ".join(line.strip() for line in lines[node.lineno - 1 : node.end_lineno])
            for target in sorted(t for t in targets if t.split(".")[0] == "distmb"):
                if target == importer:
                    continue
                found.append(Import(importer, target, path, node.lineno, statement))
    return sorted(found, key=lambda imp: (imp.path, imp.line, imp.target))


def missing_modules(imports: list[Import], sources: dict[str, str]) -> list[str]:
    """The imports of a distmb module that no source file defines (a stale path)."""
    modules = {module_name(path) for path in sources}
    return [
        f"{imp}  [no module {imp.target}]"
        for imp in imports
        if imp.target not in modules and imp.target != EXTENSION
    ]


def layer_violations(imports: list[Import]) -> list[str]:
    """The imports of a package above the importer's (or of an independent sibling)."""
    rank = {name: index for index, name in enumerate(LAYERS)}
    bad: list[str] = []
    for imp in imports:
        source = package_of(imp.importer)
        if source is None or imp.target == EXTENSION:
            continue
        target = package_of(imp.target)
        if target == source:
            continue
        if target is None:
            bad.append(f"{imp}  [{source} imports the entry point {imp.target}]")
        elif target not in rank:
            bad.append(f"{imp}  [{target} is not a declared layer]")
        elif rank[target] > rank[source]:
            bad.append(f"{imp}  [{source} imports {target}, above it]")
        elif frozenset({source, target}) in INDEPENDENT:
            bad.append(f"{imp}  [{source} and {target} are independent]")
    return bad


def import_cycles(imports: list[Import]) -> list[list[Import]]:
    """The file-level import cycles: per strongly connected component of more than one module,
    the imports between its modules (Tarjan's algorithm, iterative)."""
    graph: dict[str, list[str]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, []).append(imp.target)
        graph.setdefault(imp.target, [])
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = lowlink[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = lowlink[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(graph[step])))
                elif step in on_stack:
                    lowlink[node] = min(lowlink[node], index[step])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                lowlink[parent] = min(lowlink[parent], lowlink[node])
            if lowlink[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [
        [imp for imp in imports if imp.importer in comp and imp.target in comp]
        for comp in sorted(components, key=sorted)
    ]


def long_files(sources: dict[str, str], limit: int = MAX_LINES) -> list[str]:
    """The files longer than ``limit`` lines, as ``path: N lines``."""
    return [
        f"{path}: {len(text.splitlines())} lines"
        for path, text in sorted(sources.items())
        if len(text.splitlines()) > limit
    ]


@functools.cache
def read_package() -> dict[str, str]:
    """Every ``distmb/**/*.py`` file: path relative to the repository root -> source text."""
    repo = PACKAGE_ROOT.parent
    return {
        path.relative_to(repo).as_posix(): path.read_text()
        for path in sorted(PACKAGE_ROOT.rglob("*.py"))
    }


def test_imports_go_down_the_layers():
    bad = layer_violations(resolve_imports(read_package()))
    if bad:
        pytest.fail("imports against the layer order:\n" + "\n".join(bad), pytrace=False)


def test_imports_name_existing_modules():
    sources = read_package()
    bad = missing_modules(resolve_imports(sources), sources)
    if bad:
        pytest.fail("imports of modules that do not exist:\n" + "\n".join(bad), pytrace=False)


def test_no_import_cycles_between_files():
    cycles = import_cycles(resolve_imports(read_package()))
    if cycles:
        report = "\n\n".join("\n".join(str(imp) for imp in cycle) for cycle in cycles)
        pytest.fail(f"{len(cycles)} import cycle(s) between files:\n{report}", pytrace=False)


def test_no_file_is_too_long():
    bad = long_files(read_package())
    if bad:
        pytest.fail(f"files over {MAX_LINES} lines:\n" + "\n".join(bad), pytrace=False)


def test_the_package_is_read():
    # Guards the checks above against passing on an empty or mis-rooted walk.
    sources = read_package()
    assert "distmb/core/errors.py" in sources
    assert any(imp.importer.startswith("distmb.engine") for imp in resolve_imports(sources))


SYNTHETIC = {
    "distmb/__init__.py": "from distmb.cli import main\n",
    "distmb/core/__init__.py": "",
    "distmb/core/util.py": "import os\n",
    "distmb/core/bad.py": "def later():\n    from distmb.data import graph\n",
    "distmb/data/__init__.py": "from .graph import Graph\n",
    "distmb/data/graph.py": (
        "from typing import TYPE_CHECKING\n"
        "from ..core.util import os\n"
        "from distmb import _C\n"
        "if TYPE_CHECKING:\n"
        "    from distmb.data.csr import Csr\n"
        "Graph = 1\n"
    ),
    "distmb/data/csr.py": "from . import graph\nCsr = 1\n",
    "distmb/partition/__init__.py": "",
    "distmb/partition/run.py": "import distmb.pipeline.loader\n",
    "distmb/pipeline/__init__.py": "",
    "distmb/pipeline/loader.py": "from distmb.data.graph import Graph\n",
    "distmb/cli/__init__.py": "from distmb.partition.run import x\nmain = 1\n",
    "distmb/cli/__main__.py": "import distmb\n",
}


def test_checker_resolves_relative_and_lazy_imports():
    pairs = {(imp.importer, imp.target) for imp in resolve_imports(SYNTHETIC)}
    assert ("distmb.data", "distmb.data.graph") in pairs
    assert ("distmb.data.graph", "distmb.core.util") in pairs
    assert ("distmb.data.graph", "distmb.data.csr") in pairs  # under TYPE_CHECKING
    assert ("distmb.data.csr", "distmb.data.graph") in pairs
    assert ("distmb.core.bad", "distmb.data.graph") in pairs  # inside a function
    assert ("distmb.data.graph", "distmb._C") in pairs


def test_checker_catches_upward_imports():
    bad = layer_violations(resolve_imports(SYNTHETIC))
    assert len(bad) == 2, bad
    assert bad[0].startswith("distmb/core/bad.py:2: from distmb.data import graph")
    assert "[core imports data, above it]" in bad[0]
    assert bad[1].startswith("distmb/partition/run.py:1:")
    assert "[partition imports pipeline, above it]" in bad[1]
    # The reverse direction is caught too although pipeline is listed above partition.
    reverse = dict(SYNTHETIC, **{"distmb/pipeline/loader.py": "from distmb.partition import run\n"})
    assert any("independent" in line for line in layer_violations(resolve_imports(reverse)))


def test_checker_catches_a_missing_module():
    assert missing_modules(resolve_imports(SYNTHETIC), SYNTHETIC) == []
    stale = dict(SYNTHETIC, **{"distmb/pipeline/loader.py": "from distmb.data.gone import x\n"})
    assert missing_modules(resolve_imports(stale), stale) == [
        "distmb/pipeline/loader.py:1: from distmb.data.gone import x  [no module distmb.data.gone]"
    ]


def test_checker_catches_a_cycle():
    cycles = import_cycles(resolve_imports(SYNTHETIC))
    assert [sorted(str(imp) for imp in cycle) for cycle in cycles] == [
        [
            "distmb/data/csr.py:1: from . import graph",
            "distmb/data/graph.py:5: from distmb.data.csr import Csr",
        ]
    ]


def test_checker_catches_a_long_file():
    assert long_files({"distmb/core/a.py": "x = 1\n" * 3, "distmb/core/b.py": "x\n"}, limit=2) == [
        "distmb/core/a.py: 3 lines"
    ]
