"""Mutual TLS for internal RPCs (router -> worker, worker -> worker, operator -> worker).

One process has one identity: a directory with `ca.crt`, `tls.crt`, `tls.key` (a
`kubernetes.io/tls` Secret mounted as a volume, cert-manager's layout, or what `splitserve up`
generates), set once at start by the CLI (`configure`, from `--tls-dir` / `SPLITSERVE_TLS_DIR`).
Then

- `add_port` binds a worker's port with TLS that requires a client certificate from the same CA;
  the server re-reads the files when they change (gRPC asks on every handshake; the files are
  checked at most every `RELOAD_INTERVAL_S`), so certificates rotate without a restart;
- `aio_channel` / `sync_channel` open channels to workers with this process's certificate and
  check the worker's certificate (`worker.splitserve.internal`). A channel reads the files when
  it is opened: channels opened after a rotation use the new certificate, a long-lived channel
  keeps the one it connected with until it reconnects (issue certificates with overlapping
  validity, docs/security.md);
- `peer` names the caller of a method: its service and role from the URI SAN
  `splitserve://<service>/<role>`, None without a verified certificate.

Without `configure`, every function falls back to plaintext (tests, and `--insecure` setups).
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
from grpc import aio

from splitserve.security.ca import CA_FILE, CERT_FILE, KEY_FILE, URI_SCHEME, role_dns

log = logging.getLogger(__name__)

RELOAD_INTERVAL_S: Final = 1.0
Options = Sequence[tuple[str, Any]]


@dataclass(frozen=True)
class Peer:
    service: str
    role: str


class Identity:
    """The certificate files of this process, re-read when they change."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._stamp: tuple[int, ...] = ()
        self._checked = 0.0
        self.reloads = 0
        self.ca, self.cert, self.key = self._read()

    def _paths(self) -> tuple[Path, Path, Path]:
        d = self.directory
        return d / CA_FILE, d / CERT_FILE, d / KEY_FILE

    def _read(self) -> tuple[bytes, bytes, bytes]:
        paths = self._paths()
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{self.directory}: no {', '.join(missing)} (TLS identity)")
        self._stamp = tuple(p.stat().st_mtime_ns for p in paths)
        ca, cert, key = (p.read_bytes() for p in paths)
        return ca, cert, key

    def changed(self) -> bool:
        """Re-read the files if their modification times changed (at most every
        `RELOAD_INTERVAL_S`); True if they did."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked < RELOAD_INTERVAL_S:
                return False
            self._checked = now
            try:
                stamp = tuple(p.stat().st_mtime_ns for p in self._paths())
                if stamp == self._stamp:
                    return False
                self.ca, self.cert, self.key = self._read()
            except OSError as err:
                log.error(
                    "TLS files in %s: %s; keeping the ones loaded before", self.directory, err
                )
                return False
            self.reloads += 1
            log.info("TLS certificate in %s reloaded", self.directory)
            return True

    def own_service(self) -> str | None:
        """The service named by this process's own certificate (its URI SAN), None without one."""
        own = cert_peer(self.cert)
        return None if own is None else own.service

    def server_credentials(self) -> grpc.ServerCredentials:
        def config() -> Any:
            return grpc.ssl_server_certificate_configuration(
                [(self.key, self.cert)], root_certificates=self.ca
            )

        initial = config()

        def fetch() -> Any:  # called by gRPC before each handshake; None: keep the current one
            return config() if self.changed() else None

        return grpc.dynamic_ssl_server_credentials(
            initial, fetch, require_client_authentication=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        self.changed()
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)

    def _ssl_context(self, purpose: int) -> ssl.SSLContext:
        ctx = ssl.SSLContext(purpose)
        _, cert, key = self._paths()
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(cadata=self.ca.decode())
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def server_ssl_context(self) -> ssl.SSLContext:
        """The stream link's server side (`worker.link`): this identity, a client certificate of
        the same CA required, as `server_credentials`. The files are re-read when they change,
        checked at each handshake (the SNI callback swaps in a context of the new files)."""
        self.changed()
        current = self._ssl_context(ssl.PROTOCOL_TLS_SERVER)

        def fresh(sock: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
            nonlocal current
            if self.changed():
                current = self._ssl_context(ssl.PROTOCOL_TLS_SERVER)
                current.sni_callback = fresh
            sock.context = current

        current.sni_callback = fresh
        return current

    def client_ssl_context(self) -> ssl.SSLContext:
        """The stream link's client side (`router.mux` `StreamLink`): this identity, the worker's
        certificate checked against `LINK_SERVER_NAME` (as `channel_credentials` with the
        channel's name override). Read when a link connects, like a channel's."""
        self.changed()
        return self._ssl_context(ssl.PROTOCOL_TLS_CLIENT)


_identity: Identity | None = None


def configure(directory: Path | None) -> Identity | None:
    """Set (or clear, with None) this process's identity.

    Raises:
        FileNotFoundError: a file is missing.
    """
    global _identity
    _identity = None if directory is None else Identity(directory)
    return _identity


def identity() -> Identity | None:
    return _identity


def _options(options: Options) -> list[tuple[str, Any]]:
    return [*options, ("grpc.ssl_target_name_override", role_dns("worker"))]


def aio_channel(address: str, options: Options = ()) -> aio.Channel:
    """An asyncio channel to a worker (mutual TLS once configured)."""
    ident = _identity
    if ident is None:
        return aio.insecure_channel(address, options=list(options) or None)
    return aio.secure_channel(address, ident.channel_credentials(), options=_options(options))


def sync_channel(address: str, options: Options = ()) -> grpc.Channel:
    """A blocking channel to a worker (mutual TLS once configured)."""
    ident = _identity
    if ident is None:
        return grpc.insecure_channel(address, options=list(options) or None)
    return grpc.secure_channel(address, ident.channel_credentials(), options=_options(options))


LINK_SERVER_NAME: Final = role_dns("worker")
"""The name a stream link checks the worker's certificate against (the channels' override)."""


def link_server_ssl() -> ssl.SSLContext | None:
    """The worker's stream-link TLS (None: plaintext, as `add_port` without an identity)."""
    ident = _identity
    return None if ident is None else ident.server_ssl_context()


def link_client_ssl() -> ssl.SSLContext | None:
    """The router's stream-link TLS (None: plaintext, as `aio_channel` without an identity)."""
    ident = _identity
    return None if ident is None else ident.client_ssl_context()


def ssl_auth_context(sock: ssl.SSLObject | ssl.SSLSocket | None) -> dict[str, list[bytes]]:
    """The keys of gRPC's `auth_context()` that `peer` and `peer_fingerprint` read, from a TLS
    connection's verified peer certificate (empty without one): the stream link's callers are
    named exactly as gRPC's are."""
    der = None if sock is None else sock.getpeercert(binary_form=True)
    if not der:
        return {}
    from cryptography import x509

    pem = ssl.DER_cert_to_PEM_cert(der).encode()
    cert = x509.load_der_x509_certificate(der)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names: list[str] = []
    else:
        names = [
            *sans.get_values_for_type(x509.DNSName),
            *sans.get_values_for_type(x509.UniformResourceIdentifier),
        ]
    return {"x509_pem_cert": [pem], "x509_subject_alternative_name": [n.encode() for n in names]}


def add_port(server: aio.Server, address: str) -> int:
    """Bind `address` on `server`: TLS requiring a client certificate once configured."""
    ident = _identity
    if ident is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, ident.server_credentials()))


def cert_peer(cert_pem: bytes) -> Peer | None:
    """The service and role a PEM certificate names in its `splitserve://` URI SAN."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        parsed = _parse_uri(uri)
        if parsed is not None:
            return parsed
    return None


def _parse_uri(value: str) -> Peer | None:
    prefix = f"{URI_SCHEME}://"
    if value.startswith(prefix):
        service, _, role = value[len(prefix) :].partition("/")
        if service and role:
            return Peer(service, role)
    return None


def peer_fingerprint(context: Any) -> str | None:
    """The SHA-256 of the caller's verified certificate (hex), None without one: who owns a
    request (`security.owners`)."""
    import hashlib

    auth = context.auth_context() or {}
    for raw in auth.get("x509_pem_cert", ()):
        data = raw if isinstance(raw, bytes) else str(raw).encode()
        return hashlib.sha256(data).hexdigest()
    return None


def peer(context: Any) -> Peer | None:
    """The verified caller of a method, from its certificate's `splitserve://` URI SAN."""
    auth = context.auth_context() or {}
    for raw in auth.get("x509_subject_alternative_name", ()):
        value = raw.decode() if isinstance(raw, bytes) else str(raw)
        parsed = _parse_uri(value)
        if parsed is not None:
            return parsed
    return None
