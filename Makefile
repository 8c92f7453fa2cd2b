# falcon: the two set-up commands (each creates .venv if missing).
#   make demo   install everything, then run the shapes-world demo on CPU
#   make test   install everything, then run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Install torch from the package registry: never from a local wheel folder (a +cpu torch
# there cannot load the registry's torchvision, and timm/open_clip then fail to import).
export PIP_FIND_LINKS :=
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

demo: install
	$(BIN)/falcon run --recipe shapes-demo --run-dir runs/shapes-demo --overwrite

test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) runs/shapes-demo .pytest_cache
