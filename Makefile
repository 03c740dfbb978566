# snapmesh: `make demo` and `make test` are the whole set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
PROTO_STAMP := snapmesh/v1/.generated
PROTOS := $(shell find protos -name '*.proto')
PYTEST_ARGS ?=

export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON ?= $(abspath $(PY))

.PHONY: install proto test test-fast demo bench lint clean compose-up compose-down

install: $(STAMP) $(PROTO_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

proto: $(STAMP)
	$(PY) -m snapmesh.protogen
	touch $(PROTO_STAMP)

$(PROTO_STAMP): $(STAMP) $(PROTOS)
	$(PY) -m snapmesh.protogen
	touch $@

# Everything, the Docker compose stack included when a Docker engine answers.
test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# The inner loop: no Docker images, no compose stack.
test-fast: install
	$(PY) -m pytest -m 'not docker' $(PYTEST_ARGS)

demo: install
	$(BIN)/snapmesh demo

bench: install
	$(PY) -m bench $(BENCH)

lint: install
	$(PY) -m compileall -q snapmesh services tests bench

clean:
	rm -rf $(VENV) snapmesh/v1 .pytest_cache .hypothesis
