# Quick start: `make demo` and `make test`. Both create .venv and install megaeval into it first.
PYTHON ?= python3
VENV ?= .venv
# Pinned here, not in pyproject.toml: an unpinned torch pulls several GB of CUDA wheels.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
BIN := $(VENV)/bin

.PHONY: setup test demo lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# pytest exits 5 when it collects nothing: say so, and fail (a silent pass would hide a broken setup).
test: setup
	@$(BIN)/python -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; failing"; fi; exit $$rc

demo: setup
	$(BIN)/megaeval info

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
