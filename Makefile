# The two commands of the quickstart: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The install is editable: hatchling puts the checkout on sys.path with a plain path entry (no
# import hook that every interpreter in the venv would run first, about 30 ms per start, paid
# twice before klbr's first worker runs, once by every plain ipykernel), so a new module needs
# no reinstall. It builds no JupyterLab extension (`make labextension` does, below).
STAMP := $(VENV)/.klbr-installed

.PHONY: demo test lint bench bench-deps peers docs bytecode browser-deps ssh-deps engine-deps labextension check-labextension clean

$(STAMP): pyproject.toml hatch_build.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	# The editable install places the wheel's kernelspec (argv `python`); write it with this interpreter's path.
	$(BIN)/klbr-kernel install --sys-prefix
	touch $@

# Bytecode for klbr's own modules, as pip writes it for an installed wheel: this environment sets
# PYTHONDONTWRITEBYTECODE, and compiling them again costs every kernel start ~100 ms.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q klbr_kernel klbr_supervisor

# The JupyterLab extension (labextension/), built from its TypeScript with this machine's Node.js and the
# jupyterlab wheel's jlpm, against the npm registry. node_modules and the bundle are never committed.
# The wheel ships the bundle as shared data; the editable install places none, so it is copied into
# the venv's share/jupyter/labextensions/ here (as the kernelspec is), where the venv's JupyterLab
# finds it. Stamps: a new lockfile or package.json installs again; a changed source builds again.
LABEXT := labextension
LABEXT_NAME := klbr-jupyterlab
LABEXT_PATH := PATH="$(abspath $(BIN)):$$PATH"
LABEXT_SOURCES := $(wildcard $(LABEXT)/src/*.ts) $(wildcard $(LABEXT)/style/*) $(LABEXT)/package.json \
	$(LABEXT)/tsconfig.json
LABEXT_DEPS := $(LABEXT)/node_modules/.klbr-installed
LABEXT_BUILT := $(LABEXT)/dist/package.json
LABEXT_INSTALLED := $(VENV)/share/jupyter/labextensions/$(LABEXT_NAME)/package.json

$(LABEXT_DEPS): $(LABEXT)/package.json $(LABEXT)/yarn.lock $(LABEXT)/.yarnrc.yml $(STAMP)
	@command -v node >/dev/null 2>&1 || { \
		(apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null; }
	cd $(LABEXT) && $(LABEXT_PATH) jlpm install --immutable
	touch $@

$(LABEXT_BUILT): $(LABEXT_DEPS) $(LABEXT_SOURCES)
	rm -rf $(LABEXT)/dist $(LABEXT)/lib $(LABEXT)/tsconfig.tsbuildinfo
	cd $(LABEXT) && $(LABEXT_PATH) jlpm build
	touch $@

$(LABEXT_INSTALLED): $(LABEXT_BUILT) $(LABEXT)/install.json
	rm -rf $(VENV)/share/jupyter/labextensions/$(LABEXT_NAME)
	mkdir -p $(VENV)/share/jupyter/labextensions/$(LABEXT_NAME)
	cp -R $(LABEXT)/dist/. $(LABEXT)/install.json $(VENV)/share/jupyter/labextensions/$(LABEXT_NAME)/

labextension: $(LABEXT_INSTALLED)

# The TypeScript's type check, lint and the tests of its logic that need no browser.
check-labextension: $(LABEXT_DEPS)
	cd $(LABEXT) && $(LABEXT_PATH) jlpm check && $(LABEXT_PATH) jlpm test

demo: bytecode
	$(BIN)/python notebooks/run.py notebooks/tour.ipynb

# Debian's chromium for the JupyterLab smoke test (Playwright cannot download a browser here).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
		(apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Debian's openssh-server for the ssh:// placement tests (each test module starts its own sshd on
# 127.0.0.1 with throwaway keys, and stops it).
ssh-deps:
	@test -x /usr/sbin/sshd && command -v ssh >/dev/null 2>&1 || { \
		(apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null; }

# Debian's Docker engine, Slurm and munge for the docker:// and slurm:// placement tests and benchmarks:
# nothing starts by itself. Each test module starts a private dockerd (no bridge, no iptables) or a
# one-node Slurm cluster on 127.0.0.1 as children of the run, and stops them (tests/engines/).
# apt waits for the lock: other runs on this machine may be installing at the same time.
APT := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600
engine-deps:
	@test -x /usr/bin/docker && test -x /usr/sbin/dockerd && command -v slurmctld >/dev/null 2>&1 && \
		command -v munged >/dev/null 2>&1 || { \
		($(APT) update -qq || true) && $(APT) install -y -qq --no-install-recommends docker.io slurm-wlm munge >/dev/null; }

# Debian's valgrind for the proxy's instruction count per cell (`benchmarks/proxy_cost.py
# --callgrind`): a benchmark's tool, never needed by `make test`. (No hardware counters in this VM,
# so `perf stat` cannot count instructions here.)
bench-deps:
	@command -v valgrind >/dev/null 2>&1 && command -v callgrind_control >/dev/null 2>&1 || { \
		(apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; }

# A second interpreter for `python:` placement tests and benchmarks: a venv with ipykernel and
# nothing of klbr, as a user's other project would have. It holds the oldest ipykernel pyproject
# admits (the main venv gets the newest), so the placement tests run klbr's worker bootstrap on
# both ends of the range. The stamp is named for the pin: a new pin builds the venv anew.
OTHER := .venv-ipykernel
OLDEST_IPYKERNEL := 6.29.0
$(OTHER)/.ipykernel-$(OLDEST_IPYKERNEL):
	rm -rf $(OTHER)
	$(PYTHON) -m venv $(OTHER)
	$(OTHER)/bin/python -m pip install --quiet --disable-pip-version-check ipykernel==$(OLDEST_IPYKERNEL)
	touch $@

$(OTHER)/.ready: $(OTHER)/.ipykernel-$(OLDEST_IPYKERNEL)
	touch $@

# ruff and mypy as pyproject.toml configures them: every finding is fixed, or silenced where it is with its reason.
# mypy again as on macOS, which runs the portable path: a name macOS lacks is a finding there too.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy --platform darwin --cache-dir .mypy_cache/darwin

# The installs from source (tests/test_packaging.py: about 1.5 minutes of pip, npm and venvs, most of
# it waiting) run beside the rest of the suite, in a pytest of their own; their report follows the suite's.
test: lint bytecode labextension check-labextension browser-deps ssh-deps engine-deps $(OTHER)/.ready
	@mkdir -p build
	$(BIN)/python -m pytest -q -ra -m packaging -p no:cacheprovider >build/packaging.log 2>&1 & installs=$$!; \
	$(BIN)/python -m pytest -q -ra -m "not packaging"; suite=$$?; \
	wait $$installs; packaging=$$?; echo "--- tests/test_packaging.py, run beside:"; cat build/packaging.log; \
	test $$suite = 0 && test $$packaging = 0

# nbclient's and papermill's own test suites with klbr as `python3` (PEERS=--plain: plain ipykernel,
# for comparison). Their dependencies go into .venv-peers, not .venv: see tests/peers/run.py.
peers: bytecode
	$(BIN)/python tests/peers/run.py $(PEERS)

bench: bytecode labextension browser-deps ssh-deps engine-deps $(OTHER)/.ready
	$(BIN)/python benchmarks/compare.py --doc docs/benchmarks.md
	$(BIN)/python benchmarks/restore_browser.py

# The manual's generated tables (options, CLI) written again from the traitlets help they come from;
# tests/test_docs.py fails while a committed page differs from what this writes.
docs: $(STAMP)
	$(BIN)/python docs/autogen.py

clean:
	rm -rf $(VENV) $(OTHER) .venv-peers build *.egg-info $(LABEXT)/node_modules $(LABEXT)/dist $(LABEXT)/lib \
		$(LABEXT)/tsconfig.tsbuildinfo
