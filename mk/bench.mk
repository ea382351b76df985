# Simulator speed benchmark (issue 4) and its optional compiled build. Not part of `make test`.
#
# `make bench`           pure Python, then (where a C compiler is present) the mypyc build, each
#                        with exact router input and with 0.1 s load reports; writes
#                        out/bench-sim.md (summarised by hand in docs/benchmarks.md).
# `make sim-compiled`    compiles `splitserve.sim.bench.COMPILED_MODULES` with mypyc (part of
#                        the dev extra) into $(MYPYC_BUILD): a copy of src/splitserve with the
#                        extension modules beside their sources. src/ is never touched; the build
#                        is used by putting $(MYPYC_BUILD) first on PYTHONPATH.
# `make golden-compiled` checks that the compiled modules are the ones imported from the build,
#                        then runs the simulator and policy suites against it (the golden
#                        digests included; ~20 s). `make bench` runs it before timing the build.
# BENCH_ARGS (e.g. `--max-requests 3000 --repeat 3`) go to `python -m splitserve.sim.bench`.
# Measured on the 2-core dev machine: the build ~25 s, the full bench ~15-20 s.

MYPYC_BUILD   ?= build/mypyc
MYPYC_STAMP   := $(MYPYC_BUILD)/.built
BENCH_ARGS    ?=
BENCH_MODES   ?= --report-interval 0 --report-interval 0.1
SIM_SOURCES   := $(shell find src/splitserve -name '*.py' -not -path '*/__pycache__/*' 2>/dev/null)

.PHONY: bench bench-pure bench-compiled sim-compiled golden-compiled clean-compiled \
  compiled-check

# `make test` (and CI) also checks the compiled build against the golden digests wherever it can
# be built (a C compiler and the Python headers); elsewhere it says so and goes on, since the
# compiled build is an optional speed path and the pure-Python tree is what the tests cover.
CHECKS += compiled-check

compiled-check: $(STAMP)
	@if [ -n "$$SPLITSERVE_SKIP_COMPILED" ]; then \
	  echo "compiled-build check skipped: SPLITSERVE_SKIP_COMPILED is set"; \
	elif command -v $${CC:-cc} >/dev/null 2>&1 && $(PY) -c 'import os, sysconfig, sys; \
	  sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; \
	then $(MAKE) --no-print-directory golden-compiled; \
	else echo "compiled-build check skipped: no C compiler or no Python headers here"; fi

# `| tee` keeps the table on screen; pipefail keeps a failed run's status (tee's 0 hid it).
bench: SHELL := /bin/bash
bench: .SHELLFLAGS := -o pipefail -c
bench: $(STAMP)
	@mkdir -p out
	$(MAKE) --no-print-directory bench-pure | tee out/bench-sim.md
	@if command -v $${CC:-cc} >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory golden-compiled && \
	  $(MAKE) --no-print-directory bench-compiled | tee -a out/bench-sim.md; \
	else echo "no C compiler: compiled build skipped"; fi

bench-pure: $(STAMP)
	@$(PY) -m splitserve.sim.bench $(BENCH_MODES) $(BENCH_ARGS)

bench-compiled: | $(MYPYC_STAMP)
	@PYTHONPATH=$(abspath $(MYPYC_BUILD)) $(PY) -m splitserve.sim.bench $(BENCH_MODES) $(BENCH_ARGS)

sim-compiled: $(MYPYC_STAMP)

$(MYPYC_STAMP): $(STAMP) $(SIM_SOURCES) mk/bench.mk
	rm -rf $(MYPYC_BUILD)
	mkdir -p $(MYPYC_BUILD)
	cp -R src/splitserve $(MYPYC_BUILD)/splitserve
	find $(MYPYC_BUILD) -name __pycache__ -prune -exec rm -rf {} +
	cd $(MYPYC_BUILD) && $(abspath $(VENV))/bin/mypyc \
	  $$($(abspath $(PY)) -m splitserve.sim.bench --print-modules) > mypyc.log 2>&1 \
	  || { tail -40 mypyc.log; exit 1; }
	@touch $@

golden-compiled: $(MYPYC_STAMP)
	PYTHONPATH=$(abspath $(MYPYC_BUILD)) $(PY) -c 'from splitserve.sim.bench import \
	  COMPILED_MODULES as want, build_kind, compiled_modules; got = compiled_modules(); \
	  assert got == list(want) and build_kind() == "mypyc", f"not the compiled build: {got}"; \
	  print(f"{len(got)} compiled modules imported from $(MYPYC_BUILD)")'
	PYTHONPATH=$(abspath $(MYPYC_BUILD)) $(PY) -m pytest -q -p no:cacheprovider \
	  tests/unit/sim tests/unit/policy \
	  --deselect tests/unit/sim/test_bench.py::test_the_test_suite_runs_pure_python

clean-compiled:
	rm -rf $(MYPYC_BUILD)
