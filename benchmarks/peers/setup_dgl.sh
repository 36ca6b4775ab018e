#!/usr/bin/env bash
# Build the DGL peer's virtual environment for benchmarks/peers/dgl_vs_distmb.py:
# DGL's newest installable Linux CPU release (requirements-dgl.txt says which and why) in its
# own venv, never in distmb's. Idempotent: re-running installs only what is missing, then
# checks that DGL imports and trains one GraphSAGE step on a sampled block.
#
#   benchmarks/peers/setup_dgl.sh                 # -> benchmarks/peers/.venv-dgl
#   PYTHON=python3.12 VENV=/tmp/dgl benchmarks/peers/setup_dgl.sh
#
# Needs 5.2 GiB of disk (torch's CUDA wheel and its nvidia-* libraries) and PyPI; about
# 5 minutes on the development machine.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-$HERE/.venv-dgl}"
PYTHON="${PYTHON:-python3}"
REQUIREMENTS="$HERE/requirements-dgl.txt"

if ! command -v "$PYTHON" >/dev/null; then
    echo "setup_dgl.sh: $PYTHON not found; set PYTHON to a CPython 3.11 or 3.12 interpreter" >&2
    exit 2
fi
# dgl 2.1.0, torch 2.2.1 and scipy 1.17.1 all have wheels for CPython 3.11 and 3.12.
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] in ((3, 11), (3, 12)) else 1)'; then
    echo "setup_dgl.sh: $PYTHON is $("$PYTHON" -V 2>&1); expected CPython 3.11 or 3.12" \
        "(the pinned wheels exist for those); set PYTHON" >&2
    exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup_dgl.sh: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet -r "$REQUIREMENTS"

# Smoke check: imports (graphbolt included: dgl imports it and it needs the matching torch),
# one sampled block, one SAGEConv forward and backward on the CPU.
"$VENV/bin/python" - <<'PY'
import dgl
import dgl.graphbolt  # noqa: F401  (fails on a torch without a matching graphbolt library)
import torch
from dgl.nn import SAGEConv

g = dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])))
sampler = dgl.dataloading.NeighborSampler([2])
_, _, blocks = sampler.sample_blocks(g, torch.tensor([0, 1]))
conv = SAGEConv(4, 3, "mean")
x = torch.randn(blocks[0].num_src_nodes(), 4)
conv(blocks[0], x).sum().backward()
print(f"setup_dgl.sh: ok: dgl {dgl.__version__}, torch {torch.__version__} (CPU)")
PY
"$VENV/bin/python" -m pip freeze > "$VENV/freeze.txt"
echo "setup_dgl.sh: $VENV ready (installed versions in $VENV/freeze.txt)"
