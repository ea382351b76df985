"""Logging set-up, done once per process by the CLI."""

from __future__ import annotations

import logging
from collections.abc import Callable

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

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _level(_ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A level `logging` knows, any case; anything else is refused naming the flag (it was a
    traceback from `logging.basicConfig` once the process had started)."""
    if value.upper() not in LOG_LEVELS:
        raise click.BadParameter(
            f"{value!r} is not one of {', '.join(LOG_LEVELS)} (any case)", param=param
        )
    return value.upper()


def log_level_option(
    default: str = "INFO",
) -> Callable[[Callable[..., object]], Callable[..., object]]:
    """`--log-level` (SPLITSERVE_LOG_LEVEL), checked before anything starts."""
    return click.option(
        "--log-level",
        default=default,
        show_default=True,
        envvar="SPLITSERVE_LOG_LEVEL",
        callback=_level,
        help=f"{', '.join(LOG_LEVELS)} (any case).",
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
    try:
        tracing.configure(component)  # only when OTEL_* asks for traces
    except tracing.TracingConfigError as err:  # was a traceback
        raise click.ClickException(str(err)) from None
    # gRPC and uvicorn are chatty at INFO; keep them at WARNING unless asked for DEBUG.
    if level.upper() != "DEBUG":
        for name in ("grpc", "uvicorn.access", "httpx"):
            logging.getLogger(name).setLevel(logging.WARNING)
