"""The `Engine` protocol every worker backend implements.

One engine serves every role: the role is the server's setting, and each call says what to do
(prefill and hold KV; decode from a pulled KV; generate a whole request). Engines are asyncio
objects living in the worker's event loop.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from splitserve.core.ids import RequestId
from splitserve.core.kv import KvHandle
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.request import FinishReason, Request, TokenLogprobs


@dataclass(frozen=True, slots=True)
class PrefillOutcome:
    first_token_id: int
    kv: KvHandle | None
    """None when the request finished at its first token (nothing is held)."""
    finish_reason: FinishReason | None
    queue_s: float = 0.0
    prefill_s: float = 0.0
    first_logprobs: TokenLogprobs | None = None
    """The first token's log probabilities, when the request asked for them."""
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()
    """With `SamplingSpec.prompt_logprobs`: one per prompt token (None for the first)."""


@dataclass(frozen=True, slots=True)
class TokenDelta:
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()
    """With `SamplingSpec.logprobs`: one per token of `token_ids`; else empty."""
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()
    """With `SamplingSpec.prompt_logprobs`, on the first delta: one per prompt token (None for
    the first); else empty."""


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    num_waiting: int
    num_running: int
    kv_blocks_free: int
    kv_blocks_total: int
    kv_block_size: int
    num_pending_prefill_tokens: int
    num_kv_held: int


@dataclass(frozen=True, slots=True)
class StepSample:
    """One engine step as the engine ran it (the `WatchSteps` stream's record)."""

    index: int
    """The engine's step counter (from 1)."""
    start_s: float
    """The worker clock when the step started."""
    duration_s: float
    """vLLM: wall time of `engine.step()`; sim engine: the latency model's price of the step."""
    batch: BatchShape

    @property
    def num_seqs(self) -> int:
        return len(self.batch.prefill_chunks) + len(self.batch.decode_contexts)


DEFAULT_STEP_BUFFER = 4096


class StepSubscription:
    """One watcher's bounded buffer of step samples: full, it drops the oldest (counted).

    With `min_interval_s` > 0 the watcher is thinned, separately for the two kinds of step
    (with a prefill chunk; decode only), so a mixed worker's rarer prefill steps are not passed
    over for its decode steps: a step is kept only when it started at least `min_interval_s`
    (worker clock, the samples' own `start_s`) after the last kept step of its kind. Over any
    T seconds of steps the watcher gets at most 1 + T / min_interval_s samples of each kind.
    Each kept sample is one real step (its batch and time unchanged); the steps passed over
    are counted in `thinned`, not in `dropped`.
    """

    def __init__(self, feed: StepFeed, max_buffer: int, min_interval_s: float = 0.0) -> None:
        self._feed = feed
        self._buffer: deque[StepSample] = deque(maxlen=max(1, max_buffer))
        self._ready = asyncio.Event()
        self.min_interval_s = min_interval_s
        self._next_s = [-math.inf, -math.inf]
        """Per kind ([0] decode only, [1] with a prefill chunk): when the next may start."""
        self.dropped = 0
        self.thinned = 0
        self.closed = False

    def push(self, sample: StepSample) -> None:
        if self.min_interval_s > 0:
            kind = 1 if sample.batch.prefill_chunks else 0
            if sample.start_s < self._next_s[kind]:
                self.thinned += 1
                return
            self._next_s[kind] = sample.start_s + self.min_interval_s
        if len(self._buffer) == self._buffer.maxlen:
            self.dropped += 1  # the deque drops the oldest on append
        self._buffer.append(sample)
        self._ready.set()

    async def _wait(self) -> None:
        while not self._buffer:
            self._ready.clear()
            await self._ready.wait()

    async def get(self) -> StepSample:
        """The oldest buffered sample, waiting for one if there is none."""
        await self._wait()
        return self._buffer.popleft()

    async def get_all(self) -> list[StepSample]:
        """Every buffered sample, oldest first, waiting for one if there is none."""
        await self._wait()
        out = list(self._buffer)
        self._buffer.clear()
        return out

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._feed.unsubscribe(self)

    def __aiter__(self) -> StepSubscription:
        return self

    async def __anext__(self) -> StepSample:
        return await self.get()


class StepFeed:
    """Fans an engine's step samples out to `WatchSteps` watchers (in the worker's event loop).

    Engines check `active` before building a sample, so a worker nobody watches allocates
    nothing per step for it. `publish` never blocks: a slow watcher loses its oldest samples.
    """

    def __init__(self) -> None:
        self._subs: list[StepSubscription] = []

    @property
    def active(self) -> bool:
        """Anyone watching? (Read from any thread: a stale answer costs one sample at most.)"""
        return bool(self._subs)

    @property
    def num_subscribers(self) -> int:
        return len(self._subs)

    def subscribe(
        self, max_buffer: int = DEFAULT_STEP_BUFFER, min_interval_s: float = 0.0
    ) -> StepSubscription:
        sub = StepSubscription(self, max_buffer, min_interval_s)
        self._subs = [*self._subs, sub]
        return sub

    def unsubscribe(self, sub: StepSubscription) -> None:
        self._subs = [s for s in self._subs if s is not sub]

    def publish(self, sample: StepSample) -> None:
        for sub in self._subs:
            sub.push(sample)


class Engine(Protocol):
    kind: str
    """"sim" or "vllm"."""
    model: str
    steps: StepFeed | None
    """Per-step samples for `WatchSteps`; None when the engine cannot report its steps."""

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

    def prepare_decode(self, request: Request) -> bool:
        """An early Decode (`kv_follows`) waits for its first token and KV: process its input
        ahead if the engine can. True if something was prepared (then `discard_prepared` is
        called once the Decode ends or is cancelled); engines with nothing to prepare: False."""
        ...

    def discard_prepared(self, request_id: RequestId) -> None:
        """Forget what `prepare_decode` prepared for `request_id`."""
        ...

    def load(self) -> LoadSnapshot: ...

    @property
    def in_flight(self) -> int:
        """Requests accepted and not finished (including KV held for a pull)."""
        ...
