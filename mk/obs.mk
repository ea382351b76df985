# Observability: Grafana dashboards generated from splitserve.obs.dashboards (grafana-foundation-sdk).
#   make gen-dashboards     write deploy/grafana/*.json and charts/splitserve/dashboards/*.json
#   make dashboards-check   fail when the committed JSON differs from the generator (CI, `make test`)

.PHONY: gen-dashboards dashboards-check
gen-dashboards: $(STAMP)
	$(VENV)/bin/splitserve gen dashboards

dashboards-check: $(STAMP)
	$(VENV)/bin/splitserve gen dashboards --check

CHECKS += dashboards-check

# The obs extra (grafana-foundation-sdk, opentelemetry-sdk, matplotlib) is part of the dev venv.
EXTRAS := $(EXTRAS),obs
