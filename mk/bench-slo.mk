# SLO router benchmark (issue 10): the SLO router against the wave-1 router under a two-class
# overload, on a local stack of simulated workers. Not part of `make test`; results are
# summarised in docs/benchmarks.md. BENCH_SLO_ARGS passes options (--rates, --duration, ...).
.PHONY: bench-slo
BENCH_SLO_ARGS ?=
bench-slo: $(STAMP)
	$(PY) -m splitserve.cli.bench_slo $(BENCH_SLO_ARGS)
