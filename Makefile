# Two-command start: `make demo` runs the main job on the built-in dataset, `make test` runs the
# tests. Both create (or reuse) the virtual environment $(VENV) first.
#
# Overridable: PYTHON (interpreter that creates the venv), VENV, TORCH_SPEC (e.g. a cluster's own
# torch build), EXTRAS (drop `mpich` on a cluster that brings its own MPI: EXTRAS=test).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= mpich,test
BIN := $(VENV)/bin
STAMP := $(VENV)/.distmb-installed
DEMO_DIR ?= demo

.PHONY: demo test lint bench-partition clean

$(STAMP): setup.cfg setup.py pyproject.toml $(wildcard csrc/*.cpp csrc/*.h)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" setuptools wheel "pybind11>=2.12"
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[$(EXTRAS)]"
	@touch $@

demo: $(STAMP)
	$(BIN)/distmb-partition --dataset synthetic --parts 2 --out $(DEMO_DIR)/synthetic-p2 --overwrite
	@rm -f $(DEMO_DIR)/train.jsonl
	$(BIN)/python -m distmb.train --results $(DEMO_DIR)/train.jsonl
	$(BIN)/python -m distmb.report $(DEMO_DIR)/train.jsonl

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

bench-partition: $(STAMP)
	$(BIN)/python benchmarks/partition.py

clean:
	rm -rf build *.egg-info distmb/_C*.so $(DEMO_DIR)
