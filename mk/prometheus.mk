# Prometheus rules: promtool syntax check and rule unit tests; the local-stack integration test
# runs a real `prometheus` too. Where the binaries come from, in order:
#   1. `promtool` / `prometheus` on PATH;
#   2. `.tools/prometheus/usr/bin/`: Debian's `prometheus` package unpacked inside the project,
#      no root needed (`apt-get download` + `dpkg-deb -x`, ~19 MB, a few seconds);
#   3. as root (CI): `apt-get install prometheus`;
#   4. otherwise the promtool checks are skipped with a message saying why and how to get them
#      (the Prometheus integration test skips too, outside CI; in CI it fails instead).
PROM_TOOLS := .tools/prometheus
PROMTOOL_NAME ?= promtool
PROM_BIN   := $(PROM_TOOLS)/usr/bin
RULES      := deploy/prometheus/splitserve-rules.yaml
RULES_T    := deploy/prometheus/splitserve-rules.test.yaml

.PHONY: promtool rules-check
promtool:
	@if command -v $(PROMTOOL_NAME) >/dev/null 2>&1 || [ -x $(PROM_BIN)/promtool ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing prometheus (for promtool) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus >/dev/null && exit 0; \
	fi; \
	if command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then \
	  echo "unpacking Debian's prometheus package into $(PROM_TOOLS) (no root needed)"; \
	  rm -rf $(PROM_TOOLS) && mkdir -p $(PROM_TOOLS)/deb && \
	  (cd $(PROM_TOOLS)/deb && apt-get download -qq prometheus >/dev/null 2>&1) && \
	  dpkg-deb -x $(PROM_TOOLS)/deb/prometheus_*.deb $(PROM_TOOLS) && rm -rf $(PROM_TOOLS)/deb && \
	  exit 0; \
	  rm -rf $(PROM_TOOLS); \
	fi; \
	echo "SKIPPED promtool checks: no promtool on PATH, not root, and Debian's prometheus package"; \
	echo "  could not be downloaded (no apt-get/dpkg-deb, or no apt package lists)."; \
	echo "  Get promtool from https://prometheus.io/download/ onto PATH to run them (CI does)."

rules-check: promtool
	@PROMTOOL=$$(command -v $(PROMTOOL_NAME) || echo $(PROM_BIN)/promtool); \
	if [ ! -x "$$PROMTOOL" ]; then echo "SKIPPED rules-check (no promtool, see above)"; exit 0; fi; \
	echo "$$PROMTOOL check rules $(RULES)" && $$PROMTOOL check rules $(RULES) && \
	echo "$$PROMTOOL test rules $(RULES_T)" && $$PROMTOOL test rules $(RULES_T)

CHECKS += rules-check
# The integration test finds prometheus on PATH or here.
export SPLITSERVE_PROMETHEUS_BIN_DIR := $(abspath $(PROM_BIN))
TEST_DEPS += promtool
