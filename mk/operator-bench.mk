# API requests of an idle operator per service, on the kmock emulator (issue 15). Not part of
# `make test`. Counts requests (not time), so the numbers do not depend on the machine; each N
# waits for the idle state at most --settle-timeout seconds (the row says so if it is not
# reached), then counts for --window seconds.
#   make bench-operator-idle                    1, 10 and 100 services, 60 s window each
#   OPERATOR_BENCH_ARGS="--no-cache --services 1 10"   every read a request (the old behaviour)
# On a shared machine: flock <lock> timeout 900 make bench-operator-idle

OPERATOR_BENCH_ARGS ?= --services 1 10 100 --window 60 --settle-timeout 300

.PHONY: bench-operator-idle

bench-operator-idle: $(STAMP)
	@$(PY) e2e/operator_idle.py $(OPERATOR_BENCH_ARGS)
