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
	$(BIN)/python -m pip install -q -e '.[dev,hf,plot]'
	touch $@

# pytest exits 5 when it collects nothing: say so, and fail (a silent pass would hide a broken setup).
test: setup
	@$(BIN)/pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; failing"; fi; exit $$rc

# The embedded tiny MEGALODON, offline: a perplexity sweep on the held-out Austen novel (table + plot),
# then the bundled SCROLLS (QMSum) and academic samples. Interrupted? Run it again: every step resumes.
DEMO_STREAM := runs/demo/persuasion
SAMPLES := data_prep/samples
demo: setup
	$(BIN)/megaeval info
	$(BIN)/megaeval prep-books data_prep/corpora/austen/persuasion.txt --out $(DEMO_STREAM) --force
	$(BIN)/megaeval ppl-sweep --stream $(DEMO_STREAM) --lengths 256,512,1K,2K,4K,8K,16K --batch-size 8 \
		--out reports/demo.json --resume
	$(BIN)/megaeval plot reports/demo.json --out reports/demo_ppl.png --position-curve
	$(BIN)/megaeval scrolls --tasks qmsum --data-dir $(SAMPLES)/scrolls --limit 2 --max-new-tokens 64 \
		--out reports/demo_scrolls.json --samples reports/demo_scrolls.jsonl --resume
	@echo "note: the tiny model (1.4M parameters, five Austen novels) cannot summarise meetings, so its QMSum ROUGE is"
	@echo "      about 0: this step shows the SCROLLS pipeline end to end. Its perplexity above is the number that moves."
	$(BIN)/megaeval academic --data-dir $(SAMPLES) --limit 10 \
		--out reports/demo_academic.json --samples reports/demo_academic.jsonl --resume

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info

# A fresh clone under a long path runs the quick start's `make test` there, so that path-dependent failures show
# up: code that assumes this checkout's location, its .venv or files git does not track, or short paths (a long
# venv path, for one, makes console-script shebangs exceed the kernel's limit). The clone builds its own .venv
# (pip's cache keeps that quick) and is deleted afterwards, pass or fail. It sees committed work only.
CHECK_FRESH_NAME := a-deliberately-long-folder-name-so-that-code-which-assumes-short-paths-or-this-checkouts-location-fails-here-in-a-fresh-clone-with-its-own-virtualenv
.PHONY: check-fresh
check-fresh:
	@tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/megaeval-check-fresh.XXXXXX") || exit 1; \
	trap 'rm -rf "$$tmp"' EXIT; trap 'exit 1' HUP INT PIPE TERM; \
	dir="$$tmp/$(CHECK_FRESH_NAME)/megaeval"; \
	echo "check-fresh: cloning into $$dir (a path of $${#dir} characters)"; \
	git clone --quiet "$(CURDIR)" "$$dir" && \
	$(MAKE) --no-print-directory -C "$$dir" test VENV=.venv PYTHON="$(PYTHON)" TORCH="$(TORCH)" PYTEST_ARGS="$(PYTEST_ARGS)"
