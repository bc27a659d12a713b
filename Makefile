# The commands a newcomer needs; each installs what is missing first (scripts/setup.sh).
#   make demo       the local demo: PostgreSQL -> Debezium -> icecdc ingest -> Iceberg, on the embedded stack
#   make test       the fast default: unit, static checks, in-memory properties, integration tests
#                   that are neither benches nor marked slow
#   make test-all   everything, what CI runs (.ci/run)
#   make check      ruff, mypy and import-linter alone
# PYTEST_ARGS adds to pytest's arguments, e.g. make test PYTEST_ARGS="tests/unit -q"; WORKERS=1
# runs the tests in one process.
VENV ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
export VENV
# Test processes (pytest-xdist); a file's tests stay on one worker, so module-scoped fixtures
# (a PostgreSQL cluster, a Debezium run) are made once, except the bench smoke tests, each a unit
# of its own (tests/conftest.py). Three on 2 cores: with two the tests' waits (settle windows,
# brokers, JVM starts) leave a core idle, with four the cores are saturated and the suite is no
# faster (docs/contributing.md, "The suite's time", has the runs). Each worker runs its own Spark
# JVM (about 1.5 GiB).
WORKERS ?= 3
PYTEST = $(VENV)/bin/python -m pytest --durations=15 -n $(WORKERS) --dist loadfile

.PHONY: demo test test-all check setup
demo: setup
	$(VENV)/bin/icecdc demo

test: setup
	$(PYTEST) -m "not bench and not slow" $(PYTEST_ARGS)

test-all: setup
	$(PYTEST) $(PYTEST_ARGS)

check: setup
	$(VENV)/bin/python -m pytest -q tests/unit/test_static_checks.py $(PYTEST_ARGS)

setup:
	@bash scripts/setup.sh
