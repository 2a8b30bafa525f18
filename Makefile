# One entry point per task. See README.md and docs/development.md.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PROTO_FILES := $(shell find proto -name '*.proto' | sort)

.PHONY: docs venv proto check-proto check lint test test-unit test-integration demo bench agent clean

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	scripts/install-deps
	scripts/bootstrap-venv $(VENV)
	touch $@

proto: venv
	scripts/gen-proto

check-proto: venv
	scripts/gen-proto --check

lint: venv
	$(VENV)/bin/ruff format --check ironclawd agent tests benchmarks packaging/build-agent
	$(VENV)/bin/ruff check ironclawd agent tests benchmarks packaging/build-agent
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

check: check-proto lint test-unit

test-unit: venv
	$(PY) -m pytest -q tests/unit

# The whole suite: unit tier on the host, then integration/redteam/e2e against a private systemd.
test: check
	$(PY) -m pytest -q -p no:cacheprovider $(wildcard tests/integration tests/redteam tests/e2e)

agent: venv
	packaging/build-agent

demo: venv
	scripts/demo

bench: venv
	$(PY) -m benchmarks.run

docs: venv
	scripts/gen-config-doc

clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache
