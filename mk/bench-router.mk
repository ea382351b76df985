# Router cost benchmark (issue 17): `make bench-router`. Not part of `make test`.
#
# Starts zero-delay sim workers (`--sim-time-scale 0`) and the splitserve router (pinned to core
# 0), and vllm-router (PyPI, pinned, in its own venv) in P/D mode over fake OpenAI backends on the
# same core; drives both with our own bounded load generator (closed and open loop) from core 1;
# prints the figures side by side as ratios and writes out/bench-router.md, plus a py-spy flame
# graph of our router at saturation (out/flame-splitserve-*.svg), and every figure as JSON
# (out/bench-router.json). Summarised by hand in docs/benchmarks.md. Needs 2+ cores (pinning
# with os.sched_setaffinity; the layout is printed in the report). ~5 minutes on the 2-core dev
# machine (more with --scaling and --slow-streams; bound it with BENCH_ROUTER_ARGS, e.g.
# "--rates 200", or cap it with "--budget-s 300").

BENCH_ROUTER_VENV   ?= .venv-bench-router
VLLM_ROUTER_VERSION ?= 0.1.17
PY_SPY_VERSION      ?= 0.4.1
BENCH_ROUTER_ARGS   ?=

.PHONY: bench-router

$(BENCH_ROUTER_VENV)/.installed:
	python3 -m venv $(BENCH_ROUTER_VENV)
	$(BENCH_ROUTER_VENV)/bin/pip install -q vllm-router==$(VLLM_ROUTER_VERSION) \
	  py-spy==$(PY_SPY_VERSION)
	touch $@

bench-router: $(STAMP) $(BENCH_ROUTER_VENV)/.installed
	@mkdir -p out
	$(PY) -m tests.bench_router.run --vllm-router $(BENCH_ROUTER_VENV)/bin/vllm-router \
	  --py-spy $(BENCH_ROUTER_VENV)/bin/py-spy --out out/bench-router.md $(BENCH_ROUTER_ARGS)

# The slow-stream scenario alone (issue 17 item 2): RSS of one router process at 1,000 / 5,000 /
# 10,000 open streams over a timer-wheel bench backend; BENCH_STREAMS_ARGS="--trace" adds a
# tracemalloc diff (use a smaller --count: tracing slows the router). ~2 minutes.
BENCH_STREAMS_ARGS ?=

.PHONY: bench-router-streams

bench-router-streams: $(STAMP)
	@mkdir -p out
	$(PY) -m tests.bench_router.streams --out out/bench-router-streams.md $(BENCH_STREAMS_ARGS)

# The scale-out figure on a many-core machine (issue 17 items 3-4): 1 / 2 / 4 router processes
# (`router serve --processes N`, each pinned to its own core; c = 32 per process), vllm-router on
# 1 and 4 cores, the 200- and 1,024-token rows, all within BENCH_SCALE_BUDGET_S seconds (parts
# that would not fit are skipped, and the report says which). Automatic layout from 8 cores
# (router / load generator / backend cores disjoint); set the cores with BENCH_SCALE_ARGS, e.g.
# "--router-cores 0-3 --load-cores 4-6 --worker-cores 7-15". Runs from the source tree alone
# (PYTHONPATH=src, no install): see docs/benchmarks.md "Scale-out".
BENCH_SCALE_BUDGET_S ?= 290
BENCH_SCALE_ARGS     ?=

.PHONY: bench-router-scale

bench-router-scale: $(STAMP) $(BENCH_ROUTER_VENV)/.installed
	@mkdir -p out
	PYTHONPATH=src $(PY) -m tests.bench_router.run \
	  --vllm-router $(BENCH_ROUTER_VENV)/bin/vllm-router --py-spy $(BENCH_ROUTER_VENV)/bin/py-spy \
	  --out out/bench-router.md --scale 1 2 4 --slow-streams 0 --rates 100 200 400 800 \
	  --budget-s $(BENCH_SCALE_BUDGET_S) $(BENCH_SCALE_ARGS)

# A mypyc build of the router's compilable per-request / per-token modules, for measurement only
# (docs/benchmarks.md "Seventeenth pass": no gain measured, so nothing uses it and CI does not
# build it). A copy of src/splitserve with the extension modules beside their sources, like
# `make sim-compiled`; compare it with the pure-Python tree on the same workers with
# `python -m tests.bench_router.ab --a-src '' --b-src $(ROUTER_MYPYC_BUILD)`, or per call with
# `PYTHONPATH=$(ROUTER_MYPYC_BUILD) python -m tests.bench_router.compiled_micro`. Left out:
# dispatch, generation and openai_stream (async generators: "unimplemented" in mypyc 2.4.1),
# pool_view (a `KeyError` subclass, and a dataclass field typed with a stub-only class that a
# compiled dataclass evaluates at import), openai_models (pydantic models). ~2 minutes here.
ROUTER_MYPYC_BUILD   ?= build/mypyc-router
ROUTER_MYPYC_MODULES := $(addprefix splitserve/router/,fast_lane.py detokenizer.py ledger.py \
  http_sse.py mux.py fast_bpe.py client_link.py latency.py request_stats.py slo.py admission.py \
  stops.py) splitserve/core/frames.py

.PHONY: router-compiled

router-compiled: $(STAMP)
	rm -rf $(ROUTER_MYPYC_BUILD)
	mkdir -p $(ROUTER_MYPYC_BUILD)
	cp -R src/splitserve $(ROUTER_MYPYC_BUILD)/splitserve
	find $(ROUTER_MYPYC_BUILD) -name __pycache__ -prune -exec rm -rf {} +
	cd $(ROUTER_MYPYC_BUILD) && $(abspath $(VENV))/bin/mypyc $(ROUTER_MYPYC_MODULES) > mypyc.log 2>&1 \
	  || { tail -40 mypyc.log; exit 1; }
	@echo "$(words $(ROUTER_MYPYC_MODULES)) modules compiled into $(ROUTER_MYPYC_BUILD)"
