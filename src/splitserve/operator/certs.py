"""Internal TLS in a cluster: the operator's CA, its own identity, and each service's
certificates (docs/security.md, "Internal TLS").

- The CA lives in one Secret, `splitserve-internal-ca` in the operator's namespace (created by
  the first operator that finds none; `ca.crt` and `ca.key`). Only the operator reads it.
- The operator's own identity (role `operator`) is issued from it at start and written to a
  private directory that `security.tls` reads (re-issued before it expires).
- Every `LLMService` gets two `kubernetes.io/tls` Secrets in its namespace,
  `<service>-tls-router` and `<service>-tls-worker` (`ca.crt`, `tls.crt`, `tls.key`, owned by
  the service, so they go with it), whose certificates name the service as
  `<name>.<namespace>`; workers accept callers of their own service and the operator only.
  Rendered pods mount them (`render.TLS_DIR`) and set `SPLITSERVE_TLS_DIR`.
- Rotation: a certificate with less than a third of its validity left, or signed by another CA,
  is re-issued (the Secret is patched); the kubelet updates the mounted files and the processes
  re-read them (`security.tls.Identity`), without a restart.

Certificates are random by nature, so issuing is I/O here, not part of the pure `render`.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography import x509

from splitserve.operator import render
from splitserve.operator.kube import Kube, KubeError, Obj, apply, owned_by
from splitserve.security.ca import CA_FILE, CERT_FILE, KEY_FILE, Authority, role_dns, role_uri

log = logging.getLogger(__name__)

CA_SECRET: Final = "splitserve-internal-ca"
CA_KEY_FILE: Final = "ca.key"
CA_DAYS: Final = 3650
LEAF_DAYS: Final = 90
OPERATOR_SERVICE: Final = "splitserve-operator"
"""The service the operator's own certificate names (workers accept role `operator` from any
service of their CA)."""
SERVICE_ROLES: Final = ("router", "worker")


def service_identity(ref: render.ServiceRef) -> str:
    """The service a certificate names: `<name>.<namespace>` (names repeat across namespaces)."""
    return f"{ref.name}.{ref.namespace}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(obj: Obj, key: str) -> bytes | None:
    value = (obj.get("data") or {}).get(key)
    return base64.b64decode(value) if isinstance(value, str) else None


def needs_renewal(cert_pem: bytes, now: dt.datetime) -> bool:
    """Less than a third of the certificate's validity left (or unreadable)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= end - (end - start) / 3


class Pki:
    """The operator's CA and identity; issues and renews each service's certificates."""

    def __init__(self, ca: Authority, identity_dir: Path) -> None:
        self.ca = ca
        self.identity_dir = identity_dir
        self._lock = threading.Lock()
        self._ca_pem = ca.cert_pem()

    @classmethod
    def load_or_create(
        cls, kube: Kube, namespace: str, identity_dir: Path, now: dt.datetime
    ) -> Pki:
        """The CA from `namespace`'s `splitserve-internal-ca` Secret (created when absent), and
        the operator's identity written to `identity_dir`.

        Raises:
            KubeError: the Secret cannot be read or created.
            ValueError: the Secret exists but holds no usable CA.
        """
        secret = kube.get("v1", "Secret", namespace, CA_SECRET, live=True)
        if secret is None:
            ca = Authority.create("internal", now=now, days=CA_DAYS)
            kube.create(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": {
                        "name": CA_SECRET,
                        "namespace": namespace,
                        "labels": {"app.kubernetes.io/managed-by": render.MANAGED_BY},
                    },
                    "data": {CA_FILE: _b64(ca.cert_pem()), CA_KEY_FILE: _b64(ca.key_pem())},
                }
            )
            log.info("created the internal CA in Secret %s/%s", namespace, CA_SECRET)
        else:
            cert, key = _unb64(secret, CA_FILE), _unb64(secret, CA_KEY_FILE)
            if cert is None or key is None:
                raise ValueError(f"Secret {namespace}/{CA_SECRET} lacks {CA_FILE} or {CA_KEY_FILE}")
            ca = Authority.load(cert, key)
        pki = cls(ca, identity_dir)
        pki.refresh_own(now)
        return pki

    def refresh_own(self, now: dt.datetime) -> bool:
        """(Re-)issue the operator's own identity when missing or due; True if written."""
        with self._lock:
            cert = self.identity_dir / CERT_FILE
            if cert.is_file() and not needs_renewal(cert.read_bytes(), now):
                return False
            self.ca.write_identity(
                self.identity_dir, OPERATOR_SERVICE, "operator", now=now, days=LEAF_DAYS
            )
            return True

    def _current(self, secret: Obj | None, now: dt.datetime) -> bool:
        if secret is None:
            return False
        cert = _unb64(secret, CERT_FILE)
        return (
            cert is not None
            and _unb64(secret, CA_FILE) == self._ca_pem
            and _unb64(secret, KEY_FILE) is not None
            and not needs_renewal(cert, now)
        )

    def ensure(self, kube: Kube, ref: render.ServiceRef, now: dt.datetime) -> list[str]:
        """Create or renew the service's router and worker Secrets. Returns what it did."""
        actions = []
        for role in SERVICE_ROLES:
            name = render.tls_secret_name(ref.name, role)
            current = kube.get("v1", "Secret", ref.namespace, name, live=True)
            if self._current(current, now):
                continue
            cert, key = self.ca.issue(
                service_identity(ref), role, now=now, hosts=(), days=LEAF_DAYS
            )
            data = {CA_FILE: _b64(self._ca_pem), CERT_FILE: _b64(cert), KEY_FILE: _b64(key)}
            if current is None:
                kube.create(secret_manifest(ref, role, data))
                actions.append(f"created Secret {name}")
            else:
                kube.patch("v1", "Secret", ref.namespace, name, {"data": data})
                actions.append(f"renewed Secret {name}")
        return actions


def secret_manifest(ref: render.ServiceRef, role: str, data: dict[str, str]) -> Obj:
    meta: dict[str, Any] = {
        "name": render.tls_secret_name(ref.name, role),
        "namespace": ref.namespace,
        "labels": render.service_labels(ref.name, role),
        "ownerReferences": [render.owner_reference(ref)],
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": meta,
        "data": data,
    }


# ---------------------------------------------------------------------------------------------
# cert-manager mode: the operator renders Certificates, cert-manager issues the Secrets.

CERT_MANAGER_API: Final = "cert-manager.io/v1"
CERT_MANAGER_GROUP: Final = "cert-manager.io"
ISSUER_KINDS: Final = ("Issuer", "ClusterIssuer")


class CertManagerMissingError(Exception):
    """cert-manager mode was asked for, but the API server has no cert-manager Certificates."""


@dataclass(frozen=True, slots=True)
class IssuerRef:
    """The cert-manager issuer every internal certificate comes from (one CA for all: workers
    trust the `ca.crt` cert-manager writes into each Secret, so it must be a CA issuer)."""

    name: str
    kind: str = "ClusterIssuer"
    group: str = CERT_MANAGER_GROUP

    @classmethod
    def parse(cls, value: str) -> IssuerRef:
        """`ClusterIssuer/NAME`, `Issuer/NAME` or `NAME` (a ClusterIssuer)."""
        kind, _, name = value.rpartition("/")
        kind = kind or "ClusterIssuer"
        if kind not in ISSUER_KINDS or not name:
            raise ValueError(
                f"cert-manager issuer {value!r}: expected ClusterIssuer/NAME, Issuer/NAME or NAME"
            )
        return cls(name, kind)

    def manifest(self) -> Obj:
        return {"name": self.name, "kind": self.kind, "group": self.group}


def certificate_manifest(ref: render.ServiceRef, role: str, issuer: IssuerRef) -> Obj:
    """The cert-manager `Certificate` of a service's `role`: the same names as the operator's own
    certificates (`CN=<role>`, `OU=<service>`, URI SAN `splitserve://<service>/<role>`, DNS SAN
    `<role>.splitserve.internal`), into the Secret render mounts (`render.tls_secret_name`), EC
    P-256, 90 days, renewed with a third left, a new key each time."""
    service = service_identity(ref)
    name = render.tls_secret_name(ref.name, role)
    return {
        "apiVersion": CERT_MANAGER_API,
        "kind": "Certificate",
        "metadata": {
            "name": name,
            "namespace": ref.namespace,
            "labels": render.service_labels(ref.name, role),
            "ownerReferences": [render.owner_reference(ref)],
        },
        "spec": {
            "secretName": name,
            "secretTemplate": {"labels": render.service_labels(ref.name, role)},
            "commonName": role,
            "subject": {"organizations": ["splitserve"], "organizationalUnits": [service]},
            "uris": [role_uri(service, role)],
            "dnsNames": [role_dns(role)],
            "duration": f"{LEAF_DAYS * 24}h",
            "renewBefore": f"{LEAF_DAYS * 24 // 3}h",
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
            "issuerRef": issuer.manifest(),
        },
    }


class CertManagerIssuer:
    """Internal TLS through cert-manager: per service, two `Certificate`s whose Secrets render
    mounts as it mounts the operator's own. cert-manager issues and renews them (the kubelet
    updates the mounted files; the processes re-read them). The operator's own certificate comes
    from the chart (a `Certificate` in its namespace, mounted at `--tls-dir`)."""

    def __init__(self, issuer: IssuerRef) -> None:
        self.issuer = issuer

    @classmethod
    def start(cls, kube: Kube, namespace: str, issuer: IssuerRef) -> CertManagerIssuer:
        """Check that the API server serves cert-manager's Certificates (listing them in
        `namespace`).

        Raises:
            CertManagerMissingError: it does not (the CRDs are not installed).
        """
        try:
            kube.list(CERT_MANAGER_API, "Certificate", namespace)
        except KubeError as err:
            if err.status != 404:
                raise
            raise CertManagerMissingError(
                f"internal TLS from cert-manager (issuer {issuer.kind}/{issuer.name}): the API "
                f"server has no {CERT_MANAGER_API} Certificate resource — install cert-manager, "
                "or run without --cert-manager-issuer (the operator's own CA)"
            ) from None
        return cls(issuer)

    def refresh_own(self, now: dt.datetime) -> bool:
        """cert-manager renews the operator's own certificate (mounted, re-read on change)."""
        return False

    def ensure(self, kube: Kube, ref: render.ServiceRef, now: dt.datetime) -> list[str]:
        """Create or update the service's router and worker Certificates. Returns what it did."""
        actions = []
        for role in SERVICE_ROLES:
            action, _ = apply(kube, certificate_manifest(ref, role, self.issuer))
            if action != "unchanged":
                actions.append(f"{action} Certificate {render.tls_secret_name(ref.name, role)}")
        return actions


def delete_cert_manager_secrets(kube: Kube, ref: render.ServiceRef) -> list[str]:
    """When the service goes (its delete handler, before the finalizer is removed): delete its
    `Certificate`s, then the Secrets cert-manager wrote for them. cert-manager sets no
    ownerReference on those Secrets unless it runs with `--enable-certificate-owner-ref` (off by
    default), so the garbage collector would leave the keys behind; the Certificate goes first
    because cert-manager re-issues a Secret deleted under a live one. Only Certificates the
    service owns, and the Secrets they name. Returns what it did."""
    actions = []
    for role in SERVICE_ROLES:
        name = render.tls_secret_name(ref.name, role)
        cert = kube.get(CERT_MANAGER_API, "Certificate", ref.namespace, name, live=True)
        if cert is None or not owned_by(cert, ref.uid):
            continue
        secret = str((cert.get("spec") or {}).get("secretName") or name)
        if kube.delete(CERT_MANAGER_API, "Certificate", ref.namespace, name):
            actions.append(f"deleted Certificate {name}")
        if kube.delete("v1", "Secret", ref.namespace, secret):
            actions.append(f"deleted Secret {secret}")
    return actions


Issuer = Pki | CertManagerIssuer
"""Where a service's internal certificates come from: the operator's CA, or cert-manager."""
