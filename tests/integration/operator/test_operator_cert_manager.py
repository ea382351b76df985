"""Internal TLS from cert-manager through the API server (kmock by default): the operator checks
that Certificates are served, renders each service's router and worker Certificates (owned by the
service, idempotent) and mounts the Secrets they name in the worker and router pods.

kmock stores a Certificate as a generic custom resource: cert-manager's controller is not there,
so no Secret is issued and this shows the API path only. With `TARGET=real` (a cluster with
cert-manager and a CA issuer named by `SPLITSERVE_TEST_ISSUER`, e.g. `ClusterIssuer/internal-ca`)
the test also waits for cert-manager to write the worker Secret and checks the identity its
certificate names.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import time
import uuid
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


def _issuer() -> certs.IssuerRef:
    if TARGET == "kmock":
        return certs.IssuerRef("internal-ca")
    value = os.environ.get("SPLITSERVE_TEST_ISSUER", "")
    if not value:
        pytest.skip("TARGET=real: set SPLITSERVE_TEST_ISSUER to a cert-manager CA issuer")
    return certs.IssuerRef.parse(value)


def test_reconcile_renders_certificates_and_mounts_their_secrets(kube: RestKube) -> None:
    issuer = certs.CertManagerIssuer.start(kube, NS, _issuer())
    name = f"cm-{uuid.uuid4().hex[:6]}"
    svc = kube.create(
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
    try:
        stamp = dt.datetime.now(dt.UTC).strftime(rc.RFC3339)
        out = rc.reconcile(kube, FakeWorkers(), NS, name, rc.Settings(), stamp, pki=issuer)
        assert f"created Certificate {name}-tls-worker" in out.actions
        assert f"created Certificate {name}-tls-router" in out.actions
        again = rc.reconcile(kube, FakeWorkers(), NS, name, rc.Settings(), stamp, pki=issuer)
        assert not [a for a in again.actions if "Certificate" in a]
        cert: Any = kube.get(certs.CERT_MANAGER_API, "Certificate", NS, f"{name}-tls-worker")
        assert cert["spec"]["uris"] == [f"splitserve://{name}.{NS}/worker"]
        assert cert["metadata"]["ownerReferences"][0]["uid"] == svc["metadata"]["uid"]
        for deployment, role in ((f"{name}-w", "worker"), (render.router_name(name), "router")):
            obj = kube.get("apps/v1", "Deployment", NS, deployment)
            assert obj is not None
            spec = obj["spec"]["template"]["spec"]
            volume = next(v for v in spec["volumes"] if v["name"] == render.TLS_VOLUME)
            assert volume["secret"]["secretName"] == f"{name}-tls-{role}"
        if TARGET != "kmock":  # cert-manager's controller issues the Secret
            deadline = time.monotonic() + 120
            secret = None
            while secret is None or "tls.crt" not in (secret.get("data") or {}):
                assert time.monotonic() < deadline, "cert-manager wrote no Secret in 120 s"
                time.sleep(2)
                secret = kube.get("v1", "Secret", NS, f"{name}-tls-worker", live=True)
            pem = base64.b64decode(secret["data"]["tls.crt"])
            assert tls.cert_peer(pem) == tls.Peer(f"{name}.{NS}", "worker")
    finally:
        kube.delete(v1.API_VERSION, "LLMService", NS, name)
