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

.PHONY: help install engine base image render lint demo test bench

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

image: install engine
	$(STACKFORGE) build $(STACK) $(if $(TARGET),--target $(TARGET)) $(ARGS)

render: install
	$(STACKFORGE) render $(STACK) $(if $(TARGET),--target $(TARGET)) $(ARGS)

lint: install
	$(STACKFORGE) lint
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
