"""The P/D flow: place a request (pure `PdDecider`), then run it on workers over gRPC.

Disaggregated: `Prefill` on the best prefill worker P (on failure the next P, then aggregated),
then `Decode` on decode worker D with P's KV handle. Aggregated: `Generate` on D. When D fails
the next D takes over: with the KV handle if D never got to pull it (UNAVAILABLE), otherwise by
re-running prompt + tokens already emitted with `Generate`, so the stream carries on with no
token duplicated or lost. A worker that produces no token for `token_stall_timeout_s` (frozen,
wedged) is treated as failed the same way. A decode whose KV pull fails (ABORTED: the prefill
worker died or no longer holds the KV) is re-run with `Generate` on the same worker before the
next one is tried. Ending a stream early (client gone, stop string) sends a best-effort
`Cancel(request_id)` to every worker involved. Worker INVALID_ARGUMENT / OUT_OF_RANGE /
RESOURCE_EXHAUSTED mean the request can never fit: `InvalidRequest`, never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Final

import grpc
from grpc import aio

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.api.router import DispatchSettings, PlacementSettings
from splitserve.core.clock import Clock
from splitserve.core.ids import EndpointId
from splitserve.core.request import FinishReason, Request
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.placement import (
    Path,
    PdDecider,
    PdDeciderParams,
    Placement,
    RequestView,
    build_profile,
    default_decode_profile,
    default_prefill_profile,
)
from splitserve.router import messages
from splitserve.router.cancel import Canceller
from splitserve.router.errors import InvalidRequest, RequestTimeout, WorkersFailed
from splitserve.router.pool_view import PoolView
from splitserve.router.request_stats import RequestStats, outcome_of

log = logging.getLogger(__name__)

# Final answers about the request itself, never retried elsewhere: bad input (INVALID_ARGUMENT),
# and a request larger than a worker's whole KV cache (OUT_OF_RANGE from our workers;
# RESOURCE_EXHAUSTED from engines that use it for the same).
_REJECTED: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Tokens for the client; `finish_reason` is set on the last chunk only."""

    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None


class _WorkerFailed(Exception):  # noqa: N818 - internal signal
    """One worker call failed in a way another worker may not (internal to the retry loops)."""

    def __init__(
        self, eid: EndpointId, detail: str, *, unreachable: bool = False, kv_lost: bool = False
    ) -> None:
        super().__init__(f"{eid}: {detail}")
        self.unreachable = unreachable
        self.kv_lost = kv_lost
        """The worker is fine but could not read the prefilled KV (ABORTED)."""


def default_decider(settings: PlacementSettings | None = None) -> PdDecider:
    """The decider with the default decode and prefill profiles."""
    params = PdDeciderParams(
        min_prompt_tokens_for_pd=(settings or PlacementSettings()).min_prompt_tokens_for_pd
    )
    return PdDecider(
        build_profile(default_decode_profile()), build_profile(default_prefill_profile()), params
    )


class Dispatcher:
    """Runs requests on the pool. One per router process."""

    def __init__(
        self,
        pool: PoolView,
        *,
        clock: Clock,
        metrics: RouterMetrics,
        settings: DispatchSettings | None = None,
        decider: PdDecider | None = None,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.settings = settings or DispatchSettings()
        self.decider = decider or default_decider()
        self.canceller = Canceller(self.settings.cancel_timeout_s)

    def open(self, request: Request) -> Dispatch:
        """A dispatch for `request`; nothing runs until its `chunks()` are iterated."""
        return Dispatch(self, request)

    async def drain_background(self) -> None:
        """Wait for the cancels still going out (at shutdown, and in tests)."""
        await self.canceller.drain()


class Dispatch:
    """One request's run through the pool. Iterate `chunks()` under `contextlib.aclosing`."""

    def __init__(self, dispatcher: Dispatcher, request: Request) -> None:
        self._d = dispatcher
        self.request = request
        self.placement: Placement | None = None
        self.path: Path | None = None
        """The path actually taken (a failed prefill turns disaggregated into aggregated)."""
        self.endpoints: dict[EndpointId, worker_pb2_grpc.WorkerAsyncStub] = {}
        """Every worker the request was sent to."""
        self._stopped = False
        self._stats = RequestStats(dispatcher.metrics, dispatcher.clock, request.num_prompt_tokens)
        self._deadline_s = self._stats.start_s + dispatcher.settings.request_timeout_s

    @property
    def num_output_tokens(self) -> int:
        return self._stats.num_output_tokens

    def stop(self) -> None:
        """Mark that the router ends this request on purpose (stop string) before closing it."""
        self._stopped = True

    # -- the flow --------------------------------------------------------------------------

    async def chunks(self) -> AsyncGenerator[Chunk, None]:
        """Run the request; yield its tokens. Closing early cancels the work on every worker.

        Raises:
            NoEligibleEndpoint: no decode-capable worker accepts work.
            InvalidRequest: a worker says the request can never fit.
            WorkersFailed: every candidate worker failed.
            RequestTimeout: the request timeout passed.
        """
        self._stats.start()
        finished, error = False, None
        try:
            self.placement = self._place()
            self.path = self.placement.path
            async with contextlib.aclosing(self._run(self.placement)) as run:
                async for chunk in run:
                    self._stats.on_tokens(len(chunk.token_ids), self._path_label())
                    # Set before yielding: a consumer may close us as soon as it has the last one.
                    finished = chunk.finish_reason is not None
                    yield chunk
                    if finished:
                        break
            if not finished:
                raise WorkersFailed("the worker stream ended without a finish reason")
        except BaseException as err:
            error = err
            raise
        finally:
            if not finished and self.endpoints:
                self._d.canceller.cancel_later(self.request.id, dict(self.endpoints))
            outcome = outcome_of(error, ended_on_purpose=finished or self._stopped)
            self._stats.finish(outcome, self._path_label())

    def _place(self) -> Placement:
        req = self.request
        view = RequestView(
            req.id, req.num_prompt_tokens, req.sampling.max_tokens, slo_class=req.slo_class
        )
        placement = self._d.decider.place(view, self._d.pool.views())
        log.debug(
            "placed %s: %s P=%s D=%s (%s)",
            req.id,
            placement.path,
            placement.prefill[:1],
            placement.decode[:1],
            placement.reason,
        )
        return placement

    async def _run(self, placement: Placement) -> AsyncGenerator[Chunk, None]:
        first: worker_pb2.PrefillResponse | None = None
        if placement.path is Path.DISAGGREGATED:
            first = await self._prefill_any(placement.prefill)
            if first is None:
                self._fallback("prefill_to_aggregated")
                self.path = Path.AGGREGATED
            else:
                reason = messages.FINISH_FROM_PB.get(first.finish_reason)
                yield Chunk((first.first_token_id,), reason)
                if reason is not None:
                    return
        async with contextlib.aclosing(self._decode_any(placement.decode, first)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _prefill_any(
        self, candidates: Sequence[EndpointId]
    ) -> worker_pb2.PrefillResponse | None:
        req = self.request
        msg = messages.prefill(req)
        for i, eid in enumerate(candidates):
            if i:
                self._fallback("prefill_retry")
            stub = self._involve(eid)
            if stub is None:
                continue
            self._d.pool.acquire(eid)
            try:
                # The first token is a token: a prefill worker that stalls is given up on too.
                timeout_s = min(self._remaining_s(), self._d.settings.token_stall_timeout_s)
                resp: worker_pb2.PrefillResponse = await stub.Prefill(msg, timeout=timeout_s)
            except aio.AioRpcError as err:
                self._raise_if_final(eid, err)
                log.warning("prefill of %s on %s failed: %s", req.id, eid, err.code())
                self._d.canceller.cancel_later(req.id, {eid: stub})  # whatever it holds
                continue
            finally:
                self._d.pool.release(eid)
            if resp.finish_reason in (
                common_pb2.FINISH_REASON_ERROR,
                common_pb2.FINISH_REASON_CANCELLED,
            ):
                log.warning("prefill of %s on %s ended with %s", req.id, eid, resp.finish_reason)
                continue
            return resp
        return None

    async def _decode_any(
        self, candidates: Sequence[EndpointId], first: worker_pb2.PrefillResponse | None
    ) -> AsyncGenerator[Chunk, None]:
        emitted: list[int] = [first.first_token_id] if first is not None else []
        kv = first.kv if first is not None and first.HasField("kv") else None
        queue = list(candidates)
        for i, eid in enumerate(queue):
            if i:
                self._fallback("decode_retry" if kv is not None else "generate_retry")
            stub = self._involve(eid)
            if stub is None:
                continue
            call = self._decode_call(stub, emitted, kv)
            num_before = len(emitted)
            self._d.pool.acquire(eid)
            try:
                async with contextlib.aclosing(self._stream(eid, call)) as stream:
                    async for tokens, reason in stream:
                        emitted.extend(tokens)
                        yield Chunk(tokens, reason)
                        if reason is not None:
                            return
            except _WorkerFailed as err:
                log.warning("request %s failed on %s: %s", self.request.id, eid, err)
                if kv is not None and err.kv_lost and len(emitted) == num_before:
                    # The worker is fine and already ended the decode: generate there instead.
                    # No Cancel to it: a late one would cancel the retry (same request id).
                    queue.insert(i + 1, eid)
                else:
                    self._d.canceller.cancel_later(self.request.id, {eid: stub})
                if kv is not None and (len(emitted) > num_before or not err.unreachable):
                    self._drop_kv(first)
                    kv = None
            finally:
                self._d.pool.release(eid)
        raise WorkersFailed(f"no decode worker could finish request {self.request.id}")

    def _decode_call(
        self,
        stub: worker_pb2_grpc.WorkerAsyncStub,
        emitted: list[int],
        kv: common_pb2.KvHandle | None,
    ) -> aio.UnaryStreamCall:
        timeout_s = self._remaining_s()
        if kv is not None:
            return stub.Decode(messages.decode(self.request, emitted[0], kv), timeout=timeout_s)
        # Aggregated, or taking over from a failed decode: prompt plus what the client has.
        return stub.Generate(messages.generate(self.request, emitted), timeout=timeout_s)

    async def _stream(
        self, eid: EndpointId, call: aio.UnaryStreamCall
    ) -> AsyncGenerator[tuple[tuple[int, ...], FinishReason | None], None]:
        stall_s = self._d.settings.token_stall_timeout_s
        chunks = aiter(call)
        try:
            while True:
                try:
                    async with asyncio.timeout(stall_s):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    self._d.metrics.fallbacks.labels("token_stall").inc()
                    raise _WorkerFailed(eid, f"no token for {stall_s:g} s (stalled)") from None
                if chunk.finish_reason == common_pb2.FINISH_REASON_ERROR:
                    raise _WorkerFailed(eid, f"worker error: {chunk.error or 'unknown'}")
                if chunk.finish_reason == common_pb2.FINISH_REASON_CANCELLED:
                    # We did not ask (we would have stopped reading): the worker is going away.
                    raise _WorkerFailed(eid, "the worker cancelled the request")
                reason = messages.FINISH_FROM_PB.get(chunk.finish_reason)
                if chunk.token_ids or reason is not None:
                    yield tuple(chunk.token_ids), reason
                if reason is not None:
                    return
        except aio.AioRpcError as err:
            self._raise_if_final(eid, err)
            unreachable = err.code() == grpc.StatusCode.UNAVAILABLE
            kv_lost = err.code() == grpc.StatusCode.ABORTED
            raise _WorkerFailed(
                eid, str(err.code()), unreachable=unreachable, kv_lost=kv_lost
            ) from err
        finally:
            call.cancel()
        raise _WorkerFailed(eid, "stream ended without a finish reason")

    # -- helpers ---------------------------------------------------------------------------

    def _involve(self, eid: EndpointId) -> worker_pb2_grpc.WorkerAsyncStub | None:
        try:
            stub = self._d.pool.stub(eid)
        except KeyError:
            return None  # removed from the pool since placement
        self.endpoints[eid] = stub
        return stub

    def _drop_kv(self, first: worker_pb2.PrefillResponse | None) -> None:
        """Stop using the prefilled KV: tell its holder to free it."""
        if first is None or not first.HasField("kv"):
            return
        holder = EndpointId(first.kv.source_address)
        stub = self.endpoints.get(holder)
        if stub is None:
            # The handle names an address we do not know; tell every prefill worker we used.
            prefill = self.placement.prefill if self.placement is not None else ()
            self._d.canceller.cancel_later(
                self.request.id, {e: s for e, s in self.endpoints.items() if e in prefill}
            )
        else:
            self._d.canceller.cancel_later(self.request.id, {holder: stub})

    def _raise_if_final(self, eid: EndpointId, err: aio.AioRpcError) -> None:
        code = err.code()
        if code in _REJECTED:
            raise InvalidRequest(err.details() or f"worker {eid} rejected the request") from err
        # Our own deadline (give or take clock skew), not a worker's: do not retry.
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and self._remaining_s() <= 0.05:
            raise RequestTimeout(
                f"request {self.request.id} ran past {self._d.settings.request_timeout_s} s"
            ) from err

    def _remaining_s(self) -> float:
        remaining = self._deadline_s - self._d.clock.now_s()
        if remaining <= 0:
            raise RequestTimeout(
                f"request {self.request.id} ran past {self._d.settings.request_timeout_s} s"
            )
        return remaining

    def _fallback(self, reason: str) -> None:
        self._d.metrics.fallbacks.labels(reason).inc()
        log.info("request %s: fallback %s", self.request.id, reason)

    def _path_label(self) -> str:
        return self.path.value if self.path is not None else "none"
