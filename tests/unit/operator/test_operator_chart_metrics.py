"""The chart runs the operator with the control loop's `/metrics` on (`--metrics-port`), exposes
the port and annotates the pod for scraping; a user's pod annotations are kept (and win)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]


def _deployment(*sets: str) -> dict[str, Any]:
    local = ROOT / ".venv/bin/helm"
    helm = str(local) if local.exists() else shutil.which("helm")
    if helm is None:
        pytest.skip("helm is not installed (make helm)")
    args = [helm, "template", "x", str(ROOT / "charts/splitserve")]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return next(d for d in yaml.safe_load_all(out) if d and d.get("kind") == "Deployment")


def test_operator_serves_loop_metrics_on_8081() -> None:
    pod = _deployment()["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert "--metrics-port=8081" in container["args"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == 8081
    assert ports["health"] == 8080
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == "8081"
    assert notes["prometheus.io/path"] == "/metrics"


def test_port_and_user_annotations_are_values() -> None:
    pod = _deployment("monitoring.operatorMetricsPort=9100", "operator.podAnnotations.team=ml")[
        "spec"
    ]["template"]
    container = pod["spec"]["containers"][0]
    assert "--metrics-port=9100" in container["args"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == 9100
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/port"] == "9100"
    assert notes["team"] == "ml"


def test_readiness_probes_the_operators_healthz_liveness_stays_kopfs() -> None:
    """`/healthz` on the metrics port is 503 while start-up fails: a readiness probe (the pod is
    not ready, not restarted); the liveness probe stays on kopf's endpoint (`--liveness`)."""
    container = _deployment()["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
