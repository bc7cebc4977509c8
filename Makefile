# initshift — every entry point a developer or CI needs. Each target bootstraps what it uses.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Debian's python3 builds a smaller frozen waiter than pyenv's; fall back to whatever python3 is on PATH.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# Debian packages the tests and the waiter build use; installed with apt-get when missing (root only).
# PyInstaller freezes against Python's shared library (libpythonX.Y), which a bare python3 lacks.
# prometheus: its promtool evaluates the alert rules in tests/deploy/test_monitoring.py.
APT_PACKAGES := patchelf docker-registry busybox-static apache2-utils prometheus $(if $(filter /usr/bin/%,$(PYTHON)),libpython$(PYVER))
# Benchmarks only: wrk, a C load generator, so the client is never the bottleneck; valgrind
# counts the instructions a review costs (bench-admission-callgrind).
BENCH_APT_PACKAGES := wrk
CALLGRIND_APT_PACKAGES := valgrind
# make e2e: a throwaway single-node cluster (tests/support/k8s) from ../shared/k8s: etcd,
# containerd with runc, the CNI bridge plugins, iptables (the kubelet's checks), gcc for the
# static pause and fake-proxy images, busybox-static and curl for the pods' images.
E2E_APT_PACKAGES := etcd-server containerd runc containernetworking-plugins iptables iproute2 busybox-static gcc libc6-dev curl \
  docker-registry apache2-utils
# E2E_K8S: "1.34", "1.28" or both (the default, one after the other).
E2E_K8S ?=
PYTEST_ARGS ?=
# pip constraints for the venv: empty installs the newest versions pyproject allows;
# `make test-floors` sets constraints/floors.txt (every lower bound) in its own venv.
PIP_CONSTRAINTS ?=
FLOORS_VENV := .venv-floors

.PHONY: help venv system-deps run test test-floors e2e waiter wheel lock bench bench-waiter bench-admission bench-admission-callgrind bench-hostile bench-watcher bench-rewrite bench-deployment clean

help:
	@echo "make run            start the HTTPS webhook on https://127.0.0.1:8443 (self-signed CA in .run/)"
	@echo "make test           bootstrap .venv, install, run every test"
	@echo "make test-floors    the same in .venv-floors with the lowest versions pyproject allows"
	@echo "make e2e            the scenarios on a real apiserver and kubelet (root; ../shared/k8s or KUBECONFIG)"
	@echo "make lock           regenerate constraints/image.txt (the versions the image installs)"
	@echo "make waiter         build the frozen waiter bundle in dist/waiter/"
	@echo "make wheel          build the initshift wheel in dist/wheels/ (the image installs it)"
	@echo "make bench          run every benchmark (prints figures)"
	@echo "make bench-deployment  the Deployment's memory: serve --watch in its limit, attacked during a watcher burst"

$(STAMP): pyproject.toml $(PIP_CONSTRAINTS)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 needed"'
	@if ! $(PYTHON) -m venv --help >/dev/null 2>&1 || ! $(PYTHON) -c 'import ensurepip' 2>/dev/null; then \
	  echo "installing python3-venv"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,build]' $(if $(PIP_CONSTRAINTS),-c $(PIP_CONSTRAINTS))
	touch $(STAMP)

venv: $(STAMP)

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "apt-get install$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "missing Debian packages:$$missing (run as root, or install them)"; fi; fi

run: $(STAMP)
	$(VENV)/bin/initshift dev-server

test: $(STAMP) system-deps waiter
	$(PY) -m pytest $(PYTEST_ARGS)

# The floors job: its own venv, every dependency at pyproject's lower bound, every test
# (the frozen waiter is rebuilt with the lowest PyInstaller too).
test-floors:
	$(MAKE) test VENV=$(FLOORS_VENV) PIP_CONSTRAINTS=constraints/floors.txt

# Real Kubernetes: a throwaway cluster per version from ../shared/k8s (E2E_K8S=1.34 or 1.28;
# default both), or the cluster KUBECONFIG names. docs/testing.md says what it runs.
e2e: waiter
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES="$(E2E_APT_PACKAGES)"
	$(PY) -m tests.e2e $(if $(E2E_K8S),--k8s "$(E2E_K8S)")

waiter: $(STAMP) system-deps
	$(PY) -m waiter.build dist/waiter

# The installable wheel (the Dockerfile's runtime stage installs it from dist/wheels/).
wheel: $(STAMP)
	$(PY) -m pip wheel -q --no-deps -w dist/wheels .

# constraints/image.txt: the runtime dependencies resolved newest within pyproject's bounds
# (the Dockerfile installs the wheel with -c it); commit the result.
lock: $(STAMP)
	$(PY) -m tests.support.lockfile

bench: bench-waiter bench-admission bench-hostile bench-watcher bench-rewrite bench-deployment

bench-waiter: waiter
	$(PY) -m tests.bench.waiter_bench

bench-admission: $(STAMP)
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES="$(BENCH_APT_PACKAGES)"
	$(PY) -m tests.bench.latency_bench
	$(PY) -m tests.bench.admission_bench

# Instructions per /mutate and /healthz under callgrind: the same figure on a busy machine
# (BASE=DIR: also for the server from another checkout, e.g. `git worktree add /tmp/base main`).
bench-admission-callgrind: $(STAMP)
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES="$(CALLGRIND_APT_PACKAGES)"
	$(if $(BASE),$(PY) -m tests.bench.admission_callgrind --server-tree $(BASE))
	$(PY) -m tests.bench.admission_callgrind

# One hostile client at a time (every attack the server is bounded against) and what each
# costs it: memory, CPU, a legitimate /mutate's latency meanwhile; then the memory sizing terms.
bench-hostile: $(STAMP)
	$(PY) -m tests.bench.hostile_bench

# The watcher driving 1,000 build pods through a real etcd + kube-apiserver (tests/support/k8s,
# the binaries make e2e uses), else through the in-process API double (~25 minutes).
WATCHER_BENCH_APT_PACKAGES := etcd-server
bench-watcher: $(STAMP)
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES="$(WATCHER_BENCH_APT_PACKAGES)"
	$(PY) -m tests.bench.watcher_bench

# The Deployment as it runs: `initshift serve --watch` with deploy/base's command, env and
# memory limit (a cgroup) against a real etcd + kube-apiserver, while the worst attacks of
# bench-hostile and the 1,000-pod burst of bench-watcher run at once: its peak, OOM kills,
# the legitimate reviews' p99 (root; the binaries make e2e uses).
bench-deployment: $(STAMP)
	@$(MAKE) --no-print-directory system-deps APT_PACKAGES="$(WATCHER_BENCH_APT_PACKAGES)"
	$(PY) -m tests.bench.deployment_bench

# The rewrite and its JSONPatch as a pod grows to n steps x n mains (n up to 12,000).
bench-rewrite: $(STAMP)
	$(PY) -m tests.bench.rewrite_bench

clean:
	rm -rf build dist .pytest_cache .hypothesis
