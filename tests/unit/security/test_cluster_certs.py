"""The operator's internal TLS: CA Secret, per-service Secrets, renewal, and what render mounts."""

from __future__ import annotations

import base64
import datetime as dt
import os
from pathlib import Path
from typing import Any

from cryptography import x509

from splitserve.api import v1alpha1 as v1
from splitserve.operator import certs, render
from splitserve.security import tls
from tests.fakes.kube import MemoryKube

NS = "ml"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
REF = render.ServiceRef("s", NS, "uid-1")


def _data(kube: MemoryKube, name: str, key: str) -> bytes:
    secret = kube.get("v1", "Secret", NS, name)
    assert secret is not None
    return base64.b64decode(secret["data"][key])


def test_ca_created_once_and_reloaded(tmp_path: Path) -> None:
    kube = MemoryKube()
    first = certs.Pki.load_or_create(kube, NS, tmp_path / "a", NOW)
    again = certs.Pki.load_or_create(kube, NS, tmp_path / "b", NOW)
    assert first.ca.cert_pem() == again.ca.cert_pem()
    assert [w for w in kube.writes if "Secret" in w] == [f"CREATE Secret {certs.CA_SECRET}"]
    own = tls.cert_peer((tmp_path / "a" / "tls.crt").read_bytes())
    assert own == tls.Peer(certs.OPERATOR_SERVICE, "operator")
    assert (tmp_path / "a" / "tls.key").stat().st_mode & 0o077 == 0


def test_service_secrets_name_the_service_and_renew(tmp_path: Path) -> None:
    kube = MemoryKube()
    pki = certs.Pki.load_or_create(kube, NS, tmp_path / "op", NOW)
    assert pki.ensure(kube, REF, NOW) == [
        "created Secret s-tls-router",
        "created Secret s-tls-worker",
    ]
    assert pki.ensure(kube, REF, NOW) == []  # idempotent
    secret = kube.get("v1", "Secret", NS, "s-tls-worker")
    assert secret is not None
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    cert = _data(kube, "s-tls-worker", "tls.crt")
    assert tls.cert_peer(cert) == tls.Peer("s.ml", "worker")
    assert _data(kube, "s-tls-worker", "ca.crt") == pki.ca.cert_pem()
    # Two thirds of 90 days later: renewed in place (the kubelet updates the mounted files).
    later = NOW + dt.timedelta(days=61)
    assert pki.ensure(kube, REF, later) == [
        "renewed Secret s-tls-router",
        "renewed Secret s-tls-worker",
    ]
    renewed = x509.load_pem_x509_certificate(_data(kube, "s-tls-worker", "tls.crt"))
    assert renewed.not_valid_after_utc > later + dt.timedelta(days=80)
    # Signed by another CA (the CA Secret was replaced): re-issued.
    other = certs.Pki.load_or_create(MemoryKube(), NS, tmp_path / "op2", NOW)
    assert other.ensure(kube, REF, later) == [
        "renewed Secret s-tls-router",
        "renewed Secret s-tls-worker",
    ]
    # The operator's own identity renews too.
    assert not pki.refresh_own(NOW)
    assert pki.refresh_own(later)


def _spec(**extra: Any) -> v1.LLMServiceSpec:
    return v1.LLMServiceSpec.model_validate(
        {
            "model": {"name": "m", "source": "org/m"},
            "engine": {"kind": "sim", "image": "img:1", "metricsPort": 50052},
            "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
            "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
            **extra,
        }
    )


def _by_kind(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_render_mounts_certificates_and_probes_the_health_port() -> None:
    objs = render.render(_spec(), render.Observed(service=REF))
    worker = _by_kind(objs, "Deployment", "s-w")["spec"]["template"]["spec"]
    container = worker["containers"][0]
    # 50052 is the metrics port here: the health port is the next free one.
    assert "--health-port=50053" in container["args"]
    assert container["readinessProbe"]["grpc"] == {"port": 50053}
    assert container["startupProbe"]["grpc"] == {"port": 50053}
    assert {"name": "SPLITSERVE_TLS_DIR", "value": render.TLS_DIR} in container["env"]
    assert {"name": "internal-tls", "mountPath": render.TLS_DIR, "readOnly": True} in container[
        "volumeMounts"
    ]
    volume = next(v for v in worker["volumes"] if v["name"] == "internal-tls")
    assert volume["secret"]["secretName"] == "s-tls-worker"
    router = _by_kind(objs, "Deployment", "s-router")["spec"]["template"]["spec"]
    volume = next(v for v in router["volumes"] if v["name"] == "internal-tls")
    assert volume["secret"]["secretName"] == "s-tls-router"
    assert {"name": "SPLITSERVE_TLS_DIR", "value": render.TLS_DIR} in router["containers"][0]["env"]


def test_render_without_internal_tls_probes_the_grpc_port() -> None:
    objs = render.render(_spec(), render.Observed(service=REF, internal_tls=False))
    for obj in objs:
        assert "tls-" not in str(obj.get("spec", {}).get("template", {}))
    container = _by_kind(objs, "Deployment", "s-w")["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["grpc"] == {"port": 50051}
    assert not any(a.startswith("--health-port") for a in container["args"])


def test_identity_follows_a_kubelet_style_symlink_swap(tmp_path: Path) -> None:
    """The kubelet swaps a `..data` symlink to a new timestamped directory on Secret update."""
    kube = MemoryKube()
    pki = certs.Pki.load_or_create(kube, NS, tmp_path / "op", NOW)
    pki.ensure(kube, REF, NOW)
    mount = tmp_path / "mount"
    mount.mkdir()

    def publish(version: str) -> None:
        target = mount / version
        target.mkdir()
        for key in ("ca.crt", "tls.crt", "tls.key"):
            (target / key).write_bytes(_data(kube, "s-tls-worker", key))
        tmp = mount / "..data_tmp"
        tmp.symlink_to(version)
        os.replace(tmp, mount / "..data")

    publish("..v1")
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (mount / key).symlink_to(Path("..data") / key)
    ident = tls.Identity(mount)
    before = ident.cert
    pki.ensure(kube, REF, NOW + dt.timedelta(days=61))
    publish("..v2")
    ident._checked = float("-inf")  # skip the at-most-once-a-second wait
    assert ident.changed()
    assert ident.cert != before
    assert ident.cert == _data(kube, "s-tls-worker", "tls.crt")
