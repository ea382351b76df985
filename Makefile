# splitserve: `make run` starts the local stack, `make test` runs every gate and test.
# Component-specific targets live in mk/*.mk and add themselves to CHECKS / TEST_DEPS.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
EXTRAS ?= dev,sim,operator
PYTEST_ARGS ?=

CHECKS :=
TEST_DEPS :=
# Filled by mk/vllm.mk: the second lane of `make test`, and what pytest waits for.
TEST_LANES :=
PYTEST_AFTER :=

.PHONY: all venv run test pytest-after-checks lint typecheck layers gen gen-check pytest bench clean
all: test

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -c constraints/cpu.txt -e '.[$(EXTRAS)]'
	@touch $(STAMP)

venv: $(STAMP)

# With the vLLM venv present (`make venv-vllm`), `make run` serves a tiny random Llama model with
# vLLM workers (float32 on CPU: see docs/engines.md); otherwise simulated engines. Either way: one
# prefill, one decode, one router, and clients use the model name the README shows (RUN_MODEL).
# RUN_ARGS go to `splitserve up`, e.g. `make run RUN_ARGS="-- --dtype bfloat16"` (vLLM).
TINY_MODEL ?= $(HOME)/.cache/splitserve/tiny-llama
RUN_MODEL  ?= splitserve-sim
RUN_ARGS   ?=
run: $(STAMP)
	@if [ -x .venv-vllm/bin/splitserve ] && [ -f .venv-vllm/.installed ]; then \
	  [ -f $(TINY_MODEL)/config.json ] || .venv-vllm/bin/splitserve gen tiny-model $(TINY_MODEL); \
	  exec .venv-vllm/bin/splitserve up --engine vllm --model $(TINY_MODEL) \
	    --served-model-name $(RUN_MODEL) $(RUN_ARGS); \
	else \
	  exec $(VENV)/bin/splitserve up --model $(RUN_MODEL) $(RUN_ARGS); \
	fi

-include mk/*.mk

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests
	@if find operator router worker -name '*.py' | grep -q .; then \
	  echo "component folders operator/ router/ worker/ must not hold Python"; exit 1; fi

typecheck: $(STAMP)
	$(VENV)/bin/mypy

layers: $(STAMP)
	$(VENV)/bin/lint-imports

gen: $(STAMP)
	$(VENV)/bin/splitserve gen proto

gen-check: $(STAMP)
	$(VENV)/bin/splitserve gen proto --check

# The vLLM contract tests run in their own venv (`make test-vllm`, part of CHECKS).
pytest: $(STAMP) $(TEST_DEPS)
	$(PY) -m pytest --ignore=tests/contract/vllm $(PYTEST_ARGS)

# `make test` runs in two lanes at once (make -j2; CI has two cores): the gates, then pytest; and
# beside them the compiled-build check and (unless SPLITSERVE_SKIP_VLLM) the vLLM venv build and
# its contract tests, whose output goes to $(VLLM_LOG) and is shown when they end. pytest waits
# for the vLLM venv (the harness smoke test uses it). The test runs print how long they took.
# make starts prerequisites in the order listed: the vLLM venv build (mostly download) beside the
# gates first, so that pytest, the longest step, starts as early as it can; the compiled check
# and the vLLM tests then run beside it.
SIDE_CHECKS := compiled-check test-vllm

test: $(STAMP)
	@$(MAKE) --no-print-directory -j2 test-lanes

.PHONY: test-lanes test-side test-checks
test-lanes: $(PYTEST_AFTER) pytest-after-checks test-side

test-side: $(filter compiled-check,$(CHECKS)) $(TEST_LANES)

test-checks: lint typecheck layers gen-check $(filter-out $(SIDE_CHECKS),$(CHECKS))

pytest-after-checks: test-checks $(TEST_DEPS) $(PYTEST_AFTER)
	@start=$$(date +%s); $(MAKE) --no-print-directory pytest; status=$$?; \
	  echo "make test: pytest took $$(( $$(date +%s) - start )) s"; exit $$status

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
