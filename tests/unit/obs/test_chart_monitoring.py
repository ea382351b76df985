"""The chart's monitoring: operator scrape annotations and /metrics port, PodMonitor and
ServiceMonitor (off by default), and the dashboards ConfigMaps (rendered with `helm template`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from splitserve.obs.dashboards import DASHBOARDS

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts/splitserve"


def _helm() -> str:
    local = ROOT / ".venv/bin/helm"
    found = str(local) if local.exists() else shutil.which("helm")
    if found is None:
        pytest.skip("helm is not installed (make helm)")
    return found


def render(*sets: str) -> list[dict[str, Any]]:
    args = [_helm(), "template", "s", str(CHART), "--namespace", "ns"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_defaults_scrape_the_operator_and_create_no_monitor() -> None:
    docs = render()
    assert not kinds(docs, "PodMonitor")
    assert not kinds(docs, "ServiceMonitor")
    assert not kinds(docs, "ConfigMap")
    (deploy,) = kinds(docs, "Deployment")
    pod = deploy["spec"]["template"]
    assert pod["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8081",
        "prometheus.io/path": "/metrics",
    }
    (container,) = pod["spec"]["containers"]
    assert "--metrics-port=8081" in container["args"]
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in container["ports"]


def test_pod_annotations_merge_with_scrape_annotations() -> None:
    docs = render("operator.podAnnotations.team=ml", "monitoring.scrapeAnnotations=false")
    (deploy,) = kinds(docs, "Deployment")
    assert deploy["spec"]["template"]["metadata"]["annotations"] == {"team": "ml"}


def test_monitors_and_dashboards_when_enabled() -> None:
    docs = render(
        "monitoring.podMonitor.enabled=true",
        "monitoring.podMonitor.labels.release=kps",
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.serviceMonitor.interval=30s",
        "monitoring.dashboards.enabled=true",
        "operator.watchNamespaces={a,b}",
    )
    (pm,) = kinds(docs, "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["labels"]["release"] == "kps"
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "splitserve"}
    assert pm["spec"]["selector"]["matchExpressions"][0]["values"] == ["operator", "worker"]
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["a", "b", "ns"]}
    assert pm["spec"]["podMetricsEndpoints"] == [
        {
            "port": "metrics",
            "path": "/metrics",
            "interval": "15s",
            # workers carry their LLMService as `service`, like the routers' ServiceMonitor targets
            "relabelings": [
                {
                    "sourceLabels": ["__meta_kubernetes_pod_label_splitserve_io_service"],
                    "targetLabel": "service",
                }
            ],
        }
    ]
    (sm,) = kinds(docs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    maps = kinds(docs, "ConfigMap")
    assert len(maps) == len(DASHBOARDS)
    shipped = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, text),) = cm["data"].items()
        shipped[name] = json.loads(text)
    assert shipped == {
        f"{n}.json": json.loads((ROOT / "deploy/grafana" / f"{n}.json").read_text())
        for n in DASHBOARDS
    }


def test_all_namespaces_monitors_select_any_namespace() -> None:
    docs = render("operator.allNamespaces=true", "monitoring.podMonitor.enabled=true")
    (pm,) = kinds(docs, "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"any": True}


def test_unknown_monitoring_value_is_refused() -> None:
    args = [_helm(), "template", "s", str(CHART), "--set", "monitoring.podMonitor.bogus=1"]
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode != 0
    assert "bogus" in result.stderr


def test_autoscaling_examples_name_exported_series() -> None:
    """KEDA / prometheus-adapter examples query series the code exports."""
    from tests.unit.obs.test_metrics_registry import SERIES, exported

    texts = [
        (ROOT / "deploy/examples/keda-router.yaml").read_text(),
        (ROOT / "deploy/examples/keda-decode.yaml").read_text(),
        (ROOT / "deploy/prometheus/adapter-values.yaml").read_text(),
    ]
    for text in texts:
        assert yaml.safe_load(text)
    named = {s for t in texts for s in SERIES.findall(t)}
    assert "splitserve_router_admission_total" in named
    unknown = named - exported() - {"splitserve_router_arrivals_per_second"}  # adapter's alias
    assert not unknown, unknown
