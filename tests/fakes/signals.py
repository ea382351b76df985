"""A stand-in for `cli.router.run_until_signalled` that stops its server at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


def run_stopped_at_once(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `main(stop)` with `stop` already set: the server starts, then stops (no signal)."""

    async def runner() -> None:
        stop = asyncio.Event()
        stop.set()
        await main(stop)

    asyncio.run(runner())
