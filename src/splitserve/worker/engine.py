"""The `Engine` protocol every worker backend implements.

One engine serves every role: the role is the server's setting, and each call says what to do
(prefill and hold KV; decode from a pulled KV; generate a whole request). Engines are asyncio
objects living in the worker's event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from splitserve.core.ids import RequestId
from splitserve.core.kv import KvHandle
from splitserve.core.request import FinishReason, Request


@dataclass(frozen=True, slots=True)
class PrefillOutcome:
    first_token_id: int
    kv: KvHandle | None
    """None when the request finished at its first token (nothing is held)."""
    finish_reason: FinishReason | None
    queue_s: float = 0.0
    prefill_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TokenDelta:
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    num_waiting: int
    num_running: int
    kv_blocks_free: int
    kv_blocks_total: int
    kv_block_size: int
    num_pending_prefill_tokens: int
    num_kv_held: int


class Engine(Protocol):
    kind: str
    """"sim" or "vllm"."""
    model: str

    async def start(self) -> None:
        """Load and begin stepping. Called once before any request."""
        ...

    async def stop(self) -> None:
        """Stop stepping; pending requests end with FinishReason.CANCELLED."""
        ...

    async def prefill(self, request: Request) -> PrefillOutcome:
        """Compute the prompt, sample the first token, hold the KV for a pull.

        Raises:
            CapacityError: the request can never fit this engine.
        """
        ...

    def decode(
        self, request: Request, first_token_id: int, kv: KvHandle
    ) -> AsyncIterator[TokenDelta]:
        """Pull the KV named by `kv` and stream tokens after the first.

        Raises:
            KvTransferError: the KV could not be pulled (before any token is yielded).
        """
        ...

    def generate(self, request: Request) -> AsyncIterator[TokenDelta]:
        """Run the whole request here and stream every token."""
        ...

    async def cancel(self, request_id: RequestId) -> bool:
        """Drop a request wherever it is. True if it was known."""
        ...

    async def release_kv(self, request_id: RequestId) -> bool:
        """The decode side has the KV: free what a prefill holds. True if it was held."""
        ...

    def load(self) -> LoadSnapshot: ...

    @property
    def in_flight(self) -> int:
        """Requests accepted and not finished (including KV held for a pull)."""
        ...
