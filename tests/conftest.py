"""Shared pytest configuration."""

from __future__ import annotations

import os

# gRPC's C core logs connection chatter (GOAWAY, ...) to stderr at INFO; keep test output clean.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from hypothesis import HealthCheck, settings

# CI runs on 2 shared cores: no per-example deadline, a moderate example count.
settings.register_profile(
    "ci", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci")
