"""The worker's gRPC edge: the `splitserve.v1.Worker` service over one `Engine`.

It owns what is the worker's rather than the engine's: the current role (changed at run time by
`SetRole`, never by a restart), draining, the load stream, the step stream (`WatchSteps`, fed
by the engine's `StepFeed`), health, metrics, and the translation between proto messages and
core types. Errors map to gRPC codes here and nowhere else: a request that can never fit ->
OUT_OF_RANGE; bad input -> INVALID_ARGUMENT; the wrong role -> FAILED_PRECONDITION; draining
-> UNAVAILABLE; no step stream from this engine -> UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.core.clock import Clock
from splitserve.core.errors import CapacityError, KvTransferError
from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.kv import KvHandle
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.request import (
    FinishReason,
    Request,
    SamplingSpec,
    TokenLogprobs,
    seed_of_bits,
)
from splitserve.core.roles import Role
from splitserve.obs.metrics import WorkerMetrics
from splitserve.obs.tracing import WorkerSpan, child_span, end_span, span_event
from splitserve.security import tls
from splitserve.security.authz import WORKER_METHODS, RoleInterceptor
from splitserve.security.owners import Owners
from splitserve.worker import mux
from splitserve.worker.coalesce import coalesce
from splitserve.worker.engine import (
    DEFAULT_STEP_BUFFER,
    Engine,
    StepSample,
    StepSubscription,
    TokenDelta,
)
from splitserve.worker.kv_pull_log import KvPullLog
from splitserve.worker.kv_source import KvSources

log = logging.getLogger(__name__)

ROLE_TO_PB = {
    Role.PREFILL: common_pb2.ROLE_PREFILL,
    Role.DECODE: common_pb2.ROLE_DECODE,
    Role.MIXED: common_pb2.ROLE_MIXED,
}
PB_TO_ROLE = {v: k for k, v in ROLE_TO_PB.items()}
FINISH_TO_PB = {
    None: common_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}
PULL_ID_METADATA: Final = "splitserve-pull-id"
"""ReleaseKv metadata: one id per KV pull, the same on each attempt of that pull, so that a
source asked again (its first answer came too late) answers as it did, and another pull of the
same handle is still refused."""
MAX_PULLS_REMEMBERED: Final = 4096
"""Most released-for-a-pull requests a worker remembers for pulls asking again."""
DEFAULT_LOAD_INTERVAL_S = 0.1
MIN_LOAD_INTERVAL_S = 0.01
"""The shortest `WatchLoad` interval a caller may ask for: a shorter one would pin a core."""
MAX_LOAD_INTERVAL_S = 3600.0


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    worker_id: str
    address: str


def sampling_from_pb(pb: common_pb2.SamplingParams) -> SamplingSpec:
    """The sampling spec of a request. Raises `ValueError` naming the field for bad values."""
    names = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty")
    for name in (*names, "repetition_penalty"):
        value = getattr(pb, name)
        if not math.isfinite(value):
            raise ValueError(f"sampling.{name} must be a finite number, got {value}")
    if not all(math.isfinite(v) for v in pb.logit_bias.values()):
        raise ValueError("sampling.logit_bias values must be finite numbers")
    return SamplingSpec(
        max_tokens=pb.max_tokens or 16,
        temperature=pb.temperature,
        top_p=pb.top_p or 1.0,
        seed=seed_of_bits(pb.seed) if pb.seeded or pb.seed else None,
        stop_token_ids=tuple(pb.stop_token_ids),
        ignore_eos=pb.ignore_eos,
        top_k=pb.top_k,
        min_p=pb.min_p,
        presence_penalty=pb.presence_penalty,
        frequency_penalty=pb.frequency_penalty,
        repetition_penalty=pb.repetition_penalty or 1.0,
        logit_bias=tuple(sorted(pb.logit_bias.items())),
        min_tokens=pb.min_tokens,
        bad_words=tuple(pb.bad_words),
        allowed_token_ids=tuple(pb.allowed_token_ids),
        logprobs=pb.top_logprobs if pb.logprobs else None,
        structured_outputs=pb.structured_outputs,
        prompt_logprobs=pb.prompt_top_logprobs if pb.prompt_logprobs else None,
    )


def logprobs_to_pb(lp: TokenLogprobs) -> common_pb2.TokenLogprobs:
    return common_pb2.TokenLogprobs(token_ids=lp.token_ids, logprobs=lp.logprobs, rank=lp.rank)


def prompt_logprobs_to_pb(
    lps: Sequence[TokenLogprobs | None],
) -> list[common_pb2.TokenLogprobs]:
    """A prompt's log probabilities; a position without any (the first) is an empty entry."""
    return [common_pb2.TokenLogprobs() if lp is None else logprobs_to_pb(lp) for lp in lps]


def kv_to_pb(kv: KvHandle) -> common_pb2.KvHandle:
    return common_pb2.KvHandle(
        transport=kv.transport,
        source_address=kv.source_address,
        source_request_id=kv.source_request_id,
        num_tokens=kv.num_tokens,
        num_bytes=kv.num_bytes,
        params_json=json.dumps(dict(kv.params)) if kv.params else "",
    )


def kv_from_pb(pb: common_pb2.KvHandle) -> KvHandle:
    """The handle of a `Decode`. Raises `ValueError` when `params_json` is not a JSON object."""
    params = None
    if pb.params_json:
        try:
            params = json.loads(pb.params_json)
        except ValueError as exc:  # json's errors and bad UTF-8 alike
            raise ValueError(f"kv.params_json is not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise ValueError("kv.params_json must be a JSON object")
    return KvHandle(
        transport=pb.transport,
        source_address=pb.source_address,
        source_request_id=RequestId(pb.source_request_id),
        num_tokens=pb.num_tokens,
        num_bytes=pb.num_bytes,
        params=params,
    )


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self,
        engine: Engine,
        role: Role,
        identity: WorkerIdentity,
        metrics: WorkerMetrics,
        clock: Clock,
    ) -> None:
        self.engine = engine
        self.role = role
        self.identity = identity
        self.metrics = metrics
        self.clock = clock
        self.draining = False
        self._load_seq = 0
        self._decode_spans: dict[str, Any] = {}
        """Open `worker.decode` spans by request id (tracing on): a KV pull's span joins it."""
        self.pull_log: KvPullLog | None = None
        """When set, each KV pull is written to it with the Decode's arrival (`kv_pull_log`)."""
        self._decode_received: dict[str, float] = {}
        """When each running Decode reached this worker, by request id (with `pull_log`)."""
        self._pull_tokens: dict[str, int] = {}
        """The prompt tokens of each running Decode's KV handle, by request id (a pull's
        tokens in `kv_pulled_tokens`)."""
        self.kv_pulled_tokens = 0
        self.kv_pull_seconds = 0.0
        """Totals of the KV pulls the engine reported (`LoadReport.kv_pulled_tokens` /
        `kv_pull_seconds`: a router fits this worker's pull rate from their growth)."""
        if hasattr(engine, "on_kv_pull"):  # engines that report their KV pulls (Sim, vLLM)
            engine.on_kv_pull = self.kv_pulled
        if hasattr(engine, "on_hold_expired"):  # engines that expire holds themselves (Sim)
            engine.on_hold_expired = lambda _rid: self.metrics.kv_holds_expired.inc()
        if hasattr(engine, "on_step_time"):  # engines that time their own steps (VllmEngine)
            engine.on_step_time = self.step_ran
        self.owners = Owners()
        """Who started each request (`security.owners`): Cancel / ReleaseKv act only for it."""
        self._pulls: OrderedDict[str, str] = OrderedDict()
        """The pull id (`PULL_ID_METADATA`) of each request whose KV ReleaseKv freed, newest
        last, at most `MAX_PULLS_REMEMBERED`."""
        self.kv_sources: KvSources | None = None
        """Checks a Decode's NIXL endpoint against its source's own (`worker.kv_source`)."""
        self.link_port = 0
        """The port of this worker's stream link (`worker.link`), reported in its load reports;
        0: none."""
        self._set_role_gauge()

    def step_ran(self, seconds: float | None, preempted: int) -> None:
        """The engine ran a step (`VllmEngine.on_step_time`, on its engine thread:
        prometheus_client's metrics are thread-safe); `seconds` None: it scheduled no token."""
        if seconds is not None:
            self.metrics.steps.inc()
            self.metrics.step_seconds.observe(seconds)
        if preempted:
            self.metrics.preemptions.inc(preempted)

    def kv_pulled(self, request_id: str, num_bytes: int, seconds: float) -> None:
        """The engine pulled a request's KV (`SimEngine.on_kv_pull`): the pull-time histogram,
        and a `worker.kv_pull` span under the request's decode span (bytes, seconds), and the
        load reports' pull totals. A pull's tokens are its Decode's KV handle's (the prompt
        tokens a router counts), else its bytes at the engine's KV bytes per token; neither
        known (a pull reported after its Decode ended, on an engine without that figure): not
        in the totals."""
        self.metrics.kv_pull_seconds.observe(seconds)
        tokens = self._pull_tokens.pop(str(request_id), 0)
        if not tokens:
            per_token = getattr(self.engine, "kv_bytes_per_token", 0)
            if isinstance(per_token, int) and per_token > 0:
                tokens = num_bytes // per_token
        if tokens > 0 and seconds > 0 and math.isfinite(seconds):
            self.kv_pulled_tokens += tokens
            self.kv_pull_seconds += seconds
        if self.pull_log is not None:
            rid = str(request_id)
            received = self._decode_received.get(rid)
            self.pull_log.record(rid, received, self.clock.now_s(), seconds, num_bytes)
        parent = self._decode_spans.get(str(request_id))
        if parent is not None:
            child_span(
                parent,
                "worker.kv_pull",
                seconds,
                {"splitserve.kv_bytes": num_bytes, "splitserve.kv_pull_s": seconds},
            )

    # -- requests -------------------------------------------------------------------------------

    async def _request(
        self,
        context: grpc.aio.ServicerContext,
        msg: worker_pb2.PrefillRequest | worker_pb2.DecodeRequest | worker_pb2.GenerateRequest,
        *,
        new_tokens: int | None = None,
    ) -> Request:
        """The core request of a Prefill / Decode / Generate message, with the router's SLO
        context (class, priority, TTFT budget on our clock), or INVALID_ARGUMENT naming what is
        wrong (bad sampling values, an empty prompt, prompt + new tokens beyond the engine's
        context limit)."""
        ctx = msg.slo if msg.HasField("slo") else None
        now_s = self.clock.now_s()
        budget = ctx.ttft_budget_s if ctx is not None else 0.0
        try:
            req = Request(
                id=RequestId(msg.request_id),
                prompt_token_ids=tuple(msg.prompt_token_ids),
                sampling=sampling_from_pb(msg.sampling),
                arrival_s=now_s,
                slo_class=SloClassName(msg.slo_class or "default"),
                priority=ctx.priority if ctx is not None else 0,
                deadline_s=now_s + budget if budget > 0 else None,  # the router's budget, our clock
            )
            self._check_context(req, req.sampling.max_tokens if new_tokens is None else new_tokens)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise AssertionError("unreachable") from err
        return req

    def _check_context(self, req: Request, new_tokens: int) -> None:
        if req.num_prompt_tokens == 0:
            raise ValueError("prompt_token_ids must hold at least one token")
        limit = getattr(self.engine, "max_model_len", None)
        if isinstance(limit, int) and limit > 0 and req.num_prompt_tokens + new_tokens > limit:
            raise ValueError(
                f"prompt ({req.num_prompt_tokens} tokens) + max_tokens ({new_tokens}) is more "
                f"than this worker's context limit (max_model_len {limit})"
            )

    async def _admit(
        self, context: grpc.aio.ServicerContext, rid: str, allowed: bool, what: str
    ) -> None:
        if not rid:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker is draining")
        if not allowed:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"worker role is {self.role}; cannot {what}"
            )
        self.owners.record(rid, tls.peer_fingerprint(context))

    async def _abort_for(self, context: grpc.aio.ServicerContext, err: Exception) -> None:
        if isinstance(err, CapacityError):
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(err))
        if isinstance(err, KvTransferError):
            await context.abort(grpc.StatusCode.ABORTED, f"KV transfer failed: {err}")
        if isinstance(err, ValueError):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        raise err

    async def Prefill(  # noqa: N802 - gRPC method names
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        await self._admit(context, request.request_id, self.role.can_prefill, "prefill")
        req = await self._request(context, request, new_tokens=1)
        span = WorkerSpan.start("worker.prefill", context, req)
        try:
            out = await self.engine.prefill(req)
            if span is not None:
                end_span(span, _prefill_attributes(out))
        except (CapacityError, KvTransferError, ValueError) as err:
            end_span(span, {"splitserve.outcome": "rejected"})
            self.metrics.requests.labels("prefill", "rejected").inc()
            await self._abort_for(context, err)
            raise
        except asyncio.CancelledError:
            self.metrics.requests.labels("prefill", "cancelled").inc()
            raise
        self.metrics.requests.labels("prefill", "ok").inc()
        self.metrics.prefill_tokens.inc(req.num_prompt_tokens)
        self.metrics.tokens.inc()
        return worker_pb2.PrefillResponse(
            request_id=request.request_id,
            first_token_id=out.first_token_id,
            kv=kv_to_pb(out.kv) if out.kv is not None else None,
            finish_reason=FINISH_TO_PB[out.finish_reason],
            num_prompt_tokens=req.num_prompt_tokens,
            queue_s=out.queue_s,
            prefill_s=out.prefill_s,
            prompt_logprobs=prompt_logprobs_to_pb(out.prompt_logprobs),
            first_token_logprobs=(
                logprobs_to_pb(out.first_logprobs) if out.first_logprobs is not None else None
            ),
        )

    async def Decode(  # noqa: N802
        self, request: worker_pb2.DecodeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        received_s = self.clock.now_s()
        trace = getattr(self.engine, "kv_trace", None)  # SPLITSERVE_KV_TRACE (vLLM engines)
        if trace is not None and not request.kv_follows:
            trace.received(request.request_id)
        await self._admit(context, request.request_id, self.role.can_decode, "decode")
        first_token_id, kv_pb = request.first_token_id, request.kv
        prepared = False  # the engine processed the decode's input ahead (`prepare_decode`)
        if request.kv_follows:
            # Sent before the prefill answered (`worker.mux`): check the request now, then wait
            # for its first token and KV handle (a cancel, or the stream ending, stops the wait).
            handoff = getattr(context, "handoff", None)
            if handoff is None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "kv_follows needs a Multiplex sub-request (its KV comes as MuxOp.decode_kv)",
                )
            if request.HasField("kv") or request.first_token_id:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "kv_follows: first_token_id and kv come in MuxOp.decode_kv, not here",
                )
            req = await self._request(context, request)
            assert handoff is not None  # abort raised
            # While the prefill runs, the engine may process the input (vLLM's, with a
            # placeholder for the first token), so that the KV's arrival finds less to do.
            prepared = self.engine.prepare_decode(req)
            try:
                follow: worker_pb2.DecodeKv = await handoff
            except BaseException:
                if prepared:
                    self.engine.discard_prepared(req.id)
                raise
            if self.draining:  # drained while it waited: the router takes the KV elsewhere
                await context.abort(grpc.StatusCode.UNAVAILABLE, "worker is draining")
            received_s = self.clock.now_s()
            # Arrived now, as an ordinary Decode would have; its first-token deadline (the
            # router's budget re-based when the message came) stays where it was.
            req = replace(req, arrival_s=received_s)
            if trace is not None:
                trace.received(request.request_id)
            first_token_id, kv_pb = follow.first_token_id, follow.kv
            if not follow.HasField("kv"):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "decode needs a KV handle")
        else:
            if not request.HasField("kv"):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "decode needs a KV handle")
            req = await self._request(context, request)
        try:
            kv = kv_from_pb(kv_pb)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        problem = kv_handle_problem(kv, req.num_prompt_tokens, self.engine)
        if problem is not None:
            log.warning("refused a KV handle from %s: %s", context.peer(), problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        problem = await self.kv_sources.problem(kv) if self.kv_sources is not None else None
        if problem is not None:  # ABORTED: the router generates from the prompt instead
            log.warning("refused a KV handle from %s: %s", context.peer(), problem)
            await context.abort(grpc.StatusCode.ABORTED, f"KV transfer refused: {problem}")
        self.metrics.kv_transfer_bytes.inc(kv.num_bytes)
        span = WorkerSpan.start(
            "worker.decode", context, req, {"splitserve.kv_bytes": kv.num_bytes}
        )
        if span is not None:
            self._decode_spans[str(req.id)] = span
        if self.pull_log is not None:
            self._decode_received[str(req.id)] = received_s
        self._pull_tokens[str(req.id)] = kv.num_tokens
        try:
            stream = self.engine.decode(req, first_token_id, kv)
            async for chunk in self._relay("decode", req, stream, context, span):
                yield chunk
        finally:
            if prepared:  # used when the decode was added; otherwise not needed any more
                self.engine.discard_prepared(req.id)
            self._decode_spans.pop(str(req.id), None)
            self._decode_received.pop(str(req.id), None)
            self._pull_tokens.pop(str(req.id), None)

    async def Generate(  # noqa: N802
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        await self._admit(context, request.request_id, self.role.can_generate, "generate")
        req = await self._request(context, request)
        self.metrics.prefill_tokens.inc(req.num_prompt_tokens)
        span = WorkerSpan.start("worker.generate", context, req)
        stream = self.engine.generate(req)
        async for chunk in self._relay("generate", req, stream, context, span):
            yield chunk

    async def _relay(
        self,
        kind: str,
        req: Request,
        stream: AsyncIterator[TokenDelta],
        context: grpc.aio.ServicerContext,
        span: Any = None,
    ) -> AsyncIterator[common_pb2.TokenChunk]:
        """Forward engine deltas as chunks (those that pile up while a chunk is being sent go
        out together: `coalesce`); count the outcome; cancel if the caller goes away."""
        outcome = "cancelled"
        stream = coalesce(stream)
        try:
            try:
                first = True
                async for delta in stream:
                    if delta.token_ids and span is not None:
                        if first:
                            span_event(span, "first_token")
                            first = False
                        span_event(span, "token", {"splitserve.tokens": len(delta.token_ids)})
                    self.metrics.tokens.inc(len(delta.token_ids))
                    if delta.finish_reason is not None:
                        outcome = _outcome(delta.finish_reason)
                    yield common_pb2.TokenChunk(
                        request_id=req.id,
                        token_ids=list(delta.token_ids),
                        finish_reason=FINISH_TO_PB[delta.finish_reason],
                        num_prompt_tokens=req.num_prompt_tokens,
                        error=delta.error or "",
                        logprobs=[logprobs_to_pb(lp) for lp in delta.logprobs],
                        prompt_logprobs=prompt_logprobs_to_pb(delta.prompt_logprobs),
                    )
            except (CapacityError, KvTransferError, ValueError) as err:
                outcome = "rejected"
                await self._abort_for(context, err)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
            self.owners.forget(req.id)
            self.metrics.requests.labels(kind, outcome).inc()
            end_span(span, {"splitserve.outcome": outcome})

    async def Multiplex(  # noqa: N802
        self,
        request_iterator: AsyncIterator[worker_pb2.MuxRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[worker_pb2.MuxResponse]:
        """Prefill / Decode / Generate sub-requests over one stream (`worker.mux`)."""
        async for batch in mux.serve(self, request_iterator, context):
            yield batch

    async def Cancel(  # noqa: N802
        self, request: worker_pb2.CancelRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.CancelResponse:
        if not self.owners.allows(request.request_id, tls.peer_fingerprint(context)):
            # The same answer as an unknown id: which ids are in flight stays private.
            rid, caller = request.request_id, context.peer()
            log.warning("refused Cancel %s from %s: not its owner", rid, caller)
            return worker_pb2.CancelResponse(found=False)
        found = await self.engine.cancel(RequestId(request.request_id))
        if found:
            log.info("cancelled %s", request.request_id)
        return worker_pb2.CancelResponse(found=found)

    async def ReleaseKv(  # noqa: N802
        self, request: worker_pb2.ReleaseKvRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ReleaseKvResponse:
        who = tls.peer(context)
        from_worker = who is not None and who.role == "worker"  # the decode worker that pulled
        if not from_worker and not self.owners.allows(
            request.request_id, tls.peer_fingerprint(context)
        ):
            log.warning(
                "refused ReleaseKv %s from %s: not its owner", request.request_id, context.peer()
            )
            return worker_pb2.ReleaseKvResponse(found=False)
        rid = request.request_id
        pull_id = _metadata_value(context, PULL_ID_METADATA)
        again = bool(pull_id) and self._pulls.get(rid) == pull_id
        if pull_id and not again:
            # Remembered before the release: this handler may be cancelled (the caller's
            # deadline) once the KV is freed, and the pull's next attempt must find it.
            self._pulls[rid] = pull_id
            while len(self._pulls) > MAX_PULLS_REMEMBERED:
                self._pulls.popitem(last=False)
        found = await self.engine.release_kv(RequestId(rid))
        if found:
            self.owners.forget(rid)
        elif again:
            # The same pull asking again (our first answer reached it too late): it had the KV.
            log.info("ReleaseKv %s asked again by the same pull: it was released for it", rid)
            found = True
        elif pull_id and self._pulls.get(rid) == pull_id:
            del self._pulls[rid]  # nothing was released for this pull
        return worker_pb2.ReleaseKvResponse(found=found)

    # -- control --------------------------------------------------------------------------------

    def load_report(self) -> common_pb2.LoadReport:
        s = self.engine.load()
        self._load_seq += 1
        m = self.metrics
        m.queue.set(s.num_waiting)
        m.running.set(s.num_running)
        m.kv_blocks_free.set(s.kv_blocks_free)
        m.kv_blocks_total.set(s.kv_blocks_total)
        m.kv_held.set(s.num_kv_held)
        return common_pb2.LoadReport(
            worker_id=self.identity.worker_id,
            role=ROLE_TO_PB[self.role],
            num_waiting=s.num_waiting,
            num_running=s.num_running,
            kv_blocks_free=s.kv_blocks_free,
            kv_blocks_total=s.kv_blocks_total,
            kv_block_size=s.kv_block_size,
            draining=self.draining,
            num_pending_prefill_tokens=s.num_pending_prefill_tokens,
            num_kv_held=s.num_kv_held,
            seq=self._load_seq,
            engine=self.engine.kind,
            model=self.engine.model,
            link_port=self.link_port,
            kv_pulled_tokens=self.kv_pulled_tokens,
            kv_pull_seconds=self.kv_pull_seconds,
        )

    async def WatchLoad(  # noqa: N802
        self, request: worker_pb2.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.LoadReport]:
        interval_s = request.interval_s or DEFAULT_LOAD_INTERVAL_S
        if not MIN_LOAD_INTERVAL_S <= interval_s <= MAX_LOAD_INTERVAL_S:  # NaN fails too
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"interval_s must be 0 (the default, {DEFAULT_LOAD_INTERVAL_S} s) or between "
                f"{MIN_LOAD_INTERVAL_S} and {MAX_LOAD_INTERVAL_S} s, got {request.interval_s}",
            )
        while True:
            yield self.load_report()
            await asyncio.sleep(interval_s)

    async def _subscribe_steps(
        self, request: worker_pb2.WatchStepsRequest, context: grpc.aio.ServicerContext
    ) -> StepSubscription:
        """The step feed for `WatchSteps` / `WatchStepBatches`; UNIMPLEMENTED without one."""
        feed = self.engine.steps
        if feed is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"the {self.engine.kind} engine does not report its steps",
            )
            raise AssertionError("unreachable: abort raises")
        rate = request.max_samples_per_s
        if not (math.isfinite(rate) and rate >= 0):  # NaN fails too
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_samples_per_s must be 0 (every step) or a positive finite number, got {rate}",
            )
        return feed.subscribe(
            request.max_buffer or DEFAULT_STEP_BUFFER, 1.0 / rate if rate > 0 else 0.0
        )

    async def WatchSteps(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.StepSample]:
        sub = await self._subscribe_steps(request, context)
        try:
            # Headers go out now: a caller that awaits them knows no later step is missed.
            await context.send_initial_metadata((("splitserve-watch-steps", "1"),))
            async for sample in sub:
                yield step_to_pb(sample, sub.dropped)
        finally:  # the caller went away (cancelled) or the server stops
            sub.close()

    async def WatchStepBatches(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.StepSampleBatch]:
        """`WatchSteps`, the samples that queued during the previous write in one message."""
        sub = await self._subscribe_steps(request, context)
        try:
            await context.send_initial_metadata((("splitserve-watch-steps", "1"),))
            while True:
                samples = await sub.get_all()
                yield worker_pb2.StepSampleBatch(
                    samples=[step_to_pb(s, sub.dropped) for s in samples]
                )
        finally:
            sub.close()

    async def Drain(  # noqa: N802
        self, request: worker_pb2.DrainRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DrainResponse:
        self.draining = not request.resume
        self.metrics.draining.set(1 if self.draining else 0)
        log.info("drain=%s (in flight: %d)", self.draining, self.engine.in_flight)
        if self.draining and request.wait:
            await self._wait_idle(request.timeout_s if request.timeout_s > 0 else None)
        return worker_pb2.DrainResponse(draining=self.draining, in_flight=self.engine.in_flight)

    async def SetRole(  # noqa: N802
        self, request: worker_pb2.SetRoleRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.SetRoleResponse:
        new = PB_TO_ROLE.get(request.role)
        if new is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "role must be prefill, decode or mixed"
            )
            raise AssertionError("unreachable")
        previous = self.role
        if new != previous:
            self.role = new
            self.metrics.role_changes.inc()
            self._set_role_gauge()
            log.info("role %s -> %s", previous, new)
        return worker_pb2.SetRoleResponse(previous=ROLE_TO_PB[previous], current=ROLE_TO_PB[new])

    def _set_role_gauge(self) -> None:
        for r in Role:
            self.metrics.role.labels(r.value).set(1 if r is self.role else 0)

    async def _wait_idle(self, timeout_s: float | None) -> None:
        """Until no request is in flight (polled: drains are rare and short), or the timeout."""
        deadline = None if timeout_s is None else self.clock.now_s() + timeout_s
        while self.engine.in_flight > 0:
            if deadline is not None and self.clock.now_s() >= deadline:
                return
            await asyncio.sleep(0.02)


MAX_KV_BYTES_PER_TOKEN: Final = 16 << 20
"""No model's KV needs more per token (a 405B model in fp16: about 0.5 MiB): the byte cap of a
handle when the engine does not say its own size."""


def kv_handle_problem(kv: KvHandle, prompt_tokens: int, engine: object) -> str | None:
    """Why a `Decode`'s KV handle cannot be genuine, or None. Its tokens must be the prompt's
    (never more than the context the request was admitted with) and its bytes at most what that
    many tokens take in this engine (`kv_bytes_per_token`, else `MAX_KV_BYTES_PER_TOKEN`): a
    forged handle must not pin KV or inflate `kv_transfer_bytes_total`. Where the handle's source
    may point: the router passes only handles of current pool members (`router.kv_source`), a
    NIXL endpoint must be the source's own (`worker.kv_source`), and with internal TLS the decode
    worker connects only to a peer presenting a worker certificate of its CA (docs/security.md)."""
    if kv.num_tokens > prompt_tokens:
        return f"kv.num_tokens ({kv.num_tokens}) is more than the prompt ({prompt_tokens} tokens)"
    per_token = getattr(engine, "kv_bytes_per_token", 0)
    if not isinstance(per_token, int) or per_token <= 0:
        per_token = MAX_KV_BYTES_PER_TOKEN
    cap = per_token * max(1, kv.num_tokens)
    if kv.num_bytes > cap:
        return (
            f"kv.num_bytes ({kv.num_bytes}) is more than {kv.num_tokens} tokens of KV take "
            f"({cap} bytes)"
        )
    return None


def step_to_pb(sample: StepSample, dropped: int = 0) -> worker_pb2.StepSample:
    b = sample.batch
    return worker_pb2.StepSample(
        index=sample.index,
        start_s=sample.start_s,
        duration_s=sample.duration_s,
        prefill_chunks=[
            worker_pb2.PrefillChunk(new_tokens=n, context_tokens=ctx) for n, ctx in b.prefill_chunks
        ],
        decode_context_tokens=list(b.decode_contexts),
        num_seqs=sample.num_seqs,
        dropped=dropped,
    )


def step_from_pb(pb: worker_pb2.StepSample) -> StepSample:
    return StepSample(
        index=pb.index,
        start_s=pb.start_s,
        duration_s=pb.duration_s,
        batch=BatchShape(
            prefill_chunks=tuple((c.new_tokens, c.context_tokens) for c in pb.prefill_chunks),
            decode_contexts=tuple(pb.decode_context_tokens),
        ),
    )


def _outcome(reason: FinishReason) -> str:
    return "ok" if reason in (FinishReason.LENGTH, FinishReason.STOP) else reason.value


def bind(host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Create a server and bind its port (0 picks one); nothing is served until `start`.

    With internal TLS, callers must present a certificate of this worker's service (the URI SAN
    of its own certificate), or the operator's (which manages every service of its CA)."""
    ident = tls.identity()
    interceptors = (
        [RoleInterceptor(WORKER_METHODS, service=ident.own_service(), any_service={"operator"})]
        if ident is not None
        else []
    )
    server = grpc.aio.server(interceptors=interceptors)
    bound = tls.add_port(server, f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC to {host}:{port}")
    return server, bound


def bind_health(host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """A plaintext server that serves only `grpc.health.v1.Health` (kubelet's gRPC probe cannot
    present a client certificate, so with internal TLS the probes use this port). It answers
    SERVING / NOT_SERVING and nothing else: no prompt, no control."""
    server = grpc.aio.server()
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind the health port {host}:{port}")
    return server, int(bound)


async def start(
    server: grpc.aio.Server,
    service: WorkerService,
    health_server: grpc.aio.Server | None = None,
) -> None:
    """Attach the Worker and health services and start serving (`health_server`: the same
    health service on a plaintext port of its own, `bind_health`)."""
    worker_pb2_grpc.add_WorkerServicer_to_server(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if health_server is not None:
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
        await health_server.start()
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("splitserve.v1.Worker", health_pb2.HealthCheckResponse.SERVING)


def _prefill_attributes(out: Any) -> dict[str, str | int | float]:
    """The prefill's own report (queue wait, prefill time, KV registered) as span attributes."""
    attrs: dict[str, str | int | float] = {
        "splitserve.queue_s": out.queue_s,
        "splitserve.prefill_s": out.prefill_s,
        "splitserve.outcome": "ok",
    }
    if out.kv is not None:
        attrs["splitserve.kv_bytes"] = out.kv.num_bytes
    return attrs


def _metadata_value(context: grpc.aio.ServicerContext, key: str) -> str:
    """The value of invocation metadata `key` ("" when absent)."""
    for item in context.invocation_metadata() or ():
        if item[0] == key:
            value = item[1]
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return ""
