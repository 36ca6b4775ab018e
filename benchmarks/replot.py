"""Re-draw figures of ``results/`` from the JSON beside them, without measuring anything:

    python benchmarks/replot.py                    # every benchmark below
    python benchmarks/replot.py sampling kernels   # some

Each benchmark's own ``plot`` function draws (the one its run calls), so a re-drawn figure is
the figure a new run with the same numbers would give.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"


def _draw(name: str) -> Callable[[Any, dict, Path], None]:
    """How benchmark ``name``'s run calls its plot, given the module, its JSON and the PNG."""
    return {
        "partition": lambda m, d, png: m.plot(d["records"], png),
        "partition_engines": lambda m, d, png: m.plot_engines(d["records"], png),
        "sampling": lambda m, d, png: m.plot(d, png),
        "kernels": lambda m, d, png: m.write_plot(d, png),
        "out_of_core": lambda m, d, png: m.plot(d, png),
        "distributed": lambda m, d, png: m.plot(d, png),
        "scaling": lambda m, d, png: m.plot(d, png),
        "gpu": lambda m, d, png: m.plot(d, png),
    }[name]


BENCHMARKS = (
    "partition",
    "partition_engines",
    "sampling",
    "kernels",
    "out_of_core",
    "distributed",
    "scaling",
    "gpu",
)
#: Results that only some machines make (a GPU): without their JSON, ``replot.py`` with no
#: names skips them.
OPTIONAL = {"gpu"}

#: The script of a result whose name is not its script's (``--methods`` of partition.py).
SCRIPTS = {"partition_engines": "partition"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    p.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON and PNG")
    args = p.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; expected {', '.join(BENCHMARKS)}")
    sys.path.insert(0, str(HERE))
    for name in args.names or BENCHMARKS:
        source = args.results / f"{name}.json"
        if name in OPTIONAL and not args.names and not source.exists():
            print(f"skipped {name}: no {source}")
            continue
        module = importlib.import_module(SCRIPTS.get(name, name))
        out = source.with_suffix(".png")
        _draw(name)(module, json.loads(source.read_text()), out)
        print(f"wrote {out} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
