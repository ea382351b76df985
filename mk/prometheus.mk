# Prometheus rules: promtool syntax check and rule unit tests. promtool comes from Debian's
# `prometheus` package, installed here when missing (CI runs as root on a clean machine).
PROMTOOL ?= promtool
RULES    := deploy/prometheus/splitserve-rules.yaml
RULES_T  := deploy/prometheus/splitserve-rules.test.yaml

.PHONY: promtool rules-check
promtool:
	@command -v $(PROMTOOL) >/dev/null 2>&1 || { \
	  echo "installing prometheus (for promtool) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

rules-check: promtool
	$(PROMTOOL) check rules $(RULES)
	$(PROMTOOL) test rules $(RULES_T)

CHECKS += rules-check
