# The two commands of the quickstart: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.klbr-installed

.PHONY: demo test bench browser-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	# An editable install does not place shared data; write the same kernelspec into the venv.
	$(BIN)/klbr-kernel install --sys-prefix
	touch $@

demo: $(STAMP)
	$(BIN)/python notebooks/run.py notebooks/tour.ipynb

# Debian's chromium for the JupyterLab smoke test (Playwright cannot download a browser here).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
		(apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) browser-deps
	$(BIN)/python -m pytest -q -ra

bench: $(STAMP)
	$(BIN)/python benchmarks/compare.py --readme README.md

clean:
	rm -rf $(VENV) build *.egg-info
