"""Logging set-up, done once per process by the CLI."""

from __future__ import annotations

import logging


def setup(level: str, component: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s {component} %(name)s: %(message)s",
    )
    # gRPC and uvicorn are chatty at INFO; keep them at WARNING unless asked for DEBUG.
    if level.upper() != "DEBUG":
        for name in ("grpc", "uvicorn.access", "httpx"):
            logging.getLogger(name).setLevel(logging.WARNING)
