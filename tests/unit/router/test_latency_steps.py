"""The router fits each worker's latency model from its `WatchSteps` stream (real sim worker,
real gRPC), and falls back to request timings for a worker without steps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.core.clock import SystemClock
from splitserve.core.ids import EndpointId
from splitserve.core.perf import BatchShape
from splitserve.core.roles import Role
from splitserve.obs.metrics import WorkerMetrics
from splitserve.policy.predict.step_model import OnlineStepModel
from splitserve.router import latency as latency_mod
from splitserve.router.pool_view import PoolView
from splitserve.worker.engine import StepFeed, StepSample
from splitserve.worker.runtime import WorkerConfig, _ReleaseClient, build_sim_engine
from splitserve.worker.server import WorkerIdentity, WorkerService, bind, start
from splitserve.worker.sim_engine import SimEngine
from tests.unit.router.conftest import FAST_POOL, WorkerFactory

SimFactory = Callable[..., Coroutine[Any, Any, tuple[str, SimEngine]]]


@pytest.fixture
async def sim_worker() -> AsyncIterator[SimFactory]:
    cleanups: list[Callable[[], Coroutine[Any, Any, None]]] = []

    async def factory(
        role: Role, service_cls: type[WorkerService] = WorkerService
    ) -> tuple[str, SimEngine]:
        cfg = WorkerConfig(role=role, sim_time_scale=0.02, sim_num_kv_blocks=512, vocab_size=1000)
        server, port = bind("127.0.0.1", 0)
        address = f"127.0.0.1:{port}"
        release = _ReleaseClient()
        metrics = WorkerMetrics(CollectorRegistry())
        engine = build_sim_engine(cfg, address, release, metrics)
        service = service_cls(
            engine, role, WorkerIdentity(address, address), metrics, SystemClock()
        )
        await engine.start()
        await start(server, service)

        async def cleanup() -> None:
            await server.stop(None)
            await engine.stop()
            await release.close()

        cleanups.append(cleanup)
        assert isinstance(engine, SimEngine)
        return address, engine

    yield factory
    for c in reversed(cleanups):
        await c()


async def _until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def _generate(address: str, rid: str, prompt: int, max_tokens: int) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        req = worker_pb2.GenerateRequest(
            request_id=rid,
            prompt_token_ids=[16 + i % 500 for i in range(prompt)],
            sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        )
        async for _ in stub.Generate(req):
            pass


async def test_step_reports_fit_the_workers_latency_model(sim_worker: SimFactory) -> None:
    address, engine = await sim_worker(Role.MIXED)
    eid = EndpointId(address)
    async with PoolView([address], clock=SystemClock(), settings=FAST_POOL) as pool:
        await pool.wait_for(lambda pv: pv.view(address).ready, 10)
        model = pool.latency.step_model(eid)
        assert model is not None
        for i in range(8):  # one at a time: prefill-only steps of several lengths
            await _generate(address, f"s{i}", 64 + 120 * i, 4)
        for wave in range(6):  # batches of several sizes and prompt lengths
            await asyncio.gather(
                *(_generate(address, f"r{wave}-{i}", 64 + 96 * i, 12) for i in range(1 + wave * 2))
            )
        await _until(lambda: model.fitted is not None)
        fitted = model.fitted
        assert fitted is not None
        truth = engine.latency
        # A mixed worker also runs mixed steps, which the roofline prices as max(compute,
        # memory) and the fit's A.4 forms as a sum: decode steps track closely, a prefill-only
        # step within 35 % (the approximation is stated in `policy.predict.step_model`).
        for shape, tolerance in (
            (BatchShape(decode_contexts=(300,) * 4), 0.2),
            (BatchShape(decode_contexts=(500,) * 9), 0.2),
            (BatchShape(prefill_chunks=((400, 0),)), 0.35),
        ):
            error = abs(fitted.step_s(shape) - truth.step_s(shape)) / truth.step_s(shape)
            assert error < tolerance, shape
        view = pool.view(address)
        assert view.prefill_tokens_per_s > 0
        assert view.decode_step_base_s > 0 or view.decode_step_per_seq_s > 0


async def test_worker_without_steps_falls_back_to_request_timings(
    make_worker: WorkerFactory,
) -> None:
    d = await make_worker(Role.DECODE)
    eid = EndpointId(d.address)
    async with PoolView([d.address], clock=SystemClock(), settings=FAST_POOL) as pool:
        await pool.wait_for(lambda pv: pv.view(d.address).ready, 10)
        await d.wait_call("WatchSteps")
        for batch, tpot in ((1, 0.011), (2, 0.012), (4, 0.014), (8, 0.018)):
            pool.latency.observe_decode(eid, batch, tpot)
        base, per = (
            pool.view(d.address).decode_step_base_s,
            pool.view(d.address).decode_step_per_seq_s,
        )
        assert base == pytest.approx(0.010, abs=1e-3)
        assert per == pytest.approx(0.001, abs=2e-4)


class _Recording(WorkerService):
    """The real worker, noting which step stream its watchers used."""

    streams: list[str]

    async def WatchSteps(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: Any
    ) -> AsyncIterator[worker_pb2.StepSample]:
        self.streams.append("WatchSteps")
        async for pb in super().WatchSteps(request, context):
            yield pb

    async def WatchStepBatches(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: Any
    ) -> AsyncIterator[worker_pb2.StepSampleBatch]:
        self.streams.append("WatchStepBatches")
        async for pb in super().WatchStepBatches(request, context):
            yield pb


class _OlderWorker(_Recording):
    """A worker from before `WatchStepBatches` (it serves `WatchSteps` only)."""

    async def WatchStepBatches(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: Any
    ) -> AsyncIterator[worker_pb2.StepSampleBatch]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        yield worker_pb2.StepSampleBatch()  # unreachable: makes this an async generator


@pytest.mark.parametrize(
    ("service_cls", "stream"),
    [(_Recording, "WatchStepBatches"), (_OlderWorker, "WatchSteps")],
)
async def test_step_reports_arrive_with_or_without_batches(
    sim_worker: SimFactory,
    service_cls: type[_Recording],
    stream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The router asks for `WatchStepBatches` and falls back to `WatchSteps` when a worker does
    not serve it; either way every step reaches the step model."""
    service_cls.streams = []
    address, engine = await sim_worker(Role.MIXED, service_cls)
    eid = EndpointId(address)
    async with PoolView([address], clock=SystemClock(), settings=FAST_POOL) as pool:
        await pool.wait_for(lambda pv: pv.view(address).ready, 10)
        model = pool.latency.step_model(eid)
        assert model is not None
        seen: list[tuple[BatchShape, float]] = []
        observe_parts = OnlineStepModel.observe_parts

        def recording(
            self: OnlineStepModel,
            prefill_chunks: Sequence[tuple[int, int]],
            decode_contexts: Sequence[int],
            seconds: float,
        ) -> None:
            shape = BatchShape(tuple(prefill_chunks), tuple(decode_contexts))
            seen.append((shape, seconds))
            observe_parts(self, prefill_chunks, decode_contexts, seconds)

        monkeypatch.setattr(OnlineStepModel, "observe_parts", recording)
        await _until(lambda: engine.steps is not None and engine.steps.num_subscribers == 1)
        await _generate(address, "a", 40, 5)
        await _until(lambda: len(seen) >= 5)
        assert [b for b, _ in seen] == [
            BatchShape(prefill_chunks=((40, 0),)),
            *(BatchShape(decode_contexts=(40 + i,)) for i in range(4)),
        ]
        assert all(s > 0 for _, s in seen)
        assert service_cls.streams == [stream]


class _Requests(WorkerService):
    """The real worker, noting the step-stream requests it got."""

    requests: list[worker_pb2.WatchStepsRequest]

    async def WatchStepBatches(  # noqa: N802
        self, request: worker_pb2.WatchStepsRequest, context: Any
    ) -> AsyncIterator[worker_pb2.StepSampleBatch]:
        self.requests.append(request)
        async for pb in super().WatchStepBatches(request, context):
            yield pb


async def test_the_router_asks_for_the_books_step_rate(sim_worker: SimFactory) -> None:
    """The default book sends an old-style request (every step); a book given a rate sends it."""
    _Requests.requests = []
    address, engine = await sim_worker(Role.MIXED, _Requests)
    steps = engine.steps
    assert steps is not None
    async with PoolView([address], clock=SystemClock(), settings=FAST_POOL):
        await _until(lambda: steps.num_subscribers == 1)
    await _until(lambda: steps.num_subscribers == 0)
    pool = PoolView([address], clock=SystemClock(), settings=FAST_POOL)
    pool.latency.max_samples_per_s = 250.0
    async with pool:
        await _until(lambda: steps.num_subscribers == 1)
    assert [r.max_samples_per_s for r in _Requests.requests] == [
        latency_mod.STEP_SAMPLES_PER_S,
        250.0,
    ]


def test_a_model_fed_a_thinned_burst_stays_fitted() -> None:
    """A zero-delay worker's burst (20,000 steps in 2 s of its clock), thinned to 400/s, still
    fits the step model and its decode estimate."""
    feed = StepFeed()
    sub = feed.subscribe(max_buffer=10_000, min_interval_s=1 / 400)

    def truth(b: BatchShape) -> float:  # base 2 ms + 20 us per sequence + 10 ns per KV token
        return 0.002 + 2e-5 * len(b.decode_contexts) + 1e-8 * sum(b.decode_contexts)

    for i in range(20_000):
        batch = BatchShape(decode_contexts=(200 + i % 300,) * (1 + i % 16))
        feed.publish(StepSample(i + 1, i * 1e-4, truth(batch), batch))
    kept = [sub._buffer.popleft() for _ in range(len(sub._buffer))]
    assert len(kept) <= 1 + 2 * 400
    model = OnlineStepModel()
    for s in kept:
        model.observe(s.batch, s.duration_s)
    assert model.fitted is not None
    base, per = model.decode_step()
    assert base == pytest.approx(0.002, rel=0.05)
    ctx = sum(model._contexts) / len(model._contexts)
    assert per == pytest.approx(2e-5 + 1e-8 * ctx, rel=0.1)


def test_a_bad_sample_rate_is_refused_by_the_book() -> None:
    with pytest.raises(ValueError, match="max_samples_per_s"):
        latency_mod.LatencyBook(max_samples_per_s=-1.0)
