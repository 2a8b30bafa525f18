# One entry point per task. See README.md and docs/development.md.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PROTO_FILES := $(shell find proto -name '*.proto' | sort)

.PHONY: docs check-docs venv proto check-proto check lint test test-unit test-integration demo bench bench-smoke agent probe clean deb e2e verify-report mcp-venv synapse-venv

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml scripts/bootstrap-venv
	scripts/install-deps
	scripts/bootstrap-venv $(VENV)
	touch $@

proto: venv
	scripts/gen-proto

check-proto: venv
	scripts/gen-proto --check

lint: venv
	$(VENV)/bin/ruff format --check ironclawd agent redteam_probe tests benchmarks packaging/build-agent
	$(VENV)/bin/ruff check ironclawd agent redteam_probe tests benchmarks packaging/build-agent
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

check: check-proto check-docs lint test-unit

test-unit: venv
	$(PY) -m pytest -q tests/unit tests/contract

# The whole suite: unit tier on the host, then integration/redteam/e2e against a private systemd.
# The e2e tier builds the .deb of each suite and installs it on a debootstrapped Debian 12 and 13
# (network to the Debian mirror): IRONCLAW_E2E=0 skips it.
test: check probe mcp-venv synapse-venv
	rm -f results/containment-report.json results/containment-report.json.minisig
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 $(wildcard tests/integration tests/redteam tests/e2e)
	@$(MAKE) --no-print-directory verify-report

# The red-team run's signed containment report, checked as an operator would: signature by the
# build's key, format, no escape, a negative control that saw one (docs/containment-report.md).
# Quiet when it holds (pytest's summary stays the last line); the table and why when it does not.
# make test removes the previous report first, so a run that wrote none fails here.
verify-report:
	@$(VENV)/bin/ironctl containment verify results/containment-report.json \
		--pubkey build/containment/minisign.pub >results/containment-verify.txt 2>&1 \
		|| { cat results/containment-verify.txt; exit 1; }

# dist/$(SUITE)/ironclaw_<version>_<arch>.deb: dpkg-buildpackage in a clean chroot of the suite
# (build/deb-chroot/), lintian-clean (packaging/build-deb). SUITE=bookworm|trixie.
SUITE ?= bookworm
deb:
	scripts/install-deps
	packaging/build-deb --suite $(SUITE)

# The .deb of each suite installed, run, reloaded, restarted, upgraded, removed and purged on a
# clean Debian 12 and 13 under a private systemd (the test builds each with
# packaging/build-deb --suite, cached; IRONCLAW_E2E_DEB_BOOKWORM/_TRIXIE name prebuilt ones).
e2e: venv
	$(PY) -m pytest -q -p no:cacheprovider tests/e2e

agent: venv
	packaging/build-agent

# The test-only red-team probe (redteam_probe/), frozen like the agent into build/probe/<hash>/
# (cached by input hash). The daemon fixture adds it to the agent image (install-dev --with-probe);
# the shipped agent and the .deb never contain it.
probe: venv
	packaging/build-agent --program probe

# The third-party MCP servers the tests run (scripts/mcp-test-venv; cached under build/mcp-venv/
# by the pins; the tests also build it on first use).
mcp-venv:
	scripts/mcp-test-venv >/dev/null

# The Matrix homeserver the channel tests run (scripts/synapse-test-venv: Synapse pinned, cached
# under build/synapse-venv/ by the pin; ~1 min cold; the tests also build it on first use).
synapse-venv:
	scripts/synapse-test-venv >/dev/null

demo: venv
	scripts/demo

bench: venv mcp-venv synapse-venv
	$(PY) -m benchmarks.run $(BENCH)

# Every benchmark once, with the fewest rounds and sessions, into build/bench-smoke (results/
# is left alone): that each still runs to its table, not what it measures; no figure gates.
# .ci/run runs it after the tests (a benchmark once failed unnoticed for a whole stop).
SMOKE_KNOBS := BENCH_RESULTS=$(CURDIR)/build/bench-smoke BENCH_ROUNDS=2 BENCH_CALLS=5 \
	BENCH_STATUS_ROUNDS=2 BENCH_ROUND_TRIPS=5 BENCH_MSG_SESSIONS=2 BENCH_DENSITY="2 3" \
	BENCH_MAX_SESSIONS=3 BENCH_IDLE_SECONDS=1 BENCH_PLATFORM_TRIPS=2 BENCH_BIG_ROUNDS=2 \
	BENCH_MODEL_CALLS=5 BENCH_MCP_COLD=1 BENCH_CHAN_ROUNDS=2 BENCH_PKG_BUILDS=1 \
	BENCH_PKG_SESSIONS=1 BENCH_PKG_CALLS=2
bench-smoke: venv mcp-venv synapse-venv
	rm -rf build/bench-smoke
	$(SMOKE_KNOBS) $(PY) -m benchmarks.run $(BENCH)

# Man pages, shell completion, docs/ironctl.md and docs/config.md from the parsers and the config
# schema (scripts/gen-cli-docs). Re-run after changing a parser's help or the schema; commit.
docs: venv
	scripts/gen-cli-docs

# Fails naming each committed generated file that differs from what make docs writes now.
check-docs: venv
	scripts/gen-cli-docs --check

clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache  # build/e2e: the cached Debian root
