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

.PHONY: all venv run test lint typecheck layers gen gen-check pytest bench clean
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

test: $(STAMP)
	$(MAKE) lint typecheck layers gen-check $(CHECKS)
	$(MAKE) pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
