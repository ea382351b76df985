"""Internal TLS through the API server (kmock by default): the operator's CA Secret, each
service's certificate Secrets, and the worker and router pods that mount them."""

from __future__ import annotations

import base64
import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.kube import FakeWorkers
from tests.integration.operator.conftest import TARGET

from splitserve.api import v1alpha1 as v1
from splitserve.operator import certs, render
from splitserve.operator import reconcile as rc
from splitserve.operator.kube import RestKube
from splitserve.security import tls

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

NS = "default"


@pytest.mark.skipif(TARGET != "kmock", reason="creates the operator's CA Secret")
def test_reconcile_issues_and_mounts_certificates(kube: RestKube, tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    name = f"tls-{uuid.uuid4().hex[:6]}"
    kube.create(
        {
            "apiVersion": v1.API_VERSION,
            "kind": "LLMService",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "model": {"name": "m", "source": "org/m"},
                "engine": {"kind": "sim", "image": "img:1"},
                "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
                "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
                "scaling": {"mode": "Manual"},
            },
        }
    )
    pki = certs.Pki.load_or_create(kube, NS, tmp_path / "op", now)
    stamp = now.strftime(rc.RFC3339)
    out = rc.reconcile(kube, FakeWorkers(), NS, name, rc.Settings(), stamp, pki=pki)
    assert f"created Secret {name}-tls-worker" in out.actions
    again = rc.reconcile(kube, FakeWorkers(), NS, name, rc.Settings(), stamp, pki=pki)
    assert not [a for a in again.actions if "Secret" in a]
    # The CA survives an operator restart: a second Pki reads the same one back.
    assert certs.Pki.load_or_create(kube, NS, tmp_path / "op2", now).ca.cert_pem() == (
        pki.ca.cert_pem()
    )
    secret: Any = kube.get("v1", "Secret", NS, f"{name}-tls-worker")
    assert secret["type"] == "kubernetes.io/tls"
    cert = base64.b64decode(secret["data"]["tls.crt"])
    assert tls.cert_peer(cert) == tls.Peer(f"{name}.{NS}", "worker")
    for deployment, role in ((f"{name}-w", "worker"), (render.router_name(name), "router")):
        pod = kube.get("apps/v1", "Deployment", NS, deployment)
        assert pod is not None
        spec = pod["spec"]["template"]["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == render.TLS_VOLUME)
        assert volume["secret"]["secretName"] == f"{name}-tls-{role}"
        env = spec["containers"][0]["env"]
        assert {"name": "SPLITSERVE_TLS_DIR", "value": render.TLS_DIR} in env
