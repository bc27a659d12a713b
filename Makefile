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
# of its own (tests/conftest.py). Three on 2 cores: most integration tests
# wait on settle windows, brokers and JVMs rather than burn CPU (measured from fresh clones beside a busy
# core: 28.5 minutes with two, 24:56 and 24:59 with three, for 620 tests; 27:47 with three for 695;
# 23:06 for 705, 21:55 and 22:58 for 712 since the tests' JVM options, tests/processes.py; 23:13 for 720
# beside a busy core and the demo, 23:18 for 721, 19:50 for 727, 23:24 for 730, 21:07 for 735, 19:21 for 742, 22:31 for 746, 20:44 for 747 and 22:58 for 750 beside a busy core; 27:14 for 749 alone and 36:36 beside a busy
# core on an evening the machine ran 1.7x slower, 30:58 and 40:41 later that evening; 29:07 alone on 2026-11-28, 27:01 from a fresh clone once the tests' JVMs read a class archive and the broker stops at once: tests/jvm_archive.py). Each worker runs its own Spark JVM (about 1.5 GiB).
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
