# Two-command start: `make demo` runs the main job on the built-in dataset, `make test` runs the
# tests. Both create (or reuse) the virtual environment $(VENV) first.
#
# Overridable: PYTHON (interpreter that creates the venv), VENV, TORCH_SPEC (e.g. a cluster's own
# torch build), EXTRAS (drop `mpich` on a cluster that brings its own MPI: EXTRAS=test,kaminpar;
# drop `kaminpar`, the second partitioner, where no wheel exists, e.g. aarch64 Linux; `triton`
# runs the CUDA path's kernel tests on CPU under its interpreter),
# MPIEXEC and DEMO_RANKS (the demo's launcher and rank count), GPU_CHECK_ARGS (`make gpu-check`'s
# flags).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= mpich,test,kaminpar,triton
BIN := $(VENV)/bin
STAMP := $(VENV)/.distmb-installed
DEMO_DIR ?= demo
# The demo's MPI launcher: the venv's (mpich extra) when there is one, else the machine's.
MPIEXEC ?= $(if $(wildcard $(BIN)/mpiexec),$(BIN)/mpiexec,mpiexec)
DEMO_RANKS ?= 2

.PHONY: demo test lint bench-partition gpu-check clean

$(STAMP): setup.cfg setup.py pyproject.toml $(wildcard csrc/*/*.cpp csrc/*/*.h csrc/*/*/*.cpp csrc/*/*/*.h)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" setuptools wheel "pybind11>=2.12"
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[$(EXTRAS)]"
	@touch $@

# The main job: partition the built-in dataset, train on the parts with one rank each (the
# historical embedding cache on, its hit rates printed every epoch), draw the report.
demo: $(STAMP)
	$(BIN)/distmb-partition --dataset synthetic --parts $(DEMO_RANKS) \
		--out $(DEMO_DIR)/synthetic-p$(DEMO_RANKS) --replicate-halo-features --overwrite
	@rm -f $(DEMO_DIR)/train.jsonl
	OMP_WAIT_POLICY=passive $(MPIEXEC) -n $(DEMO_RANKS) $(BIN)/python -m distmb.train \
		--part-dir $(DEMO_DIR)/synthetic-p$(DEMO_RANKS) --threads 1 --no-progress \
		--results $(DEMO_DIR)/train.jsonl
	$(BIN)/python -m distmb.report $(DEMO_DIR)/train.jsonl

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench-partition: $(STAMP)
	$(BIN)/python benchmarks/partition.py

# Check a GPU node (docs/cuda.md, "Checking a GPU node"): build, versions, the cuda tests, the
# GPU benchmark, 2 ranks on one GPU, out-of-core, NCCL at world size 1; logs and a summary in
# one folder. No venv step: a GPU node's image may have no registry to install from, so this
# uses the venv's Python where there is one, else $(PYTHON). GPU_CHECK_ARGS: e.g.
# "--out DIR --quick".
GPU_CHECK_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_CHECK_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf build *.egg-info distmb/_C*.so $(DEMO_DIR)
