"""`--tls-dir` (`SPLITSERVE_TLS_DIR`): the process's certificate for internal RPCs.

A directory with `ca.crt`, `tls.crt`, `tls.key` (a mounted `kubernetes.io/tls` Secret, or what
`splitserve up` generates). Given, workers serve mutual TLS and check each caller's role per
method, and every channel to a worker presents this certificate (docs/security.md). Left out:
plaintext, as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from splitserve.security import tls

F = TypeVar("F", bound=Callable[..., Any])
ENV: str = "SPLITSERVE_TLS_DIR"


def _configure(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    if value is None:
        return
    try:
        tls.configure(value)
    except (OSError, ValueError) as err:
        raise click.BadParameter(str(err), ctx=ctx, param=param) from err
    os.environ[ENV] = str(value)  # child processes (router --processes) inherit it


def tls_option(f: F) -> F:
    option = click.option(
        "--tls-dir",
        type=click.Path(path_type=Path, exists=True, file_okay=False),
        default=None,
        envvar=ENV,
        expose_value=False,
        callback=_configure,
        help="Certificate for internal RPCs (ca.crt, tls.crt, tls.key): workers require mutual "
        "TLS and check callers' roles; channels to workers present it. Default: plaintext.",
    )
    return option(f)
