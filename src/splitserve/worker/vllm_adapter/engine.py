"""`VllmEngine`: the worker's `Engine` protocol over an in-process vLLM V1 engine.

One engine serves every role, so a role change needs no restart or reload:

* `prefill` runs the prompt with `max_tokens=1` and `kv_transfer_params={"do_remote_decode":
  True}`; vLLM keeps the KV blocks (for a lease, `kv_hold_timeout_s`) and answers with the
  `kv_transfer_params` a decode engine needs, which become `KvHandle(transport="nixl", params=...)`;
* `decode` continues the request from the prefill's first token: it hands vLLM the prompt plus
  that token with the prefill's params (`do_remote_prefill`); vLLM's NixlConnector pulls the
  prompt's KV from the prefill engine (no more: `nixl.clip_pulls`), and the first step computes
  the first token's position and samples the second — no step is spent recomputing the prompt's
  last position or re-sampling a token the caller already has (one engine step still only
  waits for the KV, unless `nixl.PullInStep` (opt-in) pulls it inside that first step);
* `generate` runs the whole request (aggregated).

vLLM runs in the worker process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: no engine-core process) on
one dedicated thread that owns it: requests and aborts reach that thread through a queue, tokens
come back to the asyncio loop with `call_soon_threadsafe`. The thread steps while vLLM has work
(including KV held for a pull, whose release needs steps to notice) and sleeps otherwise.

While a `WatchSteps` watcher is subscribed (`steps`), each step's shape is taken from the
scheduler's output (the scheduler instance's `schedule()` is wrapped) and the step is timed around
`engine.step()` with the worker's clock; with nobody watching the wrapper only checks that.

The step policy runs inside vLLM's scheduler (`scheduler.py`); KV transfer is vLLM's
NixlConnector (`kv_role="kv_both"`: every engine can both serve and pull KV). vLLM, torch and
NIXL are imported when the engine starts, never at module import.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from splitserve.core.clock import Clock, SystemClock
from splitserve.core.errors import CapacityError, EngineError, KvTransferError
from splitserve.core.ids import RequestId
from splitserve.core.kv import KvHandle
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.request import FinishReason, Request, SamplingSpec, TokenLogprobs
from splitserve.worker.engine import (
    LoadSnapshot,
    PrefillOutcome,
    StepFeed,
    StepSample,
    TokenDelta,
)
from splitserve.worker.kv_warm import warmup_ms
from splitserve.worker.vllm_adapter import guided
from splitserve.worker.vllm_adapter.guided import GrammarCatchUp, structured_params
from splitserve.worker.vllm_adapter.held_backoff import HeldBackoff, held_pause, held_poll_max_s
from splitserve.worker.vllm_adapter.host import cpus_from_env, pin_process
from splitserve.worker.vllm_adapter.kvtrace import KvTrace
from splitserve.worker.vllm_adapter.nixl import (
    PullDriver,
    PullInStep,
    WarmReads,
    WarmupWindow,
    clip_pulls,
    expire_send,
    kv_state,
)
from splitserve.worker.vllm_adapter.nixl import progress_thread as nixl_progress_thread
from splitserve.worker.vllm_adapter.output_history import FirstTokenAsOutput
from splitserve.worker.vllm_adapter.stats import EngineObserver, KvPullHook, StepHook

log = logging.getLogger(__name__)

SLO_ARG: Final = "splitserve_slo"
"""The `extra_args` key carrying a request's SLO class, priority and deadline to the shim."""

KV_TRANSPORT = "nixl"
HANDOFF_KEY = "splitserve_prefilled_tokens"
"""In a decode's `kv_transfer_params`: how many tokens of its prompt the prefill computed (the
prompt; the decode's prompt has the first token appended). vLLM pulls that many, no more."""
PULL_POLL_S = 0.01
"""Longest the engine thread polls in-flight KV reads before its next engine step."""
PROGRESS_THREAD_ENV = "SPLITSERVE_NIXL_PROGRESS_THREAD"
"""`1` turns NIXL's progress thread on for engines whose config leaves it off (for comparisons)."""
PULL_IN_STEP_ENV = "SPLITSERVE_KV_PULL_IN_STEP"
"""`0` turns the in-step KV pull off, `1` on, overriding `VllmEngineConfig.kv_pull_in_step`."""
HELD_POLL_ENV = "SPLITSERVE_KV_HELD_POLL_MS"
"""Milliseconds between the engine's steps while it only holds KV for pulls (or has only
transfers left): how soon a peer's READ completion (its notification) is progressed here.
Default 5; for comparisons (docs/benchmarks.md, fresh pairs run 3)."""
HANDOFF_ENV = "SPLITSERVE_KV_HANDOFF_MS"
"""How long (ms) after handing a request's KV out the engine progresses NIXL every
`HANDOFF_POLL_S` while it only holds KV (until a READ notification arrives): 0 to 10000, default
200; `0` = the behaviour before (a step every `SPLITSERVE_KV_HELD_POLL_MS`), for comparisons."""
HANDOFF_DEFAULT_MS = 200
HANDOFF_POLL_S = 0.0005
"""How often the engine progresses NIXL while a hand-off's READ is awaited (`nixl.WarmupWindow.
wait`): a notification read call, not an engine step."""
WARMUP_POLL_S = 0.001
"""While a peer warms up with this engine (`serve_kv_warmup`), or this engine's own warm-up READ
is in flight, the engine thread progresses NIXL this often even while idle (else: every
`IDLE_WAIT_S` at most, and only its own READs)."""
IDLE_WAIT_S = 0.05
"""How long an idle engine thread waits for a command before looking again."""
PREPARE_DECODE_ENV = "SPLITSERVE_KV_PREPARE_DECODE"
"""`1`: an early Decode's input is processed ahead, while its prefill runs (`prepare_decode`);
`alternate`: every other early Decode's, for an A/B on one worker; off by default
(docs/benchmarks.md, "Where the KV-only step goes")."""
WARM_READ_ENV = "SPLITSERVE_KV_WARM_READ"
"""`0`: `warm_kv` makes no warm-up READ (handshake and connection only), for comparisons."""

_FINISH = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "abort": FinishReason.CANCELLED,
    "error": FinishReason.ERROR,
}


@dataclass(frozen=True, slots=True)
class VllmEngineConfig:
    """How to build the vLLM engine. `engine_args` passes anything else to `EngineArgs`."""

    model: str
    """A Hugging Face model directory (or hub name where the hub is reachable)."""
    address: str = ""
    """This worker's gRPC address: `KvHandle.source_address`, where decode workers send
    ReleaseKv (the NIXL endpoint itself travels in `KvHandle.params`)."""
    served_model_name: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    enforce_eager: bool = True
    """CUDA graphs / torch.compile off: seconds to start instead of a minute."""
    seed: int = 0
    kv_connector: str | None = "NixlConnector"
    """None: no KV transfer (the engine can only `generate`)."""
    kv_buffer_device: str | None = None
    """None: vLLM's default for the platform ("cpu" on CPU, "cuda" on GPUs)."""
    nixl_side_channel_host: str | None = None
    nixl_side_channel_port: int | None = None
    """Where decode engines reach this engine's NIXL metadata; process-wide (env) in vLLM.
    None: vLLM's setting (`VLLM_NIXL_SIDE_CHANNEL_PORT`, default 5600); 0: any free port (several
    workers on one host)."""
    kv_hold_timeout_s: float = 30.0
    """How long a prefilled KV stays held if no decode engine pulls it (vLLM's KV lease)."""
    nixl_progress_thread: bool = False
    """Run NIXL's progress thread. vLLM 0.32 starts it with no delay between polls, so it spins a
    whole core even when nothing moves. Off (the default), the engine's own polls progress the
    transfers: the decode engine checks its reads every step, the prefill engine its
    notifications every step while it holds KV (docs/engines.md, "Idle CPU")."""
    kv_pull_in_step: bool = False
    """Pull a decode's KV inside the engine step that computes its first position (vLLM's sync
    load, `nixl.PullInStep`) once the pair has shaken hands, so that step yields token 2.
    Opt-in, not yet the default: a `make bench-kv` run had the decode engine fail on its first
    in-step pull, cause not found yet (docs/engines.md, "KV transfer"). False (the default):
    vLLM's async load (one engine step more before token 2; the READ never holds a step of
    other requests, which matters for long transfers over RDMA)."""
    cpus: tuple[int, ...] | None = None
    """Cores for the whole worker process (every thread: vLLM's, torch's, NIXL's, gRPC's).
    None: the cores named by `VLLM_CPU_OMP_THREADS_BIND` when it is a core list ("0", "0-3",
    "0,2"), else no pinning. Either way the engine undoes vLLM's CPU NixlConnector pinning its
    engine thread to the machine's last core."""
    batching: str | None = None
    """A registered `policy.batching` name run inside vLLM's scheduler (None: FCFS)."""
    batching_params: Mapping[str, Any] = field(default_factory=dict)
    use_scheduler_shim: bool = True
    engine_args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


@dataclass(slots=True)
class _Stream:
    """One request in flight, as seen from the asyncio side."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[_Item]
    mode: str
    num_out: int = 0
    submitted_s: float = field(default_factory=time.monotonic)
    internal: str | None = None
    """vLLM's id of the request (`add_request` appends to ours), set on the engine thread."""
    cancelled: bool = False
    """`cancel` took it while it ran (its result may still come: it is not the caller's)."""

    def put(self, item: _Item) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass(frozen=True, slots=True)
class _Out:
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    kv_transfer_params: Mapping[str, Any] | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()


_Item = _Out
_Command = Callable[[Any], None]
ReleaseFn = Callable[[KvHandle], Awaitable[None]]
"""Tells a prefill worker its KV was pulled (the worker runtime's ReleaseKv client)."""


class VllmEngine:
    """The worker `Engine` over vLLM (`kind = "vllm"`)."""

    kind = "vllm"

    def __init__(
        self,
        config: VllmEngineConfig,
        release_remote: ReleaseFn | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.steps: StepFeed | None = StepFeed()
        """Step samples for `WatchSteps`: the scheduler output of each step (scheduled tokens
        per request and their computed context), timed around `engine.step()`."""
        self._step_shape: BatchShape | None = None
        self._release_remote = release_remote
        self._tasks: set[asyncio.Task[None]] = set()
        self.model = config.name
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._streams: dict[RequestId, _Stream] = {}
        self._held: dict[RequestId, tuple[float, str]] = {}
        """Prefills whose KV vLLM holds for a pull: until when we count them, vLLM's id."""
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._ready: asyncio.Future[None] | None = None
        self._snapshot = LoadSnapshot(0, 0, 0, 0, 0, 0, 0)
        self._engine: Any = None
        self._bytes_per_token = 0
        self._endpoint: dict[str, Any] = {}
        self.num_steps = 0
        self.prefill_tokens = 0
        self.generated_tokens = 0
        self.kv_pulled_bytes = 0
        self.kv_warm_read_descs = 0
        """NIXL descriptors read by `warm_kv`'s warm-up READs (`nixl.WarmReads`)."""
        self._warm_reads = WarmReads()
        self._warm_read = warm_read_on()
        self._warm_poll_s = warmup_ms() / 1000
        """How long the engine thread polls its own warm-up READ closely (0: every
        `IDLE_WAIT_S`, as before `SPLITSERVE_KV_WARMUP_MS`)."""
        self._warm_poll_until = 0.0
        self._warmup: WarmupWindow | None = None
        """Progresses NIXL while peers warm up with this engine (`serve_kv_warmup`)."""
        self._held_poll_s = held_poll_s()
        self._held_poll_max_s = held_poll_max_s(self._held_poll_s)
        """Longest pause between steps while only unchanged held KV is left (`held_backoff`)."""
        self.held_pauses: list[float] | None = None
        """When a list (tests): every back-off pause the engine thread took, in order."""
        self._handoff_s = handoff_ms() / 1000
        """How long each hand-off is awaited closely (`SPLITSERVE_KV_HANDOFF_MS`; 0: not)."""
        self.kv_warm_read_error: str | None = None
        """Why the latest warm-up READ was not made (the pair works without it)."""
        self._grammars: GrammarCatchUp | None = None
        self._history: FirstTokenAsOutput | None = None
        self._in_step: PullInStep | None = None
        self.on_step_time: StepHook | None = None
        self.on_kv_pull: KvPullHook | None = None
        """Set by the worker service: each step's time and each decode's KV pull (`stats.py`)."""
        self._observer = EngineObserver(self)
        self._trace: KvTrace | None = KvTrace.from_env()
        """`SPLITSERVE_KV_TRACE`: timestamps of each decode's token 1 -> token 2 (`kvtrace.py`)."""
        self._prepared: dict[str, _Prepared] = {}
        """Early Decodes' vLLM input, processed before their first token came (`prepare_decode`);
        read and written on the engine thread only."""
        self._prepare = prepare_decode_mode()
        self._prepare_calls = 0
        self.decodes_prepared = 0
        """Decodes added to vLLM from a prepared input (`prepare_decode`)."""

    @property
    def kv_trace(self) -> KvTrace | None:
        """The `SPLITSERVE_KV_TRACE` tracer (None when off): the worker service marks when a
        Decode call reaches it."""
        return self._trace

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("engine already started")
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="vllm-engine", daemon=True
        )
        self._thread.start()
        await self._ready

    async def stop(self) -> None:
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join)
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(_Out((), FinishReason.CANCELLED))
        self._streams.clear()
        self._held.clear()

    # -- the Engine protocol ----------------------------------------------------------------

    async def prefill(self, request: Request) -> PrefillOutcome:
        self._check_fits(request, 1)
        params = {"do_remote_decode": True} if self.config.kv_connector else None
        if request.sampling.max_tokens == 1:
            params = None  # the first token ends it: nothing to hand over
        stream = self._submit(request, "prefill", max_tokens=1, kv_params=params)
        first: int | None = None
        first_logprobs: TokenLogprobs | None = None
        prompt: tuple[TokenLogprobs | None, ...] = ()
        out = _Out((), None)
        try:
            while True:
                out = await stream.queue.get()
                if out.error:
                    raise EngineError(out.error)
                prompt = prompt or out.prompt_logprobs
                if out.token_ids and first is None:
                    first = out.token_ids[0]
                    first_logprobs = out.logprobs[0] if out.logprobs else None
                if out.finish_reason is not None:
                    break
        finally:
            if self._streams.get(request.id) is stream:
                del self._streams[request.id]
                if out.finish_reason is None:  # cancelled or failed while running: drop it
                    self._abort(request.id, stream)
        if stream.cancelled:  # its KV lease, if vLLM had finished it, ends in `_abort`
            raise EngineError(f"prefill of {request.id!r} was cancelled")
        if first is None:
            raise EngineError(
                f"prefill of {request.id!r} ended without a token ({out.finish_reason})"
            )
        self.prefill_tokens += request.num_prompt_tokens
        finish = self._prefill_finish(request, first, out.finish_reason)
        kv = None
        if finish is None:
            # JSON-able (tuples become lists): the handle travels to the decode worker.
            kvp = json.loads(json.dumps(out.kv_transfer_params or {}))
            if not kvp:
                raise KvTransferError(f"vLLM returned no kv_transfer_params for {request.id!r}")
            internal = str(kvp.get("remote_request_id") or request.id)
            self._held[request.id] = (time.monotonic() + self.config.kv_hold_timeout_s, internal)
            kv = KvHandle(
                transport=KV_TRANSPORT,
                source_address=self.config.address,
                source_request_id=request.id,
                num_tokens=request.num_prompt_tokens,
                num_bytes=self._bytes_per_token * request.num_prompt_tokens,
                params=kvp,
            )
        # vLLM's own stamps (queued -> scheduled -> first token); without them, all is prefill.
        queue_s, prefill_s = self._observer.times.pop(str(request.id)) or (
            0.0,
            time.monotonic() - stream.submitted_s,
        )
        return PrefillOutcome(
            first_token_id=first,
            kv=kv,
            finish_reason=finish,
            queue_s=queue_s,
            prefill_s=prefill_s,
            first_logprobs=first_logprobs,
            prompt_logprobs=prompt,
        )

    def decode(
        self, request: Request, first_token_id: int, kv: KvHandle
    ) -> AsyncIterator[TokenDelta]:
        # Everything, checks included, happens on the first iteration: errors surface where the
        # caller consumes the stream (as with the simulated engine).
        return self._decode(request, first_token_id, kv)

    async def _decode(
        self, request: Request, first_token_id: int, kv: KvHandle
    ) -> AsyncIterator[TokenDelta]:
        if kv.transport != KV_TRANSPORT or not kv.params:
            raise KvTransferError(f"cannot pull KV over {kv.transport!r} (this engine: nixl)")
        if not self.config.kv_connector:
            raise KvTransferError("this engine has no KV connector configured")
        self._check_fits(request, request.sampling.max_tokens)
        if request.sampling.max_tokens <= 1:  # the first token was the last: nothing to decode
            self._release(kv)
            yield TokenDelta((), FinishReason.LENGTH)
            return
        # Decode starts from the prefill's first token: the prompt plus that token, with the KV
        # of the prompt pulled (HANDOFF_KEY clips vLLM's pull to the tokens the prefill
        # computed). Its first step computes the first token's position and samples token 2.
        params = {
            **dict(kv.params),
            "do_remote_prefill": True,
            "do_remote_decode": False,
            HANDOFF_KEY: request.num_prompt_tokens,
        }
        continued = _continued(request, first_token_id)
        if self._trace is not None:
            self._trace.begin(str(request.id))
        stream = self._submit(continued, "decode", kv_params=params)
        self.kv_pulled_bytes += kv.num_bytes
        deltas = self._deltas(request.id, stream, pulled=kv)
        async with contextlib.aclosing(deltas):
            async for delta in deltas:
                yield delta

    def prepare_decode(self, request: Request) -> bool:
        """An early Decode (`kv_follows`, sent before its prefill answered): run vLLM's input
        processing for `request` continued from its first token now, on the engine thread, while
        the prefill runs elsewhere. The first token is not known yet: the input is built with a
        placeholder (the prompt's last token, a valid id of the same length), and `decode` only
        writes the real token and the KV params into it before adding it (measured: vLLM's
        `process_inputs` is ~0.25 ms of `add_request` on the bench model; docs/benchmarks.md,
        "add_request before the KV handle"). Best effort: False (nothing prepared) for a decode
        with a grammar (its first token is fed to the grammar at add time), a request that ends at
        its first token, an engine not started or without a KV connector, or without
        `SPLITSERVE_KV_PREPARE_DECODE=1` (or `alternate`: every other call). Off by default: in
        the A/B that measured it, the ~0.3 ms it saves did not show in the token-2 gap, and the
        prepared decodes' READs leaned slower, cause not found (docs/engines.md, "early
        decode"). When nothing is prepared, or the prepared input does not match the decode that
        comes (other tokens or sampling), `decode` processes the input as usual."""
        if self._engine is None or not self.config.kv_connector or not self._prepare:
            return False
        if self._prepare == "alternate":
            self._prepare_calls += 1
            if self._prepare_calls % 2 == 0:
                return False
        if request.sampling.structured_outputs or request.sampling.max_tokens <= 1:
            return False
        continued = _continued(request, request.prompt_token_ids[-1])
        sampling = self._sampling(continued, "decode", None)
        prompt = {"prompt_token_ids": list(continued.prompt_token_ids)}
        rid = str(request.id)
        head, spec = request.prompt_token_ids, continued.sampling

        def prepare(engine: Any) -> None:
            try:
                processed = engine.input_processor.process_inputs(
                    rid, prompt, sampling, supported_tasks=engine.get_supported_tasks()
                )
            except Exception as err:  # the decode processes it again and reports what failed
                log.debug("could not prepare the decode of %s: %s", rid, err)
                return
            self._prepared[rid] = _Prepared(head, spec, processed)
            while len(self._prepared) > MAX_PREPARED:  # decodes that never came: oldest out
                del self._prepared[next(iter(self._prepared))]

        self._commands.put(prepare)
        return True

    def discard_prepared(self, request_id: RequestId) -> None:
        """Forget `prepare_decode`'s input for `request_id` (its Decode ended, or never came)."""
        if self._engine is None:
            return
        rid = str(request_id)

        def discard(_engine: Any) -> None:
            self._prepared.pop(rid, None)

        self._commands.put(discard)

    def generate(self, request: Request) -> AsyncIterator[TokenDelta]:
        return self._generate(request)

    async def _generate(self, request: Request) -> AsyncIterator[TokenDelta]:
        self._check_fits(request, request.sampling.max_tokens)
        deltas = self._deltas(request.id, self._submit(request, "generate"))
        async with contextlib.aclosing(deltas):
            async for delta in deltas:
                yield delta

    async def cancel(self, request_id: RequestId) -> bool:
        held = self._held.pop(request_id, None)
        if held is not None:
            # A finished prefill whose KV no one will pull: vLLM's abort skips finished
            # requests, so end its send lease and vLLM frees the blocks in its next step.
            self._expire_send(held[1])
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return held is not None
        stream.cancelled = True
        self._abort(request_id, stream)
        stream.queue.put_nowait(_Out((), FinishReason.CANCELLED))
        return True

    async def release_kv(self, request_id: RequestId) -> bool:
        # vLLM frees the blocks itself once the decode engine's NIXL read completes (or the
        # lease expires); this only stops counting them as held here.
        return self._held.pop(request_id, None) is not None

    def load(self) -> LoadSnapshot:
        now = time.monotonic()
        for rid in [r for r, (until, _) in self._held.items() if until <= now]:
            del self._held[rid]
        s = self._snapshot
        return LoadSnapshot(
            num_waiting=s.num_waiting,
            num_running=s.num_running,
            kv_blocks_free=s.kv_blocks_free,
            kv_blocks_total=s.kv_blocks_total,
            kv_block_size=s.kv_block_size,
            num_pending_prefill_tokens=s.num_pending_prefill_tokens,
            num_kv_held=len(self._held),
        )

    @property
    def kv_pulls_in_step(self) -> int:
        """Decodes whose KV was pulled inside the step that computed their first position."""
        return self._in_step.count if self._in_step is not None else 0

    @property
    def in_flight(self) -> int:
        return len(self._streams) + len(self._held)

    # -- KV pairs (warm-up before any request) ----------------------------------------------

    def kv_endpoint(self) -> tuple[str, dict[str, Any]] | None:
        """Where decode engines pull this engine's KV from: vLLM's engine id and the NIXL side
        channel (what `KvHandle.params` carries as remote_engine_id / remote_host / ...)."""
        return (KV_TRANSPORT, dict(self._endpoint)) if self._endpoint else None

    async def warm_kv(self, endpoint: Mapping[str, Any]) -> bool:
        """Set up NIXL with the engine at `endpoint` (another engine's `kv_endpoint()`) before
        any request pulls from it: vLLM's handshake (fetch its metadata over the side channel,
        register its agent) and a UCX connection. A request's first pull then costs what the
        tenth does. True: set up now; False: it already was (or it is this engine).

        Raises:
            KvTransferError: no KV connector here, or the peer could not be reached.
        """
        if not self._endpoint:
            raise KvTransferError("this engine has no KV connector configured")
        try:
            eid = str(endpoint["engine_id"])
            where = (str(endpoint["host"]), int(endpoint["port"]))
            sizes = tuple(int(endpoint.get(k, 1)) for k in ("tp_size", "dcp_size", "pp_size"))
        except (KeyError, TypeError, ValueError) as err:
            raise KvTransferError(f"not a NIXL endpoint: {dict(endpoint)!r} ({err})") from None
        if eid == self._endpoint["engine_id"]:
            return False
        # vLLM's connector expects its handshakes started from the engine thread.
        pending = await self._in_engine_thread(
            lambda _engine: _nixl_worker()._ensure_handshake(eid, *where, *sizes)
        )
        if pending is None:
            return False
        try:
            await asyncio.wrap_future(pending)
        except Exception as err:
            raise KvTransferError(f"NIXL handshake with {where} failed: {err}") from err

        def connect(_engine: Any) -> int:
            worker = _nixl_worker()
            agents = list(worker._remote_agents.get(eid, {}).values())
            for agent in agents:
                worker.nixl_wrapper.make_connection(agent)
            # The pair's first READ costs more than later ones (docs/benchmarks.md, "KV
            # handoff"): post it here, on vLLM's null block. The pair works without it.
            if not self._warm_read:
                return 0
            try:
                descs = self._warm_reads.start(worker, eid)
                self._warm_poll_until = time.monotonic() + self._warm_poll_s
                return descs
            except Exception as err:
                self.kv_warm_read_error = f"{type(err).__name__}: {err}"
                log.warning("no warm-up READ from engine %s: %s", eid, err)
                return 0

        read = await self._in_engine_thread(connect)
        self.kv_warm_read_descs += read
        log.info("KV pair warm: engine %s at %s:%d (warm-up READ of %d blocks)", eid, *where, read)
        return True

    def serve_kv_warmup(self, seconds: float) -> bool:
        """A peer is about to warm up with this engine (its `KvEndpoint` call from `WarmKv`):
        progress NIXL for up to `seconds`, or until its warm-up READ has notified this engine
        (`nixl.WarmupWindow`). False when this engine has no NIXL worker."""
        if not self._endpoint or self._thread is None:
            return False

        def open_window(_engine: Any) -> None:
            if self._warmup is not None:
                self._warmup.open(seconds)

        self._commands.put(open_window)
        return True

    @property
    def kv_warmup(self) -> WarmupWindow | None:
        """The serving side's warm-up window (counters for tests and benchmarks)."""
        return self._warmup

    @property
    def kv_warm_reads_pending(self) -> int:
        """This engine's warm-up READs still in flight."""
        return self._warm_reads.pending

    async def _in_engine_thread(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(engine)` in the engine thread between steps; its result or exception."""
        if self._thread is None or self._engine is None:
            raise EngineError("engine is not started")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def command(engine: Any) -> None:
            try:
                value = fn(engine)
            except Exception as err:
                loop.call_soon_threadsafe(_set_exception, done, err)
            else:
                loop.call_soon_threadsafe(_set_value, done, value)

        self._commands.put(command)
        return await done

    # -- helpers on the asyncio side --------------------------------------------------------

    def _check_fits(self, request: Request, new_tokens: int) -> None:
        if request.num_prompt_tokens == 0:
            raise ValueError("prompt must have at least one token")
        limit = self._max_model_len
        if limit and request.num_prompt_tokens + new_tokens > limit:
            raise CapacityError(
                f"request needs {request.num_prompt_tokens + new_tokens} tokens; "
                f"this engine's max_model_len is {limit}"
            )
        if request.id in self._streams:
            raise ValueError(f"request {request.id!r} is already on this engine")

    _max_model_len = 0

    def _submit(
        self,
        request: Request,
        mode: str,
        *,
        max_tokens: int | None = None,
        kv_params: Mapping[str, Any] | None = None,
    ) -> _Stream:
        if self._thread is None or self._engine is None:
            raise EngineError("engine is not started")
        sampling = self._sampling(request, mode, kv_params, max_tokens)
        guided.check(self._engine, sampling)  # a bad regex / schema: ValueError, not a failure
        # A decode continues from the prefill's first token (its last prompt token), a takeover
        # from the tokens already sent: its grammar starts past them (`GrammarCatchUp`).
        guided_prefix = guided.accepted_tokens(request, mode)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), mode)
        self._streams[request.id] = stream
        prompt = {"prompt_token_ids": list(request.prompt_token_ids)}
        rid = str(request.id)

        def add(engine: Any) -> None:
            if self._trace is not None:
                self._trace.picked(rid)
            try:
                prepared = self._prepared.pop(rid, None) if mode == "decode" else None
                if prepared is not None and not guided_prefix and prepared.fits(request):
                    internal = prepared.add(engine, request.prompt_token_ids[-1], sampling)
                    self.decodes_prepared += 1
                    if self._trace is not None:  # not a time: this decode's input was prepared
                        self._trace.mark(rid, "prepared_input", 1.0)
                elif self._grammars is not None:  # keyed by vLLM's internal id (guided.py)
                    internal = self._grammars.add_request(
                        engine, rid, prompt, sampling, guided_prefix
                    )
                else:
                    internal = engine.add_request(rid, prompt, sampling)
            except Exception as e:  # vLLM refused it (too long, bad parameters, ...)
                stream.put(_Out((), FinishReason.ERROR, error=f"{type(e).__name__}: {e}"))
                return
            stream.internal = rid if internal is None else str(internal)
            if self._trace is not None:
                self._trace.added(rid, rid if internal is None else str(internal))
            if mode == "decode" and self._history is not None:
                # The prefill's token is output for the sampler (penalties, bad_words).
                self._history.expect(rid if internal is None else str(internal))

        self._commands.put(add)
        return stream

    def _sampling(
        self,
        request: Request,
        mode: str,
        kv_params: Mapping[str, Any] | None,
        max_tokens: int | None = None,
    ) -> Any:
        """vLLM's `SamplingParams` for `request` run as `mode`."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        return SamplingParams(
            **sampling_kwargs(
                request.sampling, max_tokens or request.sampling.max_tokens, mode == "decode"
            ),
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            extra_args=_extra_args(request, kv_params),
            structured_outputs=structured_params(request.sampling.structured_outputs),
        )

    def _prefill_finish(
        self, request: Request, first: int, reason: FinishReason | None
    ) -> FinishReason | None:
        """Did the request end at its first token? (vLLM says "length" for max_tokens=1.)"""
        if reason is FinishReason.STOP or request.sampling.max_tokens == 1:
            return reason or FinishReason.LENGTH
        if reason is FinishReason.LENGTH:
            return None
        return reason

    async def _deltas(
        self,
        rid: RequestId,
        stream: _Stream,
        pulled: KvHandle | None = None,
    ) -> AsyncGenerator[TokenDelta, None]:
        source = pulled
        trace = self._trace if pulled is not None else None
        release: KvHandle | None = None  # pulled KV to free at its source after the yield
        prompt: tuple[TokenLogprobs | None, ...] = ()  # held until a delta is yielded
        try:
            while True:
                out = await stream.queue.get()
                ids = out.token_ids
                if source is not None and not ids and out.finish_reason is FinishReason.ERROR:
                    # Nothing came out of a decode: vLLM could not pull the KV (the prefill
                    # worker is gone, or its lease expired). Say so, so the caller can fall back.
                    raise KvTransferError(
                        f"KV of {rid!r} could not be pulled from {source.source_address!r}"
                        + (f": {out.error}" if out.error else "")
                    )
                source = None
                if pulled is not None and (ids or out.finish_reason is not None):
                    # The KV is here (or the request ended): free the source, but after token
                    # 2 has been handed on. The ReleaseKv call is a task on this loop; made
                    # before the yield it ran ahead of token 2's write to the caller (the
                    # consumer comes back for the next delta once that write is done).
                    if ids:
                        release = pulled
                    else:
                        self._release(pulled)
                    pulled = None
                if out.error:
                    yield TokenDelta(ids, FinishReason.ERROR, out.error, out.logprobs)
                    return
                prompt = prompt or out.prompt_logprobs
                if ids or out.finish_reason is not None:
                    if trace is not None:
                        trace.mark(str(rid), "yield")
                        trace = None
                    yield TokenDelta(
                        ids, out.finish_reason, logprobs=out.logprobs, prompt_logprobs=prompt
                    )
                    prompt = ()
                if release is not None:
                    self._release(release)
                    release = None
                if out.finish_reason is not None:
                    return
        finally:
            if release is not None:  # the consumer stopped at the first output (or an error)
                self._release(release)
            if self._streams.get(rid) is stream:
                del self._streams[rid]
                self._abort(rid)

    def _release(self, kv: KvHandle) -> None:
        if self._release_remote is None:
            return
        task = asyncio.get_running_loop().create_task(self._release_kv_at_source(kv))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release_kv_at_source(self, kv: KvHandle) -> None:
        assert self._release_remote is not None
        try:
            await self._release_remote(kv)
        except Exception:  # vLLM frees it at the source anyway (after the read, or the lease)
            log.warning("could not release KV of %s at %s", kv.source_request_id, kv.source_address)

    def _abort(self, rid: RequestId, stream: _Stream | None = None) -> None:
        """Abort `rid` in vLLM, on the engine thread. For a prefill (`stream`), also end the
        send lease vLLM took if its step finished the request before the abort got there (the
        result on its way, unread): vLLM's abort skips finished requests, and the KV blocks
        stayed held for the whole lease with nobody to pull them."""
        if self._engine is None or self._stopping.is_set():
            return
        prefill = stream is not None and stream.mode == "prefill" and self.config.kv_connector

        def abort(engine: Any) -> None:
            engine.abort_request([str(rid)])
            if prefill and stream is not None and stream.internal is not None:
                core = engine.engine_core.engine_core
                expire_send(core.scheduler, _nixl_worker(), stream.internal)

        self._commands.put(abort)

    def _expire_send(self, internal: str) -> None:
        if self._engine is None or self._stopping.is_set() or not self.config.kv_connector:
            return

        def expire(engine: Any) -> None:
            expire_send(engine.engine_core.engine_core.scheduler, _nixl_worker(), internal)

        self._commands.put(expire)

    async def kv_state(self) -> dict[str, Any]:
        """What vLLM holds for KV now (`nixl.kv_state`: scheduler requests, free blocks, the
        connector's send leases), read on the engine thread; plus the prefills counted as held
        here. For tests and diagnostics."""

        def read(engine: Any) -> dict[str, Any]:
            worker = _nixl_worker() if self.config.kv_connector else None
            return kv_state(engine.engine_core.engine_core.scheduler, worker)

        state: dict[str, Any] = await self._in_engine_thread(read)
        state["held_here"] = sorted(str(r) for r in self._held)
        return state

    # -- the engine thread ------------------------------------------------------------------

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._ready is not None
        ready = self._ready
        try:
            in_step = pull_in_step(self.config)
            engine = self._build()
        except BaseException as e:  # report any start failure to start()'s caller
            loop.call_soon_threadsafe(_set_exception, ready, e)
            return
        core = engine.engine_core.engine_core
        self._tap_schedule(core.scheduler)
        self._grammars = GrammarCatchUp.install(core.scheduler)
        self._history = FirstTokenAsOutput.install(core)
        clip_pulls(core.scheduler, HANDOFF_KEY)
        self._observer.tap(engine, core.scheduler, loop, self._bytes_per_token)
        self._snapshot = self._read_load(core.scheduler)
        self._engine = engine
        pulls = PullDriver.of(_nixl_worker) if self.config.kv_connector else None
        if pulls is not None:
            pulls.drive_after_posting(PULL_POLL_S)
            if in_step:
                self._in_step = PullInStep.install(core.scheduler, _nixl_worker(), HANDOFF_KEY)
                timer = self._observer.pulls
                if self._in_step is not None and timer is not None:
                    self._in_step.on_received = timer.received_in_step
            if self._trace is not None:
                self._trace.install(_nixl_worker())
        if self.config.kv_connector:
            try:
                self._warmup = WarmupWindow(_nixl_worker().nixl_wrapper)
            except Exception as err:  # no NIXL worker here: peers warm up as before
                log.warning("no KV warm-up window: %s", err)
        if self._trace is not None:
            self._trace.install_executor(core.model_executor)
            self._trace.install_core(core)
        trace = self._trace
        warmup = self._warmup
        held = HeldBackoff(self._held_poll_s, self._held_poll_max_s)
        commands = self._commands

        def wake() -> bool:
            if not commands.empty():
                return True
            return warmup is not None and warmup.progress(always=True)

        loop.call_soon_threadsafe(_set_result, ready)
        try:
            while not self._stopping.is_set():
                busy = bool(core.scheduler.has_requests())
                self._drain(engine, block=not busy, wait_s=self._idle_wait_s())
                if self._warm_reads.pending:
                    self._warm_reads.poll()
                if warmup is not None:
                    warmup.progress()  # nothing outside a window
                if not busy and not core.scheduler.has_requests():
                    continue
                start_s = self.clock.now_s()
                if trace is not None:
                    trace.step_started()
                outs = engine.step()
                if trace is not None:
                    trace.step_ended()
                end_s = self.clock.now_s()
                self.num_steps += 1
                shape, self._step_shape = self._step_shape, None
                if shape is not None:  # someone watches and the step scheduled tokens
                    sample = StepSample(self.num_steps, start_s, end_s - start_s, shape)
                    loop.call_soon_threadsafe(self._publish, sample)
                # Before dispatching: whoever sees a result then sees a load at least as new.
                self._snapshot = self._read_load(core.scheduler)
                for out in outs:
                    self._dispatch(out)
                    if warmup is not None and _hands_off(out):
                        warmup.handed_off(self._handoff_s)
                if pulls is not None and pulls.in_flight():
                    pulls.drive(PULL_POLL_S)
                elif not outs and core.scheduler.get_num_unfinished_requests() == 0:
                    # Only held KV / transfers left: step again after the held-KV poll, but
                    # while a hand-off's READ is awaited progress NIXL meanwhile (cheap) and
                    # step as soon as its notification is in.
                    # A hand-off's READ awaited: as before. Otherwise the pause backs off
                    # while nothing held changes (a decode lost after the prefill), in slices
                    # of the base poll that end at a command or a READ notification.
                    if warmup is not None and warmup.awaiting:
                        held.reset()
                        warmup.wait(self._held_poll_s, HANDOFF_POLL_S, time.sleep)
                    else:
                        pause = held.next(_held_state(core.scheduler, self._snapshot))
                        if self.held_pauses is not None:
                            self.held_pauses.append(pause)
                        held_pause(pause, self._held_poll_s, wake, time.sleep, time.monotonic)
                else:
                    held.reset()
        except Exception as e:  # the engine died: fail every request in flight
            log.exception("vLLM engine loop failed")
            for stream in list(self._streams.values()):
                stream.put(_Out((), FinishReason.ERROR, error=f"engine failed: {e}"))
        finally:
            with contextlib.suppress(Exception):
                core.shutdown()
            self._engine = None

    def _tap_schedule(self, sched: Any) -> None:
        """Wrap the scheduler's `schedule()` (on this instance) to keep each step's shape while
        someone watches `WatchSteps`; otherwise the wrapper only checks `steps.active`."""
        schedule = sched.schedule

        def tapped(*args: Any, **kwargs: Any) -> Any:
            out = schedule(*args, **kwargs)
            if self._trace is not None:
                self._trace.scheduled()
            feed = self.steps
            if feed is not None and feed.active and out.total_num_scheduled_tokens > 0:
                self._step_shape = step_shape(out, sched.requests)
            return out

        sched.schedule = tapped

    def _publish(self, sample: StepSample) -> None:
        if self.steps is not None:
            self.steps.publish(sample)

    def _idle_wait_s(self) -> float:
        """How long the idle engine thread may wait for a command: `WARMUP_POLL_S` while a
        peer warms up with this engine or this engine's warm-up READ is young, else
        `IDLE_WAIT_S`."""
        if self._warmup is not None and (self._warmup.active or self._warmup.awaiting):
            return WARMUP_POLL_S
        if self._warm_reads.pending and time.monotonic() < self._warm_poll_until:
            return WARMUP_POLL_S
        return IDLE_WAIT_S

    def _drain(self, engine: Any, block: bool, wait_s: float = IDLE_WAIT_S) -> None:
        try:
            command = self._commands.get(timeout=wait_s) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                command(engine)
            except Exception:
                log.exception("vLLM command failed")
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _dispatch(self, out: Any) -> None:
        stream = self._streams.get(RequestId(out.request_id))
        if stream is None:
            return
        completion = out.outputs[0] if out.outputs else None
        ids = tuple(completion.token_ids) if completion is not None else ()
        if self._trace is not None and (ids or out.finished):
            self._trace.dispatched(str(out.request_id))
        reason = None
        if out.finished:
            raw = completion.finish_reason if completion is not None else None
            reason = _FINISH.get(str(raw), FinishReason.STOP if raw else FinishReason.CANCELLED)
        self.generated_tokens += len(ids)
        logprobs = token_logprobs(completion.logprobs) if completion is not None else ()
        kvp = out.kv_transfer_params if out.finished else None
        prompt = prompt_logprobs(getattr(out, "prompt_logprobs", None))
        stream.put(_Out(ids, reason, kvp, logprobs=logprobs, prompt_logprobs=prompt))

    def _read_load(self, sched: Any) -> LoadSnapshot:
        pool = sched.kv_cache_manager.block_pool
        waiting = [*sched.kv_holding_waiting, *sched.waiting]
        pending = sum(
            max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in (*waiting, *sched.running)
        )
        return LoadSnapshot(
            num_waiting=len(waiting),
            num_running=len(sched.running),
            kv_blocks_free=int(pool.get_num_free_blocks()),
            kv_blocks_total=int(pool.num_gpu_blocks) - 1,
            kv_block_size=int(sched.block_size),
            num_pending_prefill_tokens=int(pending),
            num_kv_held=0,
        )

    def _build(self) -> Any:
        cfg = self.config
        if cfg.nixl_side_channel_host is not None:
            os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = cfg.nixl_side_channel_host
        if cfg.nixl_side_channel_port is not None:
            port = cfg.nixl_side_channel_port or _free_port(
                os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
            )
            os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(port)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.llm_engine import LLMEngine

        from splitserve.worker.vllm_adapter.scheduler import CONFIG_KEY, scheduler_cls_for

        args: dict[str, Any] = {
            "model": cfg.model,
            "served_model_name": cfg.served_model_name,
            "dtype": cfg.dtype,
            "max_model_len": cfg.max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "enforce_eager": cfg.enforce_eager,
            "seed": cfg.seed,
            "disable_log_stats": False,
        }
        if cfg.max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        if cfg.block_size is not None:
            args["block_size"] = cfg.block_size
        if cfg.kv_connector:
            kvc: dict[str, Any] = {
                "kv_connector": cfg.kv_connector,
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "kv_lease_duration": max(1, round(cfg.kv_hold_timeout_s))
                },
            }
            if cfg.kv_buffer_device:
                kvc["kv_buffer_device"] = cfg.kv_buffer_device
            # NIXL transfer backends (UCX, LIBFABRIC); the operator sets this from kvTransfer.
            backends = os.environ.get("SPLITSERVE_NIXL_BACKENDS", "")
            if backends:
                kvc["kv_connector_extra_config"]["backends"] = backends.split(",")
            args["kv_transfer_config"] = kvc
        if cfg.use_scheduler_shim:
            extra = {"batching": cfg.batching, "params": dict(cfg.batching_params)}
            args["additional_config"] = {CONFIG_KEY: extra}
        args.update(cfg.engine_args)
        guided.engine_config(args)
        engine_args = EngineArgs(**args)
        vllm_config = engine_args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        if cfg.use_scheduler_shim and "scheduler_cls" not in cfg.engine_args:
            sc = vllm_config.scheduler_config
            sc.scheduler_cls = scheduler_cls_for(bool(sc.async_scheduling))
        cpus = cfg.cpus if cfg.cpus is not None else cpus_from_env()
        original = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        if cpus:
            pin_process(cpus)  # threads vLLM and torch start while building inherit it
        progress = cfg.nixl_progress_thread or os.environ.get(PROGRESS_THREAD_ENV, "") == "1"
        with nixl_progress_thread(progress):
            engine = LLMEngine.from_vllm_config(
                vllm_config,
                disable_log_stats=False,
                stat_loggers=[self._observer.stat_logger_factory()],
            )
        if cpus or original:
            # vLLM's CPU NixlConnector pinned this thread to the machine's last core: undo it.
            pin_process(cpus or original)
        mc = vllm_config.model_config
        pc = vllm_config.parallel_config
        itemsize = int(getattr(mc.dtype, "itemsize", 2))
        self._bytes_per_token = (
            2 * mc.get_num_layers(pc) * mc.get_num_kv_heads(pc) * mc.get_head_size() * itemsize
        )
        self._max_model_len = int(mc.max_model_len)
        kvt = vllm_config.kv_transfer_config
        if cfg.kv_connector and kvt is not None:
            import vllm.envs as envs

            self._endpoint = {
                "engine_id": str(kvt.engine_id),
                "host": str(envs.VLLM_NIXL_SIDE_CHANNEL_HOST),
                "port": int(envs.VLLM_NIXL_SIDE_CHANNEL_PORT),
                "tp_size": int(pc.tensor_parallel_size),
                "dcp_size": int(pc.decode_context_parallel_size),
                "pp_size": int(pc.pipeline_parallel_size),
            }
        return engine

    # -- observation (for metrics and tests) -------------------------------------------------

    @property
    def scheduler(self) -> Any:
        """vLLM's scheduler (the shim): read-only use, from any thread, at your own risk."""
        return self._engine.engine_core.engine_core.scheduler if self._engine else None

    def metrics_collector(self) -> Any:
        """vLLM's metrics renamed to `splitserve_worker_vllm_*`: register in the worker registry."""
        from splitserve.worker.vllm_adapter.metrics_map import VllmMetricsCollector

        return VllmMetricsCollector(self.vllm_metrics)

    def native_metrics_collector(self) -> Any:
        """vLLM's own `vllm:*` series under their names: register in the worker registry."""
        from vllm.v1.metrics.prometheus import get_prometheus_registry

        from splitserve.worker.vllm_adapter.metrics_map import VllmNativeCollector

        return VllmNativeCollector(get_prometheus_registry)

    def vllm_metrics(self) -> list[Any]:
        """vLLM's in-process Prometheus metrics (`vllm.v1.metrics.reader` snapshots)."""
        from vllm.v1.metrics.reader import get_metrics_snapshot

        return list(get_metrics_snapshot())


def sampling_kwargs(s: SamplingSpec, max_tokens: int, continued: bool = False) -> dict[str, Any]:
    """vLLM `SamplingParams` arguments of a request's sampling spec, for `max_tokens` tokens.

    A prefill (one token) samples its token under the same parameters as the decode that
    follows, so `min_tokens` >= 1 keeps it from ending at end-of-text too. `continued`: a decode
    continued from a prefill's first token, which vLLM sees as the last prompt token;
    `min_tokens` then counts one fewer for vLLM's scheduler. The decode's model runner counts
    that token as output (`output_history.FirstTokenAsOutput`), for presence / frequency
    penalties, multi-token `bad_words` and `min_tokens`, like an aggregated run.
    """
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": s.seed,
        "stop_token_ids": list(s.stop_token_ids),
        "ignore_eos": s.ignore_eos,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty,
        "logit_bias": dict(s.logit_bias) or None,
        "max_tokens": max_tokens,
        "min_tokens": min(max_tokens, max(0, s.min_tokens - 1) if continued else s.min_tokens),
        "bad_words": list(s.bad_words) or None,
        "allowed_token_ids": list(s.allowed_token_ids) or None,
        "logprobs": s.logprobs,
        # The prompt's, from the run that computes the prompt (a continued decode has it
        # from its prefill: vLLM would score the prompt's last position alone).
        "prompt_logprobs": None if continued else s.prompt_logprobs,
    }


def prompt_logprobs(positions: Any) -> tuple[TokenLogprobs | None, ...]:
    """vLLM's prompt logprobs (per prompt position, None for the first, else `{token_id:
    Logprob}` with the prompt's own token first) as `TokenLogprobs`; () when none were asked
    for (or this output is not the first)."""
    if not positions:
        return ()
    return tuple(None if p is None else token_logprobs([p])[0] for p in positions)


def token_logprobs(positions: Any) -> tuple[TokenLogprobs, ...]:
    """vLLM's sample logprobs (per position, `{token_id: Logprob}` with the sampled token first,
    a list or a `FlatLogprobs`) as `TokenLogprobs`; () when the request asked for none."""
    if not positions:
        return ()
    out: list[TokenLogprobs] = []
    for position in positions:
        items = list(position.items()) if position else []
        out.append(
            TokenLogprobs(
                token_ids=tuple(int(t) for t, _ in items),
                logprobs=tuple(float(lp.logprob) for _, lp in items),
                rank=int(items[0][1].rank or 0) if items else 0,
            )
        )
    return tuple(out)


MAX_PREPARED: Final = 256
"""Prepared early-Decode inputs kept at most (`VllmEngine.prepare_decode`)."""


def _continued(request: Request, first_token_id: int) -> Request:
    """The decode of `request` continued from the prefill's first token: the prompt plus that
    token, one token fewer to generate."""
    return replace(
        request,
        prompt_token_ids=(*request.prompt_token_ids, first_token_id),
        sampling=replace(request.sampling, max_tokens=request.sampling.max_tokens - 1),
    )


@dataclass
class _Prepared:
    """vLLM's processed input of an early Decode (`VllmEngine.prepare_decode`): the original
    prompt and the continued sampling it was made for, and vLLM's `EngineCoreRequest` with a
    placeholder where the first token goes."""

    head: tuple[int, ...]
    spec: SamplingSpec
    processed: Any

    def fits(self, continued: Request) -> bool:
        """Was this made for `continued` (its prompt but the last token, its sampling)?"""
        ids = continued.prompt_token_ids
        return ids[:-1] == self.head and continued.sampling == self.spec

    def add(self, engine: Any, first_token_id: int, sampling: Any) -> str:
        """Write the first token and the decode's own `extra_args` (the KV params, the SLO as
        of the KV's arrival) in, stamp the arrival, and add it to vLLM as `LLMEngine.
        add_request` adds an input it has processed (one sequence: a decode's n is 1);
        vLLM's internal id."""
        request = self.processed
        request.prompt_token_ids[-1] = first_token_id
        request.sampling_params.extra_args = sampling.extra_args
        request.arrival_time = time.time()
        engine.input_processor.assign_request_id(request)
        engine.output_processor.add_request(request, None, None, 0)
        engine.engine_core.add_request(request)
        return str(request.request_id)


def _extra_args(request: Request, kv_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """vLLM `SamplingParams.extra_args`: the KV connector's params, and the request's SLO for
    the scheduler shim's `SeqView` (`SLO_ARG`; the deadline as an offset from arrival, since
    vLLM stamps its own arrival time)."""
    extra: dict[str, Any] = {}
    if kv_params:
        extra["kv_transfer_params"] = dict(kv_params)
    offset = None if request.deadline_s is None else request.deadline_s - request.arrival_s
    extra[SLO_ARG] = {
        "slo_class": str(request.slo_class),
        "priority": request.priority,
        "deadline_offset_s": offset,
    }
    return extra


def step_shape(out: Any, requests: Mapping[str, Any]) -> BatchShape:
    """The `BatchShape` of one vLLM `SchedulerOutput`: per scheduled request, its scheduled
    tokens and its computed context before the step. A request past its prompt that computes one
    token decodes (so does the first step of a decode continued from a prefill's first token);
    anything else (prompt chunks, recomputation after a preemption) is a prefill chunk (new
    tokens, context)."""
    computed: dict[str, int] = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=False))
    chunks: list[tuple[int, int]] = []
    decodes: list[int] = []
    for rid, n in out.num_scheduled_tokens.items():
        ctx = int(computed.get(rid, 0))
        req = requests.get(rid)
        prompt = int(req.num_prompt_tokens) if req is not None else 0
        if n == 1 and req is not None and (ctx >= prompt or _continues(req, ctx)):
            decodes.append(ctx)
        else:
            chunks.append((int(n), ctx))
    return BatchShape(prefill_chunks=tuple(chunks), decode_contexts=tuple(decodes))


def _continues(req: Any, ctx: int) -> bool:
    """A decode continued from a prefill's first token computes that token's position first: a
    decode step (one token over the pulled prompt), although vLLM counts the token as prompt."""
    params = getattr(req, "kv_transfer_params", None) or {}
    return ctx == int(req.num_prompt_tokens) - 1 and HANDOFF_KEY in params


def local_cpu_env(
    cpu: int | None = None, kv_cache_gib: int = 1, huge_pages: bool = True
) -> dict[str, str]:
    """Environment for a vLLM worker on a small CPU machine (`splitserve up`, tests).

    `cpu` pins vLLM's OpenMP threads to one core (one per worker when P and D share a host).
    `huge_pages` has torch back its large CPU tensors (the KV cache) with transparent huge pages
    (`THP_MEM_ALLOC_ENABLE`, read once at torch's first allocation, hence the environment): a
    NIXL READ between two processes on one host is a `process_vm_readv` copy, which moved KV
    in 4 KiB pages at 53-71 % of the speed it reaches on huge pages (docs/benchmarks.md).
    """
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
        "UCX_NET_DEVICES": "lo",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if cpu is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpu)
    if huge_pages:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    return env


EPHEMERAL_RANGE_FILE: Final = "/proc/sys/net/ipv4/ip_local_port_range"


def _free_port(host: str, range_file: str = EPHEMERAL_RANGE_FILE) -> int:
    """A port free now for vLLM's NIXL side channel (`nixl_side_channel_port=0`), taken below
    the kernel's ephemeral range. The port is released before vLLM binds it, and a port from
    the ephemeral range (what `bind(0)` gives) can meanwhile be handed to the next `bind(0)` in
    this process: vLLM's and torch's own port picks during start-up took it in a clean-clone CI
    run (the NIXL listener then failed with "Address already in use" and the engine never
    started). No `bind(0)` hands out a port below the range. Falls back to `bind(0)` when the
    range starts too low to leave room, or nothing below it is free."""
    import random
    import socket

    try:
        with open(range_file, encoding="ascii") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    first = max(10_000, low - 20_000)
    for port in random.sample(range(first, low), k=min(64, max(0, low - first))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def pull_in_step(config: VllmEngineConfig) -> bool:
    """Whether the engine pulls KV in-step: `SPLITSERVE_KV_PULL_IN_STEP` (`0` / `1`) if set,
    else `config.kv_pull_in_step`. Any other value is refused."""
    value = os.environ.get(PULL_IN_STEP_ENV)
    if value is None or value == "":
        return config.kv_pull_in_step
    if value not in ("0", "1"):
        raise ValueError(f"{PULL_IN_STEP_ENV} must be 0 or 1, not {value!r}")
    return value == "1"


def prepare_decode_mode(env: Mapping[str, str] = os.environ) -> str:
    """When `prepare_decode` processes early Decodes' inputs ahead (`SPLITSERVE_KV_PREPARE_DECODE`):
    `"1"` always, `"alternate"` every other call, `""` never (unset, empty or `0`). Any other
    value is refused."""
    value = env.get(PREPARE_DECODE_ENV, "")
    if value not in ("", "0", "1", "alternate"):
        raise ValueError(f"{PREPARE_DECODE_ENV} must be 0, 1 or alternate, not {value!r}")
    return "" if value == "0" else value


def warm_read_on(env: Mapping[str, str] = os.environ) -> bool:
    """Whether `warm_kv` posts the pair's warm-up READ: yes unless `SPLITSERVE_KV_WARM_READ` is
    `0`. Any value but `0` / `1` / empty is refused."""
    value = env.get(WARM_READ_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{WARM_READ_ENV} must be 0 or 1, not {value!r}")
    return value != "0"


def held_poll_s(env: Mapping[str, str] = os.environ) -> float:
    """Seconds between steps while only held KV is left: `SPLITSERVE_KV_HELD_POLL_MS` (0.1 to
    100 ms) if set, else 5 ms. Anything else is refused."""
    value = env.get(HELD_POLL_ENV, "")
    if value == "":
        return 0.005
    try:
        poll_ms = float(value)
    except ValueError:
        poll_ms = float("nan")
    if not 0.1 <= poll_ms <= 100:
        raise ValueError(f"{HELD_POLL_ENV} must be a number of ms in [0.1, 100], not {value!r}")
    return poll_ms / 1000


def handoff_ms(env: Mapping[str, str] = os.environ) -> int:
    """`SPLITSERVE_KV_HANDOFF_MS` (0 to 10000) if set, else 200. Anything else is refused."""
    value = env.get(HANDOFF_ENV, "")
    if value == "":
        return HANDOFF_DEFAULT_MS
    if not value.isdigit() or int(value) > 10_000:
        raise ValueError(f"{HANDOFF_ENV} must be a whole number of ms in [0, 10000], not {value!r}")
    return int(value)


def _held_state(sched: Any, load: LoadSnapshot) -> tuple[int, int]:
    """What the held-KV back-off watches: vLLM's requests (a finished one holding KV stays
    there until its READ or lease end) and free KV blocks, as of the last step."""
    return len(sched.requests), load.kv_blocks_free


def _hands_off(out: Any) -> bool:
    """Whether a vLLM output is a prefill that finished holding KV for a decode worker's READ
    (the NIXL connector's `kv_transfer_params` with blocks to read)."""
    kvp = out.kv_transfer_params if out.finished else None
    if not kvp or not kvp.get("do_remote_prefill"):
        return False
    return any(len(group) > 0 for group in kvp.get("remote_block_ids") or ())


def _nixl_worker() -> Any:
    """vLLM's NIXL connector worker in this process (the in-process engine's only one)."""
    from vllm.distributed.kv_transfer.kv_transfer_state import get_kv_transfer_group

    worker = getattr(get_kv_transfer_group(), "connector_worker", None)
    if worker is None:
        raise KvTransferError("vLLM's KV connector has no NIXL worker in this process")
    return worker


def _set_value(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_result(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _set_exception(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
