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

# The chart's monitoring objects: lint with them on; the dashboards ConfigMaps (and the operator
# Deployment with its scrape annotations) through kubernetes-validate. PodMonitor / ServiceMonitor
# are Prometheus Operator CRDs whose schemas are not available offline: tests/unit/obs/
# test_chart_monitoring.py checks their rendered fields instead.
.PHONY: monitoring-check
monitoring-check: $(STAMP) helm  # the phony target: $(HELM) is set by operator.mk, read later
	$(HELM) lint --strict $(CHART) --set monitoring.podMonitor.enabled=true \
	  --set monitoring.serviceMonitor.enabled=true --set monitoring.dashboards.enabled=true >/dev/null
	@mkdir -p $(K8S_TMP)
	$(HELM) template splitserve $(CHART) --namespace splitserve-system --kube-version $(K8S_VERSION) \
	  --set monitoring.dashboards.enabled=true > $(K8S_TMP)/monitoring.yaml
	$(VENV)/bin/kubernetes-validate --quiet --strict -k $(K8S_VERSION) $(K8S_TMP)/monitoring.yaml
	@echo "monitoring-check: ok"

CHECKS += monitoring-check
