"""The chart's RBAC rules, and the offline authorizer the integration tests use with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitserve.operator.testing import ApiCall, RbacAttributes, attributes, chart_rules, denied

HELPERS = Path(__file__).resolve().parents[3] / "charts/splitserve/templates/_helpers.tpl"


@pytest.mark.parametrize(
    ("method", "path", "params", "expected"),
    [
        ("GET", "/api/v1/namespaces/ml/pods", {}, RbacAttributes("", "pods", "list", True)),
        (
            "GET",
            "/api/v1/namespaces/ml/pods",
            {"watch": "true"},
            RbacAttributes("", "pods", "watch", True),
        ),
        ("PATCH", "/api/v1/namespaces/ml/pods/p", {}, RbacAttributes("", "pods", "patch", True)),
        (
            "PATCH",
            "/apis/splitserve.io/v1alpha1/namespaces/ml/llmpools/x/status",
            {},
            RbacAttributes("splitserve.io", "llmpools/status", "patch", True),
        ),
        ("GET", "/api/v1/namespaces", {}, RbacAttributes("", "namespaces", "list", False)),
        ("GET", "/apis/apps/v1", {}, None),
    ],
)
def test_attributes(
    method: str, path: str, params: dict[str, str], expected: RbacAttributes | None
) -> None:
    assert attributes(ApiCall(method, path, params)) == expected


def test_chart_grants_what_the_operator_uses_and_no_more() -> None:
    rules = chart_rules(HELPERS)
    ok = [
        ApiCall("PATCH", "/apis/apps/v1/namespaces/ml/deployments/d", {}),
        ApiCall("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {"watch": "1"}),
        ApiCall("DELETE", "/apis/splitserve.io/v1alpha1/namespaces/ml/llmpools/p", {}),
    ]
    assert denied(ok, rules) == []
    refused = [
        ApiCall("DELETE", "/api/v1/namespaces/ml/pods/p", {}),  # pods are the Deployments' job
        ApiCall("GET", "/api/v1/namespaces/ml/secrets", {}),
        ApiCall("DELETE", "/apis/splitserve.io/v1alpha1/namespaces/ml/llmservices/s", {}),
        ApiCall("GET", "/apis/apps/v1/deployments", {}),  # cluster-wide list
    ]
    assert len(denied(refused, rules)) == 4
