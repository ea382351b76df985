"""Unit tests talk to no cluster."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_ambient_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    """`$KUBECONFIG` unset for every unit test. The operator's integration harness points it at
    its emulator's file for the whole pytest session (tests/integration/operator/conftest.py,
    set at import, the file written only once that emulator starts), and `operator run` refuses
    a `$KUBECONFIG` naming no file; a unit test sets the variable itself when it needs one."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
