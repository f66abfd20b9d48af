# Every target creates the virtual environment it needs; nothing has to be installed by hand.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
ONNXOPT := $(VENV)/bin/onnxopt
TORCH_PIN := torch==2.13.0

.PHONY: install install-torch demo test test-all lint format models zoo-table bench clean

$(VENV)/.stamp-base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $@

$(VENV)/.stamp-torch: $(VENV)/.stamp-base
	$(PIP) install -q '$(TORCH_PIN)'
	$(PIP) install -q -e '.[dev,torch]'
	touch $@

install: $(VENV)/.stamp-base

install-torch: $(VENV)/.stamp-torch

demo: install
	mkdir -p out
	$(ONNXOPT) optimize models/default.onnx -o out/default.opt.onnx

test: install-torch
	$(PY) -m pytest -n 2 -q

test-all: install-torch
	$(PY) -m pytest -n 2 -q -m ''

lint: install
	$(VENV)/bin/ruff check onnxopt tests scripts benchmarks
	$(VENV)/bin/ruff format --check onnxopt tests scripts benchmarks
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format onnxopt tests scripts benchmarks
	$(VENV)/bin/ruff check --fix onnxopt tests scripts benchmarks

# The whole zoo, full size, both exporters, into zoo/ (git-ignored); up-to-date exports are skipped.
models: install-torch
	$(PY) scripts/export_zoo.py

# Nodes before/after `onnxopt optimize` and error vs eager for every export in zoo/ (the README table).
zoo-table: install-torch
	$(PY) scripts/zoo_table.py

clean:
	rm -rf out .pytest_cache .mypy_cache .ruff_cache
