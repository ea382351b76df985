# Benchmark harnesses that `vllm serve` users run, in their own venv (issue 18): guidellm, pinned.
# `make venv-bench` builds .venv-bench; tests/integration/test_harness_smoke.py runs it (and
# vLLM's `vllm bench serve` from .venv-vllm) against a local `splitserve up` stack.
GUIDELLM_VERSION ?= 0.3.1
BENCH_VENV       := .venv-bench
.PHONY: venv-bench test-harness

$(BENCH_VENV)/.installed: mk/harness.mk
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q 'guidellm==$(GUIDELLM_VERSION)'
	@touch $@

venv-bench: $(BENCH_VENV)/.installed

# `make test` (CI) runs guidellm's smoke too: the venv is a test dependency.
TEST_DEPS += $(BENCH_VENV)/.installed

test-harness: $(STAMP)
	$(PY) -m pytest -q tests/integration/test_harness_smoke.py
