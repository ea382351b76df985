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

# inference-perf and aiperf (issue 18), each pinned in its own venv, against a local simulated
# `splitserve up` stack: `make bench-harnesses` (not part of `make test`; ~1-2 minutes on the
# 2-core dev machine). inference-perf needs Python >= 3.12. Summarised in docs/benchmarks.md.
# BENCH_HARNESSES picks them (default both); REQUESTS / RATE / INPUT_TOKENS / OUTPUT_TOKENS and
# OUT pass through to tools/bench_harnesses.sh.
INFERENCE_PERF_VERSION ?= 0.7.0
AIPERF_VERSION         ?= 0.13.0
INFERENCE_PERF_PYTHON  ?= python3.12
INFERENCE_PERF_VENV    := .venv-inference-perf
AIPERF_VENV            := .venv-aiperf
BENCH_HARNESSES        ?= inference-perf aiperf
.PHONY: bench-harnesses

$(INFERENCE_PERF_VENV)/.installed: mk/harness.mk
	$(INFERENCE_PERF_PYTHON) -m venv $(INFERENCE_PERF_VENV)
	$(INFERENCE_PERF_VENV)/bin/python -m pip install -q 'inference-perf==$(INFERENCE_PERF_VERSION)'
	@touch $@

$(AIPERF_VENV)/.installed: mk/harness.mk
	$(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install -q 'aiperf==$(AIPERF_VERSION)'
	@touch $@

bench-harnesses: $(STAMP) $(INFERENCE_PERF_VENV)/.installed $(AIPERF_VENV)/.installed
	PY=$(PY) IP_VENV=$(INFERENCE_PERF_VENV) AP_VENV=$(AIPERF_VENV) \
	  tools/bench_harnesses.sh $(BENCH_HARNESSES)
