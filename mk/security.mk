# Static security scan of what we ship to clusters (docs/security.md, "Static scan").
#   make security-scan   checkov over the operator's render of every deploy/examples/llmservice-*
#                        and over `helm template` of the chart (when helm is there: `make helm`)
# About 10 s once checkov is installed (the first run installs it: a few minutes).
# checkov runs from its own venv (.venv-checkov, pinned), so its dependencies never meet the
# project's. Accepted findings are skipped by id below and justified in docs/security.md.

CHECKOV_VENV    := .venv-checkov
CHECKOV_VERSION := 3.3.30
CHECKOV         := $(CHECKOV_VENV)/bin/checkov
SCAN_DIR        := out/security-scan
# Accepted (docs/security.md, "Accepted findings").
CHECKOV_SKIP    := CKV_K8S_8,CKV_K8S_9,CKV_K8S_10,CKV_K8S_11,CKV_K8S_12,CKV_K8S_13,CKV_K8S_14,CKV_K8S_15,CKV_K8S_21,CKV_K8S_25,CKV_K8S_35,CKV_K8S_38,CKV_K8S_43,CKV2_K8S_6

CHECKS += security-scan

.PHONY: security-scan

$(CHECKOV_VENV)/.installed:
	python3 -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q checkov==$(CHECKOV_VERSION)
	touch $@

security-scan: $(STAMP) $(CHECKOV_VENV)/.installed helm
	@rm -rf $(SCAN_DIR) && mkdir -p $(SCAN_DIR)
	@for f in deploy/examples/llmservice-*.yaml; do \
	  $(PY) -m splitserve operator render -f $$f > $(SCAN_DIR)/$$(basename $$f) || exit 1; \
	done
	$(HELM) template splitserve $(CHART) --namespace splitserve-system > $(SCAN_DIR)/chart.yaml
	$(CHECKOV) --quiet --compact --skip-download --framework kubernetes -d $(SCAN_DIR) --skip-check $(CHECKOV_SKIP)
