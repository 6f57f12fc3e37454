# kfp-trainer: `make demo` runs the sample pipeline locally; `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test unit lint compile cluster-build cluster-up cluster-status cluster-down clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[local,dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/kfp-trainer run pipelines/llm_finetune --local

lint: setup
	$(PY) -m ruff check .
	$(VENV)/bin/kfp-trainer compile --check

# Regenerates components/*/component.yaml + README.md and pipelines/*/pipeline.yaml.
compile: setup
	$(VENV)/bin/kfp-trainer compile

# Builds the test control plane (Kubernetes, etcd, KWOK, the Trainer and JobSet controllers)
# from Go modules; cached outside the repo after the first time.
cluster-build:
	bash hack/k8s/build.sh

# A test cluster with the real Trainer and JobSet controllers, left running for kubectl
# (docs/controlplane.md). FEATURE_GATES=TrainJobStatus=true turns on controller feature gates.
cluster-up: setup cluster-build
	$(PY) hack/k8s/cluster.py up $(if $(FEATURE_GATES),--feature-gates $(FEATURE_GATES))

cluster-status: setup
	$(PY) hack/k8s/cluster.py status

cluster-down: setup
	$(PY) hack/k8s/cluster.py down

unit: setup
	$(PY) -m pytest --doctest-modules kfp_trainer tests/unit

test: setup lint cluster-build
	$(PY) -m pytest --doctest-modules kfp_trainer tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
