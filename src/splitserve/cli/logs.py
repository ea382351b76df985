"""Logging set-up, done once per process by the CLI."""

from __future__ import annotations

import logging

import click

from splitserve.obs import tracing
from splitserve.obs.logs import JsonFormatter

LOG_FORMATS = ("text", "json")

log_format_option = click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    envvar="SPLITSERVE_LOG_FORMAT",
    help="json: one JSON object per line (request id, trace id, class, path, outcome).",
)


def setup(level: str, component: str, fmt: str = "text") -> None:
    if fmt == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter(component))
        logging.basicConfig(level=level.upper(), handlers=[handler])
    else:
        logging.basicConfig(
            level=level.upper(),
            format=f"%(asctime)s %(levelname)s {component} %(name)s: %(message)s",
        )
    tracing.configure(component)  # only when OTEL_* asks for traces
    # gRPC and uvicorn are chatty at INFO; keep them at WARNING unless asked for DEBUG.
    if level.upper() != "DEBUG":
        for name in ("grpc", "uvicorn.access", "httpx"):
            logging.getLogger(name).setLevel(logging.WARNING)
