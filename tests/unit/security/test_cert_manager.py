"""Internal TLS through cert-manager (`operator run --cert-manager-issuer`): the Certificates the
operator renders, that their names are the ones workers check, that the mode is refused without
cert-manager's CRDs, and that pods mount the Secrets cert-manager writes."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from splitserve.cli.main import cli
from splitserve.operator import certs, handlers, render
from splitserve.operator import reconcile as rc
from splitserve.operator.kube import KubeError, Obj
from splitserve.security import tls
from tests.fakes.kube import FakeWorkers, MemoryKube
from tests.fakes.rbac import RecordingKube, denied

ROOT = Path(__file__).resolve().parents[3]
NS = "ml"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
REF = render.ServiceRef("s", NS, "uid-1")
ISSUER = certs.IssuerRef("internal-ca")


class NoCertManager(MemoryKube):
    """An API server without cert-manager's CRDs: its Certificate paths are 404."""

    def list(self, api_version: str, kind: str, namespace: str, labels: Any = None) -> list[Obj]:
        if api_version == certs.CERT_MANAGER_API:
            raise KubeError(404, "the server could not find the requested resource")
        return super().list(api_version, kind, namespace, labels)


def test_issuer_ref_parsing() -> None:
    assert certs.IssuerRef.parse("internal-ca") == certs.IssuerRef("internal-ca", "ClusterIssuer")
    assert certs.IssuerRef.parse("Issuer/ca") == certs.IssuerRef("ca", "Issuer")
    assert certs.IssuerRef.parse("ClusterIssuer/ca").manifest() == {
        "name": "ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    for bad in ("Secret/ca", "Issuer/", ""):
        with pytest.raises(ValueError, match="expected ClusterIssuer/NAME"):
            certs.IssuerRef.parse(bad)


def test_certificates_name_the_service_and_role_like_the_operators_own() -> None:
    kube = MemoryKube()
    issuer = certs.CertManagerIssuer.start(kube, NS, ISSUER)
    assert issuer.ensure(kube, REF, NOW) == [
        "created Certificate s-tls-router",
        "created Certificate s-tls-worker",
    ]
    assert issuer.ensure(kube, REF, NOW) == []  # idempotent
    assert not [w for w in kube.writes if "Secret" in w]  # cert-manager writes those
    cert = kube.get(certs.CERT_MANAGER_API, "Certificate", NS, "s-tls-worker")
    assert cert is not None
    spec = cert["spec"]
    assert spec["secretName"] == render.tls_secret_name("s", "worker")
    assert spec["uris"] == ["splitserve://s.ml/worker"]
    assert spec["dnsNames"] == ["worker.splitserve.internal"]
    assert spec["issuerRef"] == {
        "name": "internal-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert spec["privateKey"]["rotationPolicy"] == "Always"
    assert cert["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # Another issuer: the Certificates are updated in place.
    other = certs.CertManagerIssuer(certs.IssuerRef("ca", "Issuer"))
    assert other.ensure(kube, REF, NOW) == [
        "patched Certificate s-tls-router",
        "patched Certificate s-tls-worker",
    ]


def _issue_as_cert_manager(spec: dict[str, Any]) -> bytes:
    """What cert-manager's CA issuer makes of a Certificate spec (subject, SANs, usages)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "some CA")])
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, spec["subject"]["organizations"][0]),
            x509.NameAttribute(
                NameOID.ORGANIZATIONAL_UNIT_NAME, spec["subject"]["organizationalUnits"][0]
            ),
            x509.NameAttribute(NameOID.COMMON_NAME, spec["commonName"]),
        ]
    )
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in spec["uris"]]
    sans += [x509.DNSName(d) for d in spec["dnsNames"]]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW)
        .not_valid_after(NOW + dt.timedelta(days=90))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize("role", certs.SERVICE_ROLES)
def test_a_certificate_issued_from_the_spec_names_the_peer_workers_check(role: str) -> None:
    manifest = certs.certificate_manifest(REF, role, ISSUER)
    pem = _issue_as_cert_manager(manifest["spec"])
    assert tls.cert_peer(pem) == tls.Peer("s.ml", role)


def test_the_mode_is_refused_without_cert_managers_crds() -> None:
    with pytest.raises(certs.CertManagerMissingError, match=r"no cert-manager.io/v1 Certificate"):
        certs.CertManagerIssuer.start(NoCertManager(), NS, ISSUER)
    op = handlers.Operator(
        handlers.OperatorConfig(
            kube_factory=NoCertManager, internal_tls_namespace=NS, cert_manager_issuer=ISSUER
        )
    )
    with pytest.raises(certs.CertManagerMissingError, match="install cert-manager"):
        op.pki()


def _service(kube: MemoryKube, name: str) -> None:
    kube.create(
        {
            "apiVersion": "splitserve.io/v1alpha1",
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


def test_reconcile_renders_certificates_and_mounts_their_secrets() -> None:
    kube = MemoryKube()
    _service(kube, "s")
    op = handlers.Operator(
        handlers.OperatorConfig(
            kube_factory=lambda: kube, internal_tls_namespace=NS, cert_manager_issuer=ISSUER
        )
    )
    issuer = op.pki()
    assert isinstance(issuer, certs.CertManagerIssuer)
    out = rc.reconcile(
        kube, FakeWorkers(), NS, "s", rc.Settings(), "2026-01-01T00:00:00Z", pki=issuer
    )
    assert "created Certificate s-tls-worker" in out.actions
    assert kube.get(certs.CERT_MANAGER_API, "Certificate", NS, "s-tls-router") is not None
    for deployment, role in (("s-w", "worker"), (render.router_name("s"), "router")):
        obj = kube.get("apps/v1", "Deployment", NS, deployment)
        assert obj is not None
        spec = obj["spec"]["template"]["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == render.TLS_VOLUME)
        assert volume["secret"]["secretName"] == f"s-tls-{role}"


def test_cli_refuses_cert_manager_without_its_own_certificate_or_internal_tls(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    env = {"SPLITSERVE_NAMESPACE": NS, "SPLITSERVE_TLS_DIR": ""}
    out = runner.invoke(cli, ["operator", "run", "--cert-manager-issuer", "ca"], env=env)
    assert out.exit_code == 2
    assert "comes from --tls-dir" in out.output
    out = runner.invoke(
        cli,
        ["operator", "run", "--no-internal-tls", "--cert-manager-issuer", "ca"],
        env=env,
    )
    assert out.exit_code == 2
    assert "--cert-manager-issuer needs --internal-tls" in out.output
    out = runner.invoke(cli, ["operator", "run", "--cert-manager-issuer", "Secret/x"], env=env)
    assert out.exit_code == 2
    assert "expected ClusterIssuer/NAME" in out.output


def test_the_chart_in_cert_manager_mode_grants_what_the_operator_calls() -> None:
    helm = ROOT / ".venv/bin/helm"
    if not helm.exists():
        pytest.skip("helm is not installed (make helm)")
    out = subprocess.run(
        [
            *(str(helm), "template", "t", str(ROOT / "charts/splitserve"), "--namespace", NS),
            *("--set", "operator.certManager.enabled=true"),
            *("--set", "operator.certManager.issuerRef.name=internal-ca"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    roles: dict[str, list[dict[str, Any]]] = {"cluster": [], "namespace": []}
    for doc in docs:
        if doc["kind"] in ("Role", "ClusterRole"):
            roles["cluster" if doc["kind"] == "ClusterRole" else "namespace"] += doc["rules"]
    kube = RecordingKube(MemoryKube())
    _service(kube.inner, "s")  # type: ignore[arg-type]
    issuer = certs.CertManagerIssuer.start(kube, NS, ISSUER)
    rc.reconcile(kube, FakeWorkers(), NS, "s", rc.Settings(), "2026-01-01T00:00:00Z", pki=issuer)
    rc.reconcile(kube, FakeWorkers(), NS, "s", rc.Settings(), "2026-01-01T00:00:00Z", pki=issuer)
    certificate_calls = [c for c in kube.calls if "cert-manager.io" in c.path]
    assert certificate_calls  # the check at start, then the service's Certificates
    assert denied(certificate_calls, roles) == []
    assert not [c for c in kube.calls if "/secrets" in c.path]  # no Secret read or written
    # The service deleted: its Certificates, then the Secrets cert-manager wrote for them.
    kube.calls.clear()
    svc = kube.inner.get("splitserve.io/v1alpha1", "LLMService", NS, "s")
    assert svc is not None
    certs.delete_cert_manager_secrets(kube, render.ServiceRef("s", NS, svc["metadata"]["uid"]))
    assert [c.method for c in kube.calls if c.method == "DELETE"] == ["DELETE"] * 4
    assert denied(kube.calls, roles) == []
    # The operator's own certificate, mounted where SPLITSERVE_TLS_DIR points.
    own = next(d for d in docs if d["kind"] == "Certificate")
    assert own["spec"]["uris"] == [f"splitserve://{certs.OPERATOR_SERVICE}/operator"]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--cert-manager-issuer=ClusterIssuer/internal-ca" in container["args"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["SPLITSERVE_TLS_DIR"] == mounts["internal-tls"]
    volume = next(v for v in pod["volumes"] if v["name"] == "internal-tls")
    assert volume["secret"]["secretName"] == own["spec"]["secretName"]
