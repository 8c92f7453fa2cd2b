# falcon: the two set-up commands (each creates .venv if missing).
#   make demo       install everything, then run the shapes-world demo on CPU
#   make test       install everything, then ruff and every test but the slow tier (at most 10 minutes on 2 cores)
#   make test-all   the same with the slow tier (torchrun jobs, compile, the longest CLI runs): what CI runs
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Install torch from the package registry: never from a local wheel folder (a +cpu torch
# there cannot load the registry's torchvision, and timm/open_clip then fail to import).
export PIP_FIND_LINKS :=
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test test-all lint install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

demo: install
	$(BIN)/falcon run --recipe shapes-demo --run-dir runs/shapes-demo --overwrite

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow"

test-all: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) runs/shapes-demo .pytest_cache
