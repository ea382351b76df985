# The chaos suite at full size (issue 12 item 6): 1,000 streaming requests at concurrency 24 over
# `splitserve up --prefill 2 --decode 2` plus a second router replica, with SIGKILL and SIGSTOP of
# prefill and decode workers and a router restart; every stream checked token by token against a
# fault-free run (tests/integration/chaos.py). The CI-size run is part of `make test`
# (tests/integration/test_chaos.py). Figures: docs/reliability.md. About 4-5 minutes.

CHAOS_REQUESTS    ?= 1000
CHAOS_CONCURRENCY ?= 24
CHAOS_DURATION_S  ?= 90
CHAOS_STOP_S      ?= 10
CHAOS_DIR         ?= .chaos

.PHONY: chaos
chaos: $(STAMP)
	@mkdir -p $(CHAOS_DIR)
	$(PY) -m tests.integration.chaos --requests $(CHAOS_REQUESTS) \
	  --concurrency $(CHAOS_CONCURRENCY) --duration-s $(CHAOS_DURATION_S) --stop-s $(CHAOS_STOP_S) \
	  --run-dir $(CHAOS_DIR)/run --report $(CHAOS_DIR)/report.json
