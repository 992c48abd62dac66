# stackforge entry points.
#   make demo                     set up the engine, build the example stack, run its image
#   make image STACK=post2        build, gate and tag one stack (TARGET=… for another target)
#   make test                     the test suite (what CI runs through .ci/run)
PYTHON ?= python3
BASE_IMAGE ?= stackforge/base:bookworm
STACK ?= post2
TARGET ?=
# Extra arguments for `stackforge build`, e.g. ARGS='--set base.image=… --network host'
ARGS ?=

STACKFORGE = $(PYTHON) -m stackforge

.PHONY: help install engine base image render lint demo test bench bake nightly

help:
	@sed -n '2,5p' Makefile

# the stackforge package and its test tools (editable)
install:
	$(PYTHON) -m pip install -q -e '.[test]'

# dockerd + buildx (+ docker-registry, debootstrap); a fast no-op when already up
engine:
	bash scripts/engine-setup.sh

# the local base image (Debian bookworm + python); the example stack and the tests start from it
base: engine
	bash scripts/base-image.sh $(BASE_IMAGE)

# (not echoed: ARGS may carry --set values with index credentials)
image: install engine
	@$(STACKFORGE) build $(STACK) $(if $(TARGET),--target $(TARGET)) $(ARGS)

render: install
	$(STACKFORGE) render $(STACK) $(if $(TARGET),--target $(TARGET)) $(ARGS)

lint: install
	$(STACKFORGE) lint
	$(STACKFORGE) audit post2
	$(STACKFORGE) patches lint
	$(STACKFORGE) patches export --check

demo: install base
	$(STACKFORGE) build example $(ARGS)
	@echo '--- running the example image: it HTML-escapes its input with the compiled speedups'
	printf '<stackforge> & "friends"\n' | docker run --rm -i $$($(STACKFORGE) tags example)
	@echo

test: install
	$(PYTHON) -m pytest -q

bench: install base
	$(PYTHON) bench/build_bench.py

# Nightly: lint every stack with `nightly: true` (or STACKS=…), bake them together, gate each,
# publish each that passed, write build/nightly/<date>/summary.{md,json}; fails if any failed.
#   make nightly REGISTRY=registry.example.com/team [DATE=YYYYMMDD] [STACKS='a b'] [ROOT=dir] [ARGS='--builder B']
REGISTRY ?=
DATE ?=
STACKS ?=
ROOT ?=
nightly: install engine
	$(if $(REGISTRY),,$(error REGISTRY is required, e.g. make nightly REGISTRY=127.0.0.1:5000/mcconline/inference))
	@$(STACKFORGE) $(if $(ROOT),--root $(ROOT)) nightly --registry $(REGISTRY) $(if $(DATE),--date $(DATE)) $(STACKS) $(ARGS)

# the bake plan of the nightly stacks (or STACKS=…), printed; `stackforge bake` builds it
bake: install
	$(STACKFORGE) $(if $(ROOT),--root $(ROOT)) bake --print $(STACKS) $(ARGS)
