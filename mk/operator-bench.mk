# API requests of an idle operator per service, on the kmock emulator (issue 15). Not part of
# `make test`. Counts requests (not time), so the numbers do not depend on the machine.
#   make bench-operator-idle                    1, 10 and 100 services, 60 s window each
#   OPERATOR_BENCH_ARGS="--no-cache --services 1 10"   every read a request (the old behaviour)

OPERATOR_BENCH_ARGS ?= --services 1 10 100 --window 60

.PHONY: bench-operator-idle

bench-operator-idle: $(STAMP)
	@$(PY) e2e/operator_idle.py $(OPERATOR_BENCH_ARGS) 2>/dev/null
