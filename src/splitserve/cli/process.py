"""Process helpers for the CLI: run an async main until SIGINT/SIGTERM, tie children to us."""

from __future__ import annotations

import asyncio
import ctypes
import signal
import sys
from collections.abc import Awaitable, Callable

_PR_SET_PDEATHSIG = 1


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `main(stop)` in a fresh loop; SIGINT and SIGTERM set `stop` for a clean shutdown."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())


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
