# The two commands: `make serve` and `make test`. Everything else is what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?=
# e.g. make test PYTEST_ARGS="-m 'not image'" to skip building and running the container image.
PYTEST_ARGS ?=
SPECPROXY := $(BIN)/specproxy $(if $(CONFIG),--config $(CONFIG),)

.PHONY: serve test test-fast provision system-deps test-deps lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

# Build tools for llama-server: all that serving needs.
system-deps:
	@./scripts/system-deps.sh serve

# And what the tests drive: Prometheus, podman, chromium, Node.js and npm for the agents.
test-deps:
	@./scripts/system-deps.sh test

provision: $(STAMP) system-deps
	$(SPECPROXY) provision

serve: provision
	$(SPECPROXY) serve

test: $(STAMP) test-deps
	$(BIN)/specproxy --config tests/configs/test.yaml provision qwen2.5-coder-0.5b
	./scripts/install-agents.sh
	$(BIN)/pytest -ra --durations=25 $(PYTEST_ARGS)

# The in-process tier, tests/fast/: no llama-server, no models, seconds (the same tests as
# `pytest -m "not integration"`: tests/conftest.py marks tests/integration/ `integration`).
test-fast: $(STAMP)
	$(BIN)/pytest tests/fast -q

# What CI runs before the suite (.ci/run): ruff's rules and format, then mypy over the files
# pyproject.toml's [tool.mypy] lists (proxy, tests, loadtests, scripts).
lint: $(STAMP)
	$(BIN)/ruff check proxy tests loadtests scripts
	$(BIN)/ruff format --check proxy tests loadtests scripts
	$(BIN)/mypy

bench: provision
	$(SPECPROXY) bench

clean:
	rm -rf $(VENV)
