# kfp-trainer: `make demo` runs the sample pipeline locally; `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: constraints setup demo test test-cold test-prerequisites unit lint lint-workflows compile images browser debootstrap test-images host-packages cluster-build cluster-up cluster-status cluster-down reliability bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[local,llm,dev]'
	touch $(STAMP)

# constraints.txt anew: pyproject.toml's ranges resolved in a new virtualenv (downloads everything).
constraints:
	rm -rf build/constraints-venv
	$(PYTHON) -m venv build/constraints-venv
	build/constraints-venv/bin/python -m pip install -q --upgrade pip
	build/constraints-venv/bin/python -m pip install -q -e '.[local,llm,dev]'
	{ sed -n '/^#/p' constraints.txt; build/constraints-venv/bin/python -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf build/constraints-venv

setup: $(STAMP)

demo: setup
	$(VENV)/bin/kfp-trainer run pipelines/llm_finetune --local

lint: setup lint-workflows
	$(PY) -m ruff check .
	$(VENV)/bin/kfp-trainer compile --check

# actionlint for .github/workflows, built from the Go module proxy once and cached outside the repo.
ACTIONLINT_VERSION := v1.7.12
ACTIONLINT := $(HOME)/.cache/kfp-trainer/tools/actionlint-$(ACTIONLINT_VERSION)/actionlint
$(ACTIONLINT):
	GOBIN=$(dir $@) go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)

lint-workflows: $(ACTIONLINT)
	$(ACTIONLINT) .github/workflows/*.yml

# Both images under your registry: make images REGISTRY=ghcr.io/me [VERSION=x.y.z] [PUSH=1] [CONTAINER_TOOL=podman]
VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# docker only when its engine answers (a docker client without an engine is common: buildah then builds).
CONTAINER_TOOL ?= $(firstword $(if $(shell docker info >/dev/null 2>&1 && echo ok),docker) $(foreach t,podman buildah,$(if $(shell command -v $(t) 2>/dev/null),$(t))))
ifneq ($(filter images,$(MAKECMDGOALS)),)
ifeq ($(strip $(REGISTRY)),)
$(error make images needs REGISTRY=<registry>/<namespace>, e.g. make images REGISTRY=ghcr.io/me)
endif
ifeq ($(strip $(CONTAINER_TOOL)),)
$(error make images needs docker, podman or buildah (none found); or set CONTAINER_TOOL)
endif
endif
images:
	$(CONTAINER_TOOL) build -f deploy/Dockerfile.component -t $(REGISTRY)/kfp-trainer:$(VERSION) .
	$(CONTAINER_TOOL) build -f deploy/Dockerfile.trainer -t $(REGISTRY)/kfp-trainer-trainer:$(VERSION) .
ifeq ($(PUSH),1)
	$(CONTAINER_TOOL) push $(REGISTRY)/kfp-trainer:$(VERSION)
	$(CONTAINER_TOOL) push $(REGISTRY)/kfp-trainer-trainer:$(VERSION)
endif
	@echo "compile against them: kfp-trainer compile --base-image $(REGISTRY)/kfp-trainer:$(VERSION) --trainer-image $(REGISTRY)/kfp-trainer-trainer:$(VERSION)"

# Headless Chromium, which the local pipeline tests open the HTML reports in (Debian/Ubuntu, as root).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# buildah and debootstrap, which build the images without a registry (Debian/Ubuntu, as root).
debootstrap: host-packages

# Both images built on this machine by buildah from deploy/Dockerfile.*, with a debootstrap base and
# no registry (hack/k8s/images.py; layers cached in ~/.cache/kfp-trainer/images): what the real node's pods run.
test-images: setup debootstrap
	$(PY) hack/k8s/images.py build all
	$(PY) hack/k8s/images.py prune

# Regenerates components/*/component.yaml + README.md and pipelines/*/pipeline.yaml.
compile: setup
	$(VENV)/bin/kfp-trainer compile

# containerd, runc, the CNI plugins and iptables for the test cluster's real node (Debian/Ubuntu, as root).
host-packages:
	@bash hack/k8s/host-packages.sh

# Builds the test control plane (Kubernetes, etcd, KWOK, the Trainer and JobSet controllers, the
# real node's kubelet, CoreDNS and images) from Go modules; cached outside the repo after the first time.
cluster-build: host-packages
	bash hack/k8s/build.sh

# A test cluster with the real Trainer and JobSet controllers and the real node, left running for
# kubectl (docs/controlplane.md). FEATURE_GATES=TrainJobStatus=true turns on controller feature
# gates; NO_REAL_NODE=1 leaves the real node out.
cluster-up: setup cluster-build
	$(PY) hack/k8s/cluster.py up $(if $(FEATURE_GATES),--feature-gates $(FEATURE_GATES)) $(if $(NO_REAL_NODE),--no-real-node)

cluster-status: setup
	$(PY) hack/k8s/cluster.py status

cluster-down: setup
	$(PY) hack/k8s/cluster.py down

unit: setup
	$(PY) -m pytest --doctest-modules kfp_trainer tests/unit

# The README's reliability table: the fault suite RUNS times on fresh test clusters, counted at the API server.
RUNS ?= 3
reliability: setup cluster-build
	$(PY) hack/reliability.py --runs $(RUNS)

# kfp-trainer against the kubeflow SDK 0.5.0 (installed into a virtualenv of its own) on a control
# plane of its own, requests counted in its API server's audit log; about 11 minutes on 2 cores.
# Writes bench/results.json and bench/results.md. BENCH_ARGS=--smoke checks the harness in ~3 minutes.
bench: setup cluster-build
	$(PY) -m bench.run $(BENCH_ARGS)

# The control plane's Go build (CPU) runs beside the Python setup, the lint and the images (mostly
# downloads and disk). The two apt installs come first, one after the other (apt takes one at a time).
test: host-packages browser
	$(MAKE) -j2 cluster-build test-prerequisites

# Three pytest sessions side by side (hack/pytest_groups.py): the integration tests, which mostly wait
# on the control plane; the tests that run clusters of their own; the unit and local tests, which keep
# the CPUs busy.
test-prerequisites: setup lint test-images
	$(PY) hack/pytest_groups.py

# The whole CI run on a fresh clone of HEAD with HOME, the Go module and build caches and pip's
# cache pointed at empty directories (hack/cold-test.sh): what a new machine sees. COLD_ROOT=<dir>
# and KEEP=1 keep its caches and log.
test-cold:
	bash hack/cold-test.sh $(if $(KEEP),--keep)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The documentation site (mkdocs.yml, docs/) into build/site/, warnings as errors, as make test builds it.
.PHONY: docs
docs: setup
	$(PY) -m mkdocs build --strict --site-dir build/site
