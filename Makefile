# Entry points. `make test` is what CI runs (through .ci/run).
PYTHON ?= python
BASE_IMAGE ?= stackforge/base:bookworm

.PHONY: engine base test

# dockerd + buildx (+ docker-registry, debootstrap); a fast no-op when already up
engine:
	bash scripts/engine-setup.sh

# the local stand-in base image (built once, then reused)
base: engine
	bash scripts/base-image.sh $(BASE_IMAGE)

test:
	$(PYTHON) -m pytest -q
