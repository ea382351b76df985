"""`up`'s local PKI (`security.ca.local_pki`): no certificate outlives the CA that signed it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509

from splitserve.security.ca import CERT_FILE, Authority, local_pki

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_leaves_end_when_their_ca_ends(tmp_path: Path) -> None:
    """The local CA lasts 30 days, its leaves were issued for 90: after 30 days every chain
    failed while each certificate still looked valid."""
    pki = local_pki(tmp_path, "local", now=NOW)
    ca = x509.load_pem_x509_certificate((pki["worker"] / "ca.crt").read_bytes())
    assert ca.not_valid_after_utc == NOW + dt.timedelta(days=30)
    for directory in pki.values():
        leaf = x509.load_pem_x509_certificate((directory / CERT_FILE).read_bytes())
        assert leaf.not_valid_after_utc == ca.not_valid_after_utc
    # a leaf shorter than its CA keeps its own end
    cert, _ = Authority.create("x", now=NOW).issue("x", "worker", now=NOW, days=7)
    leaf = x509.load_pem_x509_certificate(cert)
    assert leaf.not_valid_after_utc == NOW + dt.timedelta(days=7)
