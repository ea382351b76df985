# The k8s-marked tests against the cluster $KUBECONFIG names (docs/install.md, "Running the
# integration tests against a real cluster"). Not part of `make test`.
#   make test-real KUBECONFIG=~/.kube/config [SPLITSERVE_IMAGE=repo/splitserve:tag]
# Each test runs where it can and skips, saying why, where it cannot: the chart end-to-end test
# needs schedulable nodes; the operator tests that fake the workers need a control plane without
# nodes; the router-discovery tests need a Ready node.

REAL_TEST_PATHS ?= tests/integration/operator tests/integration/router_discovery

.PHONY: test-real

test-real: $(STAMP)
	@test -n "$(KUBECONFIG)" || { echo "test-real: set KUBECONFIG to the cluster to test"; exit 2; }
	KUBECONFIG="$(KUBECONFIG)" TARGET=real $(PY) -m pytest -m k8s -rs $(REAL_TEST_PATHS) $(PYTEST_ARGS)
