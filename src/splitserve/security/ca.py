"""A certificate authority for internal RPCs, and certificates that name a role.

`splitserve up` makes a throw-away CA per run (`local_pki`); the operator keeps one in a Secret
(docs/security.md). Every certificate names its service and role twice: the subject
(`CN=<role>`, `OU=<service>`, `O=splitserve`) and a URI SAN `splitserve://<service>/<role>`.
The files follow the layout of a `kubernetes.io/tls` Secret (and of cert-manager's): `ca.crt`,
`tls.crt`, `tls.key` in one directory per identity.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES: Final = ("operator", "router", "worker", "admin")
"""The identities internal RPCs know (docs/security.md has what each may call; `admin`: people's
tools such as `splitserve profile`)."""
CA_FILE: Final = "ca.crt"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
URI_SCHEME: Final = "splitserve"


INTERNAL_DOMAIN: Final = "splitserve.internal"


def role_uri(service: str, role: str) -> str:
    return f"{URI_SCHEME}://{service}/{role}"


def role_dns(role: str) -> str:
    """The DNS SAN every certificate of `role` carries: clients check a worker's certificate
    against `worker.splitserve.internal` (pod IPs are not known when certificates are issued;
    one CA per service keeps services apart)."""
    return f"{role}.{INTERNAL_DOMAIN}"


@dataclass(frozen=True)
class Authority:
    """A CA: its key and certificate."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, name: str, *, now: dt.datetime, days: int = 365) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "splitserve"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"splitserve CA {name}"),
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> Authority:
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key must be an EC key")
        return cls(key, x509.load_pem_x509_certificate(cert_pem))

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def issue(
        self,
        service: str,
        role: str,
        *,
        now: dt.datetime,
        hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
        days: int = 90,
    ) -> tuple[bytes, bytes]:
        """A certificate for `role` of `service` (client and server use), PEM cert and key;
        valid `days`, but never past the CA's own end (a chain fails from then on)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [
            x509.UniformResourceIdentifier(role_uri(service, role)),
            x509.DNSName(role_dns(role)),
        ]
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(
                x509.Name(
                    [
                        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "splitserve"),
                        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, service),
                        x509.NameAttribute(NameOID.COMMON_NAME, role),
                    ]
                )
            )
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(min(now + dt.timedelta(days=days), self.cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem

    def write_identity(
        self, directory: Path, service: str, role: str, *, now: dt.datetime, days: int = 90
    ) -> Path:
        """`ca.crt`, `tls.crt`, `tls.key` for `role` in `directory` (the key readable by the
        owner only). Files are replaced atomically, so a reader never sees half a rotation."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        cert, key = self.issue(service, role, now=now, days=days)
        _write(directory / CA_FILE, self.cert_pem(), 0o644)
        _write(directory / KEY_FILE, key, 0o600)
        _write(directory / CERT_FILE, cert, 0o644)
        return directory


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def local_pki(root: Path, service: str, *, now: dt.datetime) -> dict[str, Path]:
    """A throw-away CA and one identity per role under `root` (`root/<role>/`); the CA key is
    not written (nothing issues more certificates after start-up)."""
    ca = Authority.create(service, now=now, days=30)
    return {role: ca.write_identity(root / role, service, role, now=now) for role in ROLES}
