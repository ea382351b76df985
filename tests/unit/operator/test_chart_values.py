"""The chart's values: what a real API server or the operator would refuse, or what the chart
would leave unused, is refused at `helm install` (values.schema.json, generated from
`splitserve.api.chart.ChartValues`), naming the value."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.api.chart import ChartValues

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "charts/splitserve/values.schema.json").read_text())


def _schema_errors(values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [
        "/".join(str(p) for p in e.absolute_path) + ": " + e.message
        for e in validator.iter_errors(values)
    ]


@pytest.mark.parametrize(
    "namespaces",
    [["team-a", "team-a"], ["Team_A"], [""], ["a" * 64], ["team-a."]],
    ids=["duplicate", "uppercase", "empty", "too-long", "dot"],
)
def test_watch_namespaces_must_be_distinct_namespace_names(namespaces: list[str]) -> None:
    """A duplicate renders the same Role twice (the install fails half-way); a name that is
    no namespace's renders a Role the API server refuses and an operator watching nothing."""
    values = {"operator": {"watchNamespaces": namespaces}}
    errors = _schema_errors(values)
    assert errors
    assert all(e.startswith("operator/watchNamespaces") for e in errors), errors
    with pytest.raises(ValidationError, match="watchNamespaces"):
        ChartValues.model_validate(values)


def test_watch_namespaces_take_namespace_names() -> None:
    values = {"operator": {"watchNamespaces": ["team-a", "0ps", "b" * 63]}}
    assert _schema_errors(values) == []
    assert ChartValues.model_validate(values).operator.watch_namespaces == [
        "team-a",
        "0ps",
        "b" * 63,
    ]


def _helm() -> str:
    local = ROOT / ".venv/bin/helm"
    helm = str(local) if local.exists() else shutil.which("helm")
    if helm is None:
        pytest.skip("helm is not installed (make helm)")
    return helm


def _template(*sets: str) -> subprocess.CompletedProcess[str]:
    args = [_helm(), "template", "x", str(ROOT / "charts/splitserve"), "--namespace", "ops"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


CONTRADICTIONS = {
    "watch-list-and-all": (
        ("operator.allNamespaces=true", "operator.watchNamespaces={team-a}"),
        {"operator": {"allNamespaces": True, "watchNamespaces": ["team-a"]}},
        "operator.watchNamespaces",
    ),
    "cert-manager-without-tls": (
        ("operator.internalTls=false", "operator.certManager.enabled=true"),
        {"operator": {"internalTls": False, "certManager": {"enabled": True}}},
        "operator.certManager.enabled",
    ),
    # Found by the operator probe: both rendered.
    "issuer-without-cert-manager": (  # the issuer was unused
        ("operator.certManager.issuerRef.name=ca",),
        {"operator": {"certManager": {"issuerRef": {"name": "ca"}}}},
        "operator.certManager.issuerRef",
    ),
    "no-account-named": (  # the operator's roles were bound to the namespace's `default` account
        ("serviceAccount.create=false",),
        {"serviceAccount": {"create": False}},
        "serviceAccount.name",
    ),
    "one-port-twice": (
        ("operator.metricsPort=9000", "monitoring.operatorMetricsPort=9000"),
        {"operator": {"metricsPort": 9000}, "monitoring": {"operatorMetricsPort": 9000}},
        "operator.metricsPort",
    ),
}


@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
def test_values_that_contradict_each_other_are_refused_naming_them(case: str) -> None:
    """Each pair was rendered with one of its values unused (the watch list under
    allNamespaces, cert-manager without internal TLS) or into an operator that cannot start
    (liveness and /metrics on one port: the second bind fails)."""
    sets, values, named = CONTRADICTIONS[case]
    with pytest.raises(ValidationError, match=named.split(".")[-1]):
        ChartValues.model_validate(values)
    out = _template(*sets)
    assert out.returncode != 0, out.stdout
    assert named in out.stderr, out.stderr


@pytest.mark.parametrize("name_override", ["", "llm"])
def test_operator_pods_match_the_default_network_policy_and_pod_monitor(
    name_override: str,
) -> None:
    """Workers admit the operator by `networkPolicy.operatorLabels` (default
    `app.kubernetes.io/name: splitserve`, component operator) and the PodMonitor selects the same
    name: `nameOverride` renames objects, never those labels (else every flip's RPC is
    dropped by the workers' NetworkPolicy and the operator goes unscraped)."""
    out = _template(f"nameOverride={name_override}", "monitoring.podMonitor.enabled=true")
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert v1.NetworkPolicySpec().operator_labels.items() <= labels.items()
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")["spec"]["selector"]
    assert monitor["matchLabels"].items() <= labels.items()
    if name_override:
        assert deployment["metadata"]["name"] == f"x-{name_override}"


@pytest.mark.parametrize("image", [" ", "reg/router 1"])
def test_a_router_image_with_whitespace_is_refused(image: str) -> None:
    """Found by the operator probe: `operator.routerImage=" "` rendered `--router-image= `,
    which the operator refuses at start (a crash loop) and would have put in every router
    Deployment before."""
    with pytest.raises(ValidationError, match=r"router_image|routerImage"):
        ChartValues.model_validate({"operator": {"routerImage": image}})
    out = _template(f"operator.routerImage={image}")
    assert out.returncode != 0, out.stdout
    assert "routerImage" in out.stderr, out.stderr
