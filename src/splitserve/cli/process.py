"""Process helpers for the CLI: run an async main until SIGINT/SIGTERM, tie children to us."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Final

import click

_PR_SET_PDEATHSIG = 1

API_KEY_ENV: Final = "SPLITSERVE_API_KEY"
"""The router's API keys in clear (`router serve --api-key`'s variable)."""


def env_without_api_key() -> dict[str, str]:
    """This process's environment less `API_KEY_ENV`: for children that do not read it (a
    `--processes` child has the digest in its configuration; workers use no key)."""
    return {k: v for k, v in os.environ.items() if k != API_KEY_ENV}


_BIND_ERRNOS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `main(stop)` in a fresh loop; SIGINT and SIGTERM set `stop` for a clean shutdown."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())


@contextlib.contextmanager
def bind_errors_named(port_flags: str) -> Iterator[None]:
    """A port that cannot be bound (in use, not this host's, privileged) ends the command with
    one line naming `port_flags` (the command's port options) instead of a traceback."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        if not is_bind_error(err):
            raise
        raise click.ClickException(f"cannot listen: {err} (check {port_flags})") from err


def is_bind_error(err: BaseException) -> bool:
    """A listening socket that could not be bound: the OS's error, or grpc's RuntimeError."""
    if isinstance(err, OSError):
        return err.errno in _BIND_ERRNOS
    return isinstance(err, RuntimeError) and str(err).startswith("Failed to bind to address")


def die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the parent dies, even by SIGKILL (Linux only).

    Without it a `splitserve up` killed with -9 would leave its workers running.
    """
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def ready_file_option() -> Callable[[Callable[..., object]], Callable[..., object]]:
    """`--ready-file`: its directory must exist (the file is written once listening; a missing
    directory was a traceback then, after the ports were bound)."""

    def check(_ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
        if value is not None and not value.parent.is_dir():
            raise click.BadParameter(f"directory {str(value.parent)!r} does not exist", param=param)
        return value

    return click.option(
        "--ready-file",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        callback=check,
        help="Written (JSON: address, ports, pid) once listening.",
    )


def without_torch() -> bool:
    """Keep PyTorch out of this process; True if it was kept out. For commands that run no model
    in their own process: `router serve`, and `up` (its engines run in child processes).

    transformers' `AutoTokenizer` imports PyTorch wherever it is installed (a `splitserve[vllm]`
    venv, `up --engine vllm`, a CUDA image): its generation config's logits processors, behind
    `is_torch_available()`. Both commands load a tokenizer (the router to serve, `up` to check
    the one it hands the router, `cli.tokenizer_check`). Measured: a router process held 425 MB
    RSS with the CPU build imported against 139 MB without it (docs/benchmarks.md, "Fifteenth
    pass"). `None` in `sys.modules` makes `import torch` raise ImportError and
    `importlib.util.find_spec("torch")` answer None, which is how transformers decides PyTorch is
    absent; the tokenizer classes it picks are the same (they need no tensors). Only where
    nothing imported it yet: a process that holds it keeps it."""
    if "torch" in sys.modules:
        return sys.modules["torch"] is None
    sys.modules["torch"] = None  # type: ignore[assignment]
    return True
