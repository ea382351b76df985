"""Measure a live worker's step times through its own gRPC API (the I/O half of `splitserve
profile`; `core.perf.samples` turns the samples into a table and a fit).

The worker's API says nothing about steps, so the profiler makes steps observable by shaping the
load and timing token arrivals on the client:

* **Prefill probes** (B requests of n prompt tokens, `Generate` with `max_tokens=1`): a *gate*
  request (one long prompt) is sent first; while the engine runs the gate's step, the B probes
  arrive and queue, so the engine's next step is exactly their B prefills. The probe step's time
  is (first probe's answer) - (gate's answer): both answers travel the same way, so the RPC
  latency cancels and what remains is the step period, back to back. A probe is rejected (and
  retried) when the probes did not reach the worker before the gate finished, finished in more
  than one step, or finished with the gate.
* **Decode probes** (B requests with c-token prompts and long outputs, `ignore_eos`): once the
  last of them has its first token, every step decodes all B until the first one finishes. Each
  stream's step period in that window is (last arrival - first arrival) / tokens between; the
  probe's value is the median over streams, its spread their interquartile range.

Every probe runs only on an idle worker (checked through `WatchLoad`), after a warm-up, and
`repeats` times, the repetitions interleaved across cells so that drift spreads evenly; cells
whose repetitions disagree by more than `max_spread` of their median get up to `extra_repeats`
more. The table uses the median per cell. Prompts are random token ids, distinct per request,
so vLLM's prefix cache never hits.

**Two methods.** With `method="steps"` (what `"auto"` picks when the worker serves
`WatchSteps`) the worker reports every step it runs, its exact shape and its time measured
inside the worker: the probes above only make the steps happen, and each probe's measurement is
the reported step of exactly the probe's shape (prefill: B chunks of (n, 0); decode: the steps
that decode all B). No gRPC or client time is in these numbers, and a probe whose step the
engine shaped differently is retried, never mismeasured. Every step seen during the run (gates,
warm-ups, the mixed prefill+decode steps while a decode probe's prompts are computed) is kept in
`Profiler.steps` for a fit on every step. `method="outside"` (or `"auto"` against a worker
without `WatchSteps`) times the probes from the client as described next.

What a measured step includes (outside method): the engine's whole step period, i.e. the
forward pass *and* the scheduler, sampling, output processing and the worker's hand-off of
tokens to the gRPC stream (whatever keeps the engine from starting the next step). Client-side
jitter and gRPC delivery are not in it (they cancel or average out) but add noise; run the
profiler close to the worker (`kubectl exec` into the pod, or on the same host) for tight
numbers. The batch shapes are what the profiler arranged, not what the engine reports; the
steps method has neither limitation.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import grpc

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.aio import stop_task
from splitserve.core.perf.protocol import BatchShape
from splitserve.core.perf.samples import Measurement
from splitserve.security import tls
from splitserve.worker.engine import StepSample
from splitserve.worker.server import step_from_pb

log = logging.getLogger(__name__)

Method = Literal["auto", "steps", "outside"]
METHODS: tuple[Method, ...] = ("auto", "steps", "outside")


class ProfileError(Exception):
    """The worker cannot be profiled (busy, wrong role, refused a probe, ...)."""


@dataclass(frozen=True, slots=True)
class ProfileGrid:
    """What to measure. Cells that do not fit the limits are left out."""

    prefill_tokens: tuple[int, ...] = (128, 512, 2048)
    """Total new tokens N of a prefill step."""
    prefill_batch_sizes: tuple[int, ...] = (1, 4, 16)
    """Requests sharing those N tokens (n = N // B each): varying B at a fixed N is what
    separates prefill attention from the GEMMs."""
    decode_batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    decode_contexts: tuple[int, ...] = (128, 1024)
    """Prompt tokens per decode-probe request (its context when decoding starts)."""
    decode_tokens: int = 32
    """Steps measured per decode probe (after every request of the probe is decoding)."""
    repeats: int = 3
    extra_repeats: int = 3
    """Further repetitions for cells whose repetitions disagree by more than `max_spread`."""
    max_spread: float = 0.1
    """(max - min) / median over a cell's repetitions above which it is measured again."""
    warmup: int = 1
    max_batch_tokens: int = 2048
    """The worker's token budget per step (vLLM's max_num_batched_tokens): no probe exceeds it."""
    max_model_len: int = 2048
    max_num_seqs: int = 64
    min_prompt_tokens: int = 8

    def __post_init__(self) -> None:
        if self.repeats < 1 or min(self.warmup, self.extra_repeats) < 0 or self.decode_tokens < 3:
            raise ValueError(
                "repeats must be >= 1, warmup and extra_repeats >= 0, decode_tokens >= 3"
            )

    def prefill_cells(self) -> list[tuple[int, int]]:
        """(requests, prompt tokens each) per prefill probe."""
        out: list[tuple[int, int]] = []
        for total, b in itertools.product(
            sorted(set(self.prefill_tokens)), sorted(set(self.prefill_batch_sizes))
        ):
            n = total // b
            fits = total <= self.max_batch_tokens and b <= self.max_num_seqs
            if fits and self.min_prompt_tokens <= n < self.max_model_len and (b, n) not in out:
                out.append((b, n))
        return out

    def decode_cells(self) -> list[tuple[int, int]]:
        """(requests, prompt tokens each) per decode probe."""
        out: list[tuple[int, int]] = []
        for b, c in itertools.product(
            sorted(set(self.decode_batch_sizes)), sorted(set(self.decode_contexts))
        ):
            if b <= self.max_num_seqs and c + self.decode_max_tokens(b, c) <= self.max_model_len:
                out.append((b, c))
        return out

    def decode_max_tokens(self, b: int, c: int) -> int:
        """Output length of a decode probe: the measured steps plus the steps during which the
        probe's own prefills are still being scheduled (earlier requests already decode)."""
        prefill_steps = math.ceil(b * c / self.max_batch_tokens)
        return self.decode_tokens + prefill_steps + 3


@dataclass(slots=True)
class _Call:
    sent_s: float
    first_s: float = math.nan
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    """(arrival time, tokens received so far) per chunk that carried tokens."""


@dataclass(slots=True)
class ProfileStats:
    rtt_s: float = math.nan
    gate_tokens: int = 0
    gate_step_s: float = math.nan
    probes: int = 0
    rejected: int = 0
    notes: list[str] = field(default_factory=list)
    method: str = ""
    """The method used: "steps" (the worker's `WatchSteps`) or "outside" (client timing)."""
    steps_dropped: int = 0
    """Step samples the worker dropped because the profiler read them too slowly."""


class Profiler:
    """Drives one worker (a `grpc.aio` `WorkerStub`) through `grid` and returns `Measurement`s."""

    def __init__(
        self,
        stub: worker_pb2_grpc.WorkerStub,
        grid: ProfileGrid,
        *,
        token_range: tuple[int, int] = (16, 1000),
        seed: int = 0,
        set_mixed: bool = False,
        idle_timeout_s: float = 30.0,
        request_timeout_s: float = 300.0,
        progress: Callable[[str], None] | None = None,
        timer: Callable[[], float] = time.perf_counter,
        method: Method = "auto",
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        lo, hi = token_range
        if not 0 <= lo < hi:
            raise ValueError(f"bad token range {token_range}")
        self.stub = stub
        self.grid = grid
        self.token_range = token_range
        self.set_mixed = set_mixed
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.progress = progress or (lambda msg: log.info("%s", msg))
        self.now = timer
        self.stats = ProfileStats()
        self._rng = random.Random(seed)
        self._ids = itertools.count()
        self._run_tag = f"{seed:x}-{random.Random().getrandbits(32):08x}"
        self._rtts: list[float] = []
        self._gate_delay_s = 0.0
        self._gate_est_s = 0.0
        """The gate's step time: calibrated, then scaled with its prompt as it grows."""
        self.method = method
        self.steps: list[StepSample] = []
        """Every step the worker reported during the run (steps method only)."""
        self._use_steps = False

    # -- the run --------------------------------------------------------------------------------

    async def run(self) -> list[Measurement]:
        report = await self._load()
        restore: common_pb2.Role.ValueType | None = None
        if report.role not in (common_pb2.ROLE_MIXED, common_pb2.ROLE_DECODE):
            if not self.set_mixed:
                raise ProfileError(
                    "the worker's role cannot run Generate (a prefill worker); profile a mixed "
                    "or decode worker, or let the profiler switch it (--set-mixed)"
                )
            await self.stub.SetRole(worker_pb2.SetRoleRequest(role=common_pb2.ROLE_MIXED))
            restore = report.role
        elif self.set_mixed:
            role = common_pb2.Role.Name(report.role).removeprefix("ROLE_").lower()
            self.progress(
                f"--set-mixed: a {role} worker runs Generate already; its role is left as it is"
            )
        watch: grpc.aio.UnaryStreamCall[worker_pb2.WatchStepsRequest, worker_pb2.StepSample]
        watch = None
        reader: asyncio.Task[None] | None = None
        try:
            if self.method != "outside":
                watch = await self._watch_steps()
                if watch is None and self.method == "steps":
                    raise ProfileError(
                        "the worker does not serve WatchSteps (an older worker, or an engine "
                        "that cannot report steps): use --method outside"
                    )
            self._use_steps = watch is not None
            self.stats.method = "steps" if self._use_steps else "outside"
            if watch is not None:
                reader = asyncio.create_task(self._read_steps(watch))
            self.progress(
                f"profiling {report.engine} worker serving {report.model!r} "
                f"({'worker-side step samples' if self._use_steps else 'client-side timing'})"
            )
            return await self._measure()
        finally:
            if watch is not None:
                watch.cancel()
            if reader is not None:
                await stop_task(reader)  # (the caller's own cancellation is kept)
            if restore is not None:
                await self.stub.SetRole(worker_pb2.SetRoleRequest(role=restore))

    async def _measure(self) -> list[Measurement]:
        g = self.grid
        prefill_cells, decode_cells = g.prefill_cells(), g.decode_cells()
        if not prefill_cells or not decode_cells:
            raise ProfileError(
                f"nothing to measure within the limits: {len(prefill_cells)} prefill and "
                f"{len(decode_cells)} decode cells (check --max-batch-tokens / --max-model-len)"
            )
        await self._wait_idle()
        for _ in range(8):
            await self._ping()
        self.stats.rtt_s = statistics.median(self._rtts)
        await self._calibrate_gate()
        for _ in range(g.warmup):
            for b, n in (prefill_cells[0], prefill_cells[-1]):
                await self._prefill_probe(b, n, rep=-1)
            await self._decode_probe(*decode_cells[0], rep=-1)
        out: list[Measurement] = []
        cells = [("prefill", b, n) for b, n in prefill_cells]
        cells += [("decode", b, c) for b, c in decode_cells]
        for rep in range(g.repeats):
            out += await self._measure_cells(cells, rep)
            self.progress(f"repetition {rep + 1}/{g.repeats}: {len(out)} samples")
        for extra in range(g.extra_repeats):
            noisy = [key for key in cells if self._noisy(key, out)]
            if not noisy:
                break
            self.progress(f"{len(noisy)} noisy cells: measuring them again")
            out += await self._measure_cells(noisy, g.repeats + extra)
        return out

    async def _measure_cells(
        self, cells: Sequence[tuple[str, int, int]], rep: int
    ) -> list[Measurement]:
        out: list[Measurement] = []
        for kind, b, n in cells:
            probe = self._prefill_probe if kind == "prefill" else self._decode_probe
            m = await probe(b, n, rep)
            if m is not None:
                out.append(m)
        return out

    def _noisy(self, key: tuple[str, int, int], samples: Sequence[Measurement]) -> bool:
        secs = [m.seconds for m in samples if m.key == key]
        if len(secs) < 2:
            return True
        return (max(secs) - min(secs)) > self.grid.max_spread * statistics.median(secs)

    # -- probes ---------------------------------------------------------------------------------

    async def _calibrate_gate(self) -> None:
        """The smallest prompt whose step is long enough to cover sending a batch of probes."""
        g = self.grid
        cap = min(g.max_batch_tokens, g.max_model_len - 1)
        target = max(0.02, 10 * self._rtt_hi())
        tokens = min(256, cap)
        while True:
            await self._wait_idle()
            lat = []
            for _ in range(3):
                call = await self._generate(self._prompt(tokens), 1)
                lat.append(call.first_s - call.sent_s)
            step = statistics.median(lat) - self.stats.rtt_s
            if step >= target or tokens >= cap:
                break
            tokens = min(cap, tokens * 2)
        if step < target:
            self.stats.notes.append(
                f"the longest prefill allowed ({tokens} tokens) takes {step * 1e3:.1f} ms, under "
                f"the {target * 1e3:.1f} ms wanted to gate probes; expect rejected probes"
            )
        self.stats.gate_tokens = tokens
        self.stats.gate_step_s = step
        self._gate_est_s = step
        self._gate_delay_s = max(2 * self._rtt_hi(), 0.2 * step)
        self.progress(
            f"round trip {self.stats.rtt_s * 1e3:.2f} ms; gate {tokens} tokens "
            f"({step * 1e3:.1f} ms step)"
        )

    def _widen_gate(self) -> None:
        """Give the probes more room after a rejected try: a longer gate, the probes sent later.

        The gate's step is estimated to grow with its prompt (prefill is about linear in tokens),
        and the delay never exceeds half of it: probes sent after the gate's step ended could
        never be gated, and every rejection would lengthen the delay again (on a loaded machine
        that once grew the delay geometrically, to minutes per probe).
        """
        cap = min(self.grid.max_batch_tokens, self.grid.max_model_len - 1)
        tokens = min(self.stats.gate_tokens * 2, cap)
        self._gate_est_s *= tokens / self.stats.gate_tokens
        self.stats.gate_tokens = tokens
        self._gate_delay_s = min(self._gate_delay_s * 1.5, 0.5 * self._gate_est_s)

    async def _prefill_probe(self, b: int, n: int, rep: int, tries: int = 4) -> Measurement | None:
        for attempt in range(tries):
            await self._wait_idle()
            self.stats.probes += 1
            mark = len(self.steps)
            gate = asyncio.create_task(self._generate(self._prompt(self.stats.gate_tokens), 1))
            probes: list[asyncio.Task[_Call]] = []
            try:
                await asyncio.sleep(self._gate_delay_s)
                probes = [asyncio.create_task(self._generate(self._prompt(n), 1)) for _ in range(b)]
                gate_call = await gate
                calls = await asyncio.gather(*probes)
            except BaseException:
                # The worker failed (or the run was stopped): end the calls still running and
                # collect them, so none is left failing unawaited ('Task exception was never
                # retrieved' and a traceback per probe after the error).
                for task in (gate, *probes):
                    task.cancel()
                await asyncio.gather(gate, *probes, return_exceptions=True)
                raise
            firsts = sorted(c.first_s for c in calls)
            # All probes end with one step; the client reads their answers one after another,
            # so the first answer is the best estimate of the step's end.
            delta = firsts[0] - gate_call.first_s
            spread = firsts[-1] - firsts[0]
            last_sent = max(c.sent_s for c in calls)
            problem = ""
            if self._use_steps:
                want = BatchShape(prefill_chunks=((n, 0),) * b)
                step = await self._reported_step(mark, want)
                if step is not None:
                    return Measurement("prefill", b, n, rep, step.batch, step.duration_s, 0.0)
                problem = "the worker ran no step of exactly the probes"
            elif last_sent + self.stats.rtt_s >= gate_call.first_s:
                problem = "probes reached the worker after the gate step"
            elif firsts[0] - gate_call.first_s <= min(0.5 * self._rtt_hi(), 1e-3):
                problem = "probes ran in the gate's step"
            elif spread > 0.25 * (firsts[0] - gate_call.first_s) + self._rtt_hi():
                problem = f"probes finished over {spread * 1e3:.1f} ms (more than one step)"
            if not problem:
                return Measurement(
                    "prefill", b, n, rep, BatchShape(prefill_chunks=((n, 0),) * b), delta, spread
                )
            self.stats.rejected += 1
            log.debug("prefill probe %dx%d rejected (attempt %d): %s", b, n, attempt + 1, problem)
            if attempt >= 1:
                self._widen_gate()
        self.stats.notes.append(f"prefill probe {b}x{n} (rep {rep}) rejected {tries} times")
        return None

    async def _decode_probe(self, b: int, c: int, rep: int) -> Measurement | None:
        await self._wait_idle()
        self.stats.probes += 1
        mark = len(self.steps)
        max_tokens = self.grid.decode_max_tokens(b, c)
        calls = await asyncio.gather(
            *(self._generate(self._prompt(c), max_tokens) for _ in range(b))
        )
        if self._use_steps:
            return await self._decode_from_steps(b, c, rep, mark)
        start = max(call.first_s for call in calls)  # every request decodes after this
        end = min(call.arrivals[-1][0] for call in calls)  # ... until the first one finishes
        per_stream: list[float] = []
        contexts: list[int] = []
        for call in calls:
            window = [(t, k) for t, k in call.arrivals if start <= t <= end]
            if len(window) < 2 or window[-1][1] - window[0][1] < 2:
                continue
            (t0, k0), (t1, k1) = window[0], window[-1]
            per_stream.append((t1 - t0) / (k1 - k0))
            contexts.append(c + round((k0 + k1) / 2))
        if len(per_stream) < max(1, b // 2):
            self.stats.rejected += 1
            self.stats.notes.append(f"decode probe {b}x{c} (rep {rep}): no steady window")
            return None
        while len(contexts) < b:  # streams without a usable window still decoded
            contexts.append(statistics.median_low(contexts))
        q = statistics.quantiles(per_stream, n=4) if len(per_stream) > 1 else [0.0, 0.0, 0.0]
        return Measurement(
            "decode",
            b,
            c,
            rep,
            BatchShape(decode_contexts=tuple(sorted(contexts))),
            statistics.median(per_stream),
            q[2] - q[0],
        )

    async def _decode_from_steps(self, b: int, c: int, rep: int, mark: int) -> Measurement | None:
        """Of the reported steps that decoded all B of the probe, the median one."""
        await self._quiet_steps()
        full = [
            s
            for s in self.steps[mark:]
            if not s.batch.prefill_chunks and len(s.batch.decode_contexts) == b
        ]
        if len(full) < 2:
            self.stats.rejected += 1
            self.stats.notes.append(f"decode probe {b}x{c} (rep {rep}): no step decoded all {b}")
            return None
        secs = [s.duration_s for s in full]
        q = statistics.quantiles(secs, n=4)
        median = sorted(full, key=lambda s: s.duration_s)[(len(full) - 1) // 2]
        # One step's own shape and time (the median step), never a mix of two steps.
        return Measurement("decode", b, c, rep, median.batch, median.duration_s, q[2] - q[0])

    # -- the worker's step stream ---------------------------------------------------------------

    async def _watch_steps(
        self,
    ) -> grpc.aio.UnaryStreamCall[worker_pb2.WatchStepsRequest, worker_pb2.StepSample] | None:
        """Open `WatchSteps`; None when the worker does not serve it. The worker sends its
        initial metadata once the subscription is in place, so no step is missed after this."""
        call = self.stub.WatchSteps(worker_pb2.WatchStepsRequest(max_buffer=1 << 16))
        try:
            metadata = await asyncio.wait_for(call.initial_metadata(), timeout=10.0)
        except TimeoutError:
            call.cancel()
            return None
        if any(key == "splitserve-watch-steps" for key, _ in metadata or ()):
            return call
        # No such header: an answer without a stream (UNIMPLEMENTED), or a worker that streams
        # without announcing it (still running after a moment).
        try:
            code = await asyncio.wait_for(asyncio.shield(call.code()), timeout=2.0)
        except TimeoutError:
            return call
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return None
        raise ProfileError(f"WatchSteps failed: {code.name}: {await call.details()}")

    async def _read_steps(
        self, call: grpc.aio.UnaryStreamCall[worker_pb2.WatchStepsRequest, worker_pb2.StepSample]
    ) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for pb in call:
                self.steps.append(step_from_pb(pb))
                self.stats.steps_dropped = pb.dropped

    async def _reported_step(self, mark: int, want: BatchShape) -> StepSample | None:
        """The first step since `mark` of exactly the shape `want` (waiting for its sample)."""
        deadline = self.now() + max(1.0, 20 * self._rtt_hi())
        while True:
            for s in self.steps[mark:]:
                if s.batch == want:
                    return s
            if self.now() > deadline:
                return None
            await asyncio.sleep(0.002)

    async def _quiet_steps(self) -> None:
        """Until the step stream has been silent for a while (the probe's samples are in)."""
        quiet = max(0.02, 4 * self._rtt_hi())
        seen = len(self.steps)
        while True:
            await asyncio.sleep(quiet)
            if len(self.steps) == seen:
                return
            seen = len(self.steps)

    # -- RPCs -----------------------------------------------------------------------------------

    async def _generate(self, prompt: Sequence[int], max_tokens: int) -> _Call:
        rid = f"splitserve-profile-{self._run_tag}-{next(self._ids)}"
        req = worker_pb2.GenerateRequest(
            request_id=rid,
            prompt_token_ids=list(prompt),
            sampling=common_pb2.SamplingParams(
                max_tokens=max_tokens, temperature=0.0, ignore_eos=True
            ),
            slo_class="profile",
        )
        call = _Call(self.now())
        received = 0
        try:
            async for chunk in self.stub.Generate(req, timeout=self.request_timeout_s):
                t = self.now()
                if chunk.finish_reason == common_pb2.FINISH_REASON_ERROR:
                    raise ProfileError(f"the worker failed a probe: {chunk.error}")
                if chunk.token_ids:
                    received += len(chunk.token_ids)
                    call.arrivals.append((t, received))
                    if math.isnan(call.first_s):
                        call.first_s = t
        except grpc.aio.AioRpcError as err:
            raise ProfileError(
                f"the worker refused a probe of {len(prompt)} prompt tokens, {max_tokens} "
                f"output: {err.code().name}: {err.details()}"
            ) from err
        if received < max_tokens:
            raise ProfileError(
                f"a probe got {received} of {max_tokens} tokens (does the engine ignore "
                "ignore_eos, or is max_model_len smaller than --max-model-len?)"
            )
        return call

    async def _ping(self) -> None:
        """Round trip of the cheapest RPC (Cancel of an unknown id): the gRPC latency floor."""
        t0 = self.now()
        await self.stub.Cancel(
            worker_pb2.CancelRequest(request_id=f"splitserve-profile-{self._run_tag}-ping"),
            timeout=10.0,
        )
        self._rtts.append(self.now() - t0)

    def _rtt_hi(self) -> float:
        rtts = sorted(self._rtts)
        return rtts[min(len(rtts) - 1, int(0.9 * len(rtts)))] if rtts else 0.0

    async def _load(self) -> common_pb2.LoadReport:
        stream = self.stub.WatchLoad(worker_pb2.WatchLoadRequest(interval_s=0.05))
        try:
            async for report in stream:
                return cast(common_pb2.LoadReport, report)
        except grpc.aio.AioRpcError as err:
            raise ProfileError(f"cannot read the worker's load: {err.details()}") from err
        finally:
            stream.cancel()
        raise ProfileError("the worker closed its load stream")

    async def _wait_idle(self) -> None:
        """Until nothing is queued or running (ours finish within a step or two)."""
        deadline = self.now() + self.idle_timeout_s
        while True:
            report = await self._load()
            if report.num_running == 0 and report.num_waiting == 0:
                return
            if self.now() > deadline:
                raise ProfileError(
                    f"the worker is not idle ({report.num_running} running, "
                    f"{report.num_waiting} waiting): take it out of the router before profiling"
                )
            await asyncio.sleep(0.02)

    def _prompt(self, n: int) -> list[int]:
        lo, hi = self.token_range
        return [self._rng.randrange(lo, hi) for _ in range(n)]


async def profile_worker(
    address: str,
    grid: ProfileGrid,
    *,
    token_range: tuple[int, int] = (16, 1000),
    seed: int = 0,
    set_mixed: bool = False,
    progress: Callable[[str], None] | None = None,
    method: Method = "auto",
    connect_timeout_s: float = 15.0,
) -> tuple[list[Measurement], ProfileStats, list[StepSample]]:
    """Connect to `address` (host:port), profile the worker there, close the channel."""
    async with tls.aio_channel(address) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=connect_timeout_s)
        except TimeoutError as err:
            hint = (
                ""
                if tls.identity() is not None
                else " (or it requires mutual TLS, as a `splitserve up` stack's workers do: give "
                "--tls-dir, e.g. <run-dir>/pki/admin)"
            )
            raise ProfileError(f"no worker answers at {address}{hint}") from err
        profiler = Profiler(
            worker_pb2_grpc.WorkerStub(channel),
            grid,
            token_range=token_range,
            seed=seed,
            set_mixed=set_mixed,
            progress=progress,
            method=method,
        )
        samples = await profiler.run()
        return samples, profiler.stats, profiler.steps
