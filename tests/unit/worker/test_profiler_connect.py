"""`splitserve profile` against a worker it cannot reach says what to try.

security.md: a `splitserve up` stack's workers require mutual TLS, and a tool talking to them
needs `--tls-dir <run-dir>/pki/admin`. Without it the profiler's plaintext channel never becomes
ready, and the error said only "no worker answers", though the worker was up.
"""

from __future__ import annotations

import pytest

from splitserve.security import tls
from splitserve.worker.profiler import ProfileError, ProfileGrid, profile_worker


async def test_without_a_tls_identity_the_error_names_tls_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tls, "identity", lambda: None)
    with pytest.raises(ProfileError, match=r"no worker answers at 127\.0\.0\.1:1 .*--tls-dir"):
        await profile_worker("127.0.0.1:1", ProfileGrid(), connect_timeout_s=0.2)
