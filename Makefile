# sessionray — the two commands a new user needs are `make run` and `make test`.
# Both create .venv on first use and (re)install the project when pyproject.toml changes.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup run init test test-deps test-deps-stop pytest smoke lint bench chaos clean help

help: ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP) ## create .venv and install sessionray with its dev tools

run: setup ## start sessionray: ./sessionray.yaml if present, else the embedded defaults; prints an admin token for the CLI (RUN_ARGS: more serve options)
	$(VENV)/bin/sessionray serve --dev-admin-token $(RUN_ARGS)

init: setup ## write a commented ./sessionray.yaml (never overwrites one)
	$(VENV)/bin/sessionray init

test: test-deps setup lint pytest ## lint, type-check and run the whole test suite

# System packages the tests need (installed when root, else one message naming them) and a
# throw-away PostgreSQL on 127.0.0.1; SESSIONRAY_TEST_PG_URL, when set, is used instead.
test-deps: ## install the tests' system packages (postgresql, prometheus, chromium; apt output to a log file) and start PostgreSQL (left running: test-deps-stop)
	@scripts/test-deps.sh >/dev/null

test-deps-stop: ## stop the throw-away PostgreSQL that test-deps started
	@scripts/test-deps.sh --stop

pytest: setup ## run the test suite only (provisions as test-deps does)
	@url=$$(scripts/test-deps.sh) && SESSIONRAY_TEST_PG_URL="$$url" $(PY) -m pytest $(PYTEST_ARGS)

smoke: setup ## the README's `make run` end to end: ready, one console message answered, Ctrl-C, no Ray left (.ci/run runs it after `make test`)
	$(PY) -m tests.smoke_run $(SMOKE_ARGS)

lint: setup ## ruff over runtime/, providers/, actors/, tests/; mypy over the first three
	$(VENV)/bin/ruff check runtime providers actors tests
	$(VENV)/bin/mypy

bench: setup ## print the benchmark figures and write build/bench/results.json
	$(PY) -m tests.bench

chaos: setup ## the chaos suite (kill -9 of every process kind, restarts, platform outages; ≈ 40 min): prints a table, writes "chaos" in build/bench/results.json
	$(PY) -m tests.chaos $(CHAOS_ARGS)

clean: ## remove the virtualenv, caches and build output
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
