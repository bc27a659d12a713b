# The two commands a newcomer needs; both install what is missing first (scripts/setup.sh).
VENV ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),.venv)
export VENV

.PHONY: demo test setup
demo: setup
	$(VENV)/bin/icecdc demo

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

setup:
	@bash scripts/setup.sh
