"""A port that cannot be bound ends `worker serve` / `router serve` with one line naming the
port flags, not a traceback (before: grpc's `RuntimeError: Failed to bind to address`, or
`OSError: [Errno 98] Address already in use` from the metrics, link or HTTP listener).
Checked by hand on both commands with a busy port; not end to end here: grpc's server finalizer
then warns at the end of the session (the loop it needs has closed)."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable

import click
import pytest

from splitserve.cli.process import bind_errors_named, run_until_signalled


def _raising(err: BaseException) -> Callable[[asyncio.Event], Awaitable[None]]:
    async def main(_stop: asyncio.Event) -> None:
        raise err

    return main


@pytest.mark.parametrize(
    "err",
    [
        OSError(errno.EADDRINUSE, "Address already in use"),
        OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
        RuntimeError("Failed to bind to address 127.0.0.1:1; set GRPC_VERBOSITY=debug"),
    ],
)
def test_a_bind_failure_names_the_port_flags(err: BaseException) -> None:
    with (
        pytest.raises(click.ClickException, match=r"cannot listen: .*check --port / --x"),
        bind_errors_named("--port / --x"),
    ):
        run_until_signalled(_raising(err))


@pytest.mark.parametrize(
    "err",
    [
        OSError(errno.ENOENT, "No such file"),  # not a bind failure
        RuntimeError("something else"),
    ],
)
def test_other_errors_propagate_unchanged(err: BaseException) -> None:
    with pytest.raises(type(err)) as got, bind_errors_named("--port"):
        run_until_signalled(_raising(err))
    assert got.value is err


def test_without_the_context_a_bind_failure_is_unchanged() -> None:
    err = OSError(errno.EADDRINUSE, "Address already in use")
    with pytest.raises(OSError, match="Address already in use") as got:
        run_until_signalled(_raising(err))
    assert got.value is err
