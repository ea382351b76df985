"""`WatchSteps`: per-step samples from a real in-process sim worker over real gRPC."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.core.perf import HARDWARE, MODELS, BatchShape, RooflineModel
from splitserve.core.roles import Role
from splitserve.worker.engine import StepFeed, StepSample
from splitserve.worker.profiler import ProfileGrid, Profiler
from splitserve.worker.server import step_from_pb
from splitserve.worker.sim_engine import SimEngine
from tests.fakes.fake_worker import FakeWorker
from tests.unit.worker.conftest import RunningWorker, WorkerFactory

SCALE = 0.05
ROOFLINE = RooflineModel(MODELS["llama-2-7b"], HARDWARE["a100-80g"], time_scale=SCALE)


def _feed(worker: RunningWorker) -> StepFeed:
    engine = worker.service.engine
    assert isinstance(engine, SimEngine)
    assert engine.steps is not None
    return engine.steps


async def _until(cond: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def _generate(worker: RunningWorker, rid: str, prompt: int, max_tokens: int) -> int:
    req = worker_pb2.GenerateRequest(
        request_id=rid,
        prompt_token_ids=[16 + i % 500 for i in range(prompt)],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )
    return sum([len(c.token_ids) async for c in worker.stub.Generate(req)])


async def _watch(worker: RunningWorker, max_buffer: int = 0) -> Any:
    call = worker.stub.WatchSteps(worker_pb2.WatchStepsRequest(max_buffer=max_buffer))
    await _until(lambda: _feed(worker).num_subscribers >= 1)
    return call


async def _take(stream: AsyncIterator[Any], until_decodes: int) -> list[worker_pb2.StepSample]:
    out: list[worker_pb2.StepSample] = []
    decodes = 0
    async for pb in stream:
        out.append(pb)
        decodes += len(pb.decode_context_tokens)
        if decodes >= until_decodes:
            return out
    raise AssertionError("stream ended")


async def test_samples_have_the_shapes_sent_and_the_roofline_price(
    make_worker: WorkerFactory,
) -> None:
    worker = await make_worker(Role.MIXED, sim_time_scale=SCALE)
    call = await _watch(worker)
    stream = call.__aiter__()
    assert await _generate(worker, "a", 100, 4) == 4
    got = await _take(stream, 3)
    samples = [step_from_pb(pb) for pb in got]
    assert [s.batch for s in samples] == [
        BatchShape(prefill_chunks=((100, 0),)),
        BatchShape(decode_contexts=(100,)),
        BatchShape(decode_contexts=(101,)),
        BatchShape(decode_contexts=(102,)),
    ]
    assert [pb.num_seqs for pb in got] == [1, 1, 1, 1]
    assert all(pb.dropped == 0 for pb in got)
    idx = [s.index for s in samples]
    assert idx == list(range(idx[0], idx[0] + 4))
    for s in samples:  # the latency model's price of the reported shape, exactly
        assert s.duration_s == pytest.approx(ROOFLINE.step_s(s.batch), rel=1e-12)
    starts = [s.start_s for s in samples]
    gaps = zip(starts, starts[1:], samples, strict=False)
    assert all(b - a >= s.duration_s - 1e-3 for a, b, s in gaps)  # steps run back to back

    # Two requests together: a batched prefill, then steps decoding both.
    results = await asyncio.gather(_generate(worker, "b", 64, 3), _generate(worker, "c", 32, 3))
    assert list(results) == [3, 3]
    more = [step_from_pb(pb) for pb in await _take(stream, 4)]
    chunks = sorted(c for s in more for c in s.batch.prefill_chunks)
    assert chunks == [(32, 0), (64, 0)]
    assert sorted(ctx for s in more for ctx in s.batch.decode_contexts) == [32, 33, 64, 65]
    for s in more:
        assert s.duration_s == pytest.approx(ROOFLINE.step_s(s.batch), rel=1e-12)
    call.cancel()


async def test_a_slow_watcher_does_not_block_the_engine(make_worker: WorkerFactory) -> None:
    worker = await make_worker(Role.MIXED, sim_time_scale=0.01)
    feed = _feed(worker)
    idle = feed.subscribe(max_buffer=2)  # never read
    stalled = await _watch(worker, max_buffer=2)  # a gRPC watcher that never reads either
    assert await asyncio.wait_for(_generate(worker, "slow", 16, 40), timeout=20) == 40
    assert idle.dropped == 40 - 2  # one prefill + 39 decode steps, two kept
    last = [await idle.get(), await idle.get()]
    assert [s.batch.decode_contexts for s in last] == [(53,), (54,)]
    # The gRPC watcher, read late: what it missed is counted, the newest steps are there.
    samples = []
    async for pb in stalled:
        samples.append(pb)
        if tuple(pb.decode_context_tokens) == (54,):
            break
    assert samples[-1].index == last[-1].index
    assert samples[-1].dropped + len(samples) <= 40
    stalled.cancel()
    idle.close()
    await _until(lambda: feed.num_subscribers == 0)


async def test_watchers_are_removed_when_they_cancel(make_worker: WorkerFactory) -> None:
    worker = await make_worker(Role.MIXED)
    feed = _feed(worker)
    calls = [await _watch(worker) for _ in range(2)]
    await _until(lambda: feed.num_subscribers == 2)
    calls[0].cancel()
    await _until(lambda: feed.num_subscribers == 1)
    assert await _generate(worker, "x", 8, 2) == 2
    async for pb in calls[1]:  # the other watcher still gets every step
        assert [c.new_tokens for c in pb.prefill_chunks] == [8]
        break
    calls[1].cancel()
    await _until(lambda: feed.num_subscribers == 0)
    assert not feed.active


async def test_engines_without_steps_answer_unimplemented(make_worker: WorkerFactory) -> None:
    worker = await make_worker(Role.MIXED)
    engine = worker.service.engine
    assert isinstance(engine, SimEngine)
    engine.steps = None
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in worker.stub.WatchSteps(worker_pb2.WatchStepsRequest()):
            pass
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_nobody_watching_costs_nothing() -> None:
    feed = StepFeed()
    assert not feed.active
    sub = feed.subscribe(max_buffer=3)
    for i in range(5):
        feed.publish(StepSample(i + 1, float(i), 0.01, BatchShape(decode_contexts=(i,))))
    assert sub.dropped == 2
    assert feed.active
    sub.close()
    sub.close()
    assert not feed.active
    assert feed.num_subscribers == 0


async def test_a_worker_without_watch_steps_is_seen_as_such() -> None:
    """An older worker (no WatchSteps in its servicer) answers UNIMPLEMENTED: the profiler's
    `auto` then falls back to client-side timing."""
    fake = FakeWorker()
    address = await fake.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            profiler = Profiler(worker_pb2_grpc.WorkerStub(channel), ProfileGrid())
            assert await profiler._watch_steps() is None
    finally:
        await fake.stop()


async def test_step_batches_carry_every_step_in_order(make_worker: WorkerFactory) -> None:
    """`WatchStepBatches`: the same samples as `WatchSteps`, in order; the steps that queue
    while the stream's writer is busy leave as one message."""
    worker = await make_worker(Role.MIXED, sim_time_scale=0.01)
    call = worker.stub.WatchStepBatches(worker_pb2.WatchStepsRequest())
    await _until(lambda: _feed(worker).num_subscribers >= 1)
    one = await _watch(worker)  # the one-sample stream beside it, for comparison
    assert await _generate(worker, "a", 16, 6) == 6
    singles = await _take(one.__aiter__(), 5)
    got: list[worker_pb2.StepSample] = []
    sizes = []
    batches = call.__aiter__()
    async for batch in batches:
        sizes.append(len(batch.samples))
        got.extend(batch.samples)
        if sum(len(s.decode_context_tokens) for s in got) >= 5:
            break
    assert [s.SerializeToString() for s in got] == [s.SerializeToString() for s in singles]
    assert [s.index for s in got] == list(range(got[0].index, got[0].index + 6))
    assert all(n >= 1 for n in sizes)
    # Steps published while the stream's writer waits (here: in one go) leave as one message.
    feed = _feed(worker)
    for i in range(5):
        feed.publish(StepSample(1000 + i, float(i), 0.01, BatchShape(decode_contexts=(i,))))
    batch = await anext(batches)
    assert [s.index for s in batch.samples] == [1000, 1001, 1002, 1003, 1004]
    assert [tuple(s.decode_context_tokens) for s in batch.samples] == [(i,) for i in range(5)]
    call.cancel()
    one.cancel()
    await _until(lambda: _feed(worker).num_subscribers == 0)


async def test_step_batches_without_steps_answer_unimplemented(
    make_worker: WorkerFactory,
) -> None:
    worker = await make_worker(Role.MIXED)
    engine = worker.service.engine
    assert isinstance(engine, SimEngine)
    engine.steps = None
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in worker.stub.WatchStepBatches(worker_pb2.WatchStepsRequest()):
            pass
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _burst(feed: StepFeed, steps: int, every_s: float, prefill_every: int = 0) -> None:
    """`steps` back-to-back steps `every_s` apart on the worker clock; every `prefill_every`-th
    one carries a prefill chunk (0: none)."""
    for i in range(steps):
        if prefill_every and i % prefill_every == 0:
            batch = BatchShape(prefill_chunks=((64 + i % 7, 0),))
        else:
            batch = BatchShape(decode_contexts=(100 + i % 50,) * (1 + i % 4))
        feed.publish(StepSample(i + 1, i * every_s, every_s, batch))


def test_a_thinned_watcher_gets_at_most_its_rate_of_each_kind() -> None:
    feed = StepFeed()
    every = feed.subscribe(max_buffer=10_000)
    thin = feed.subscribe(max_buffer=10_000, min_interval_s=0.01)  # 100 samples/s
    _burst(feed, 2000, 0.0005, prefill_every=20)  # 1 s of 2,000 steps, 100 of them prefill
    everything = [every._buffer.popleft() for _ in range(len(every._buffer))]
    kept = [thin._buffer.popleft() for _ in range(len(thin._buffer))]
    assert len(everything) == 2000  # the watcher that asked for nothing gets every step
    decode = [s for s in kept if not s.batch.prefill_chunks]
    prefill = [s for s in kept if s.batch.prefill_chunks]
    span = everything[-1].start_s - everything[0].start_s
    for kind in (decode, prefill):
        assert 0.8 * span / 0.01 <= len(kind) <= 1 + span / 0.01
        gaps = [b.start_s - a.start_s for a, b in itertools.pairwise(kind)]
        assert min(gaps) >= 0.01 - 1e-12
    # Each kept sample is one real step, unchanged; the rest are counted as thinned, not dropped.
    by_index = {s.index: s for s in everything}
    assert all(by_index[s.index] == s for s in kept)
    assert thin.thinned == 2000 - len(kept)
    assert thin.dropped == every.dropped == 0


async def test_watch_steps_thins_on_request_and_not_without(make_worker: WorkerFactory) -> None:
    """Over gRPC: `max_samples_per_s` thins a watcher's stream; an old-style request (field
    unset) still gets every step."""
    worker = await make_worker(Role.MIXED)
    feed = _feed(worker)
    thin = worker.stub.WatchStepBatches(worker_pb2.WatchStepsRequest(max_samples_per_s=50))
    full = worker.stub.WatchStepBatches(worker_pb2.WatchStepsRequest())
    await _until(lambda: feed.num_subscribers == 2)
    _burst(feed, 1000, 0.001)  # 1 s of decode steps at 1,000/s
    feed.publish(StepSample(5000, 10.0, 0.001, BatchShape(decode_contexts=(1,))))  # a marker

    async def until_marker(call: Any) -> list[worker_pb2.StepSample]:
        out: list[worker_pb2.StepSample] = []
        async for batch in call:
            out.extend(batch.samples)
            if out[-1].index == 5000:
                return out
        raise AssertionError("stream ended")

    got_thin = await until_marker(thin)
    got_full = await until_marker(full)
    assert len(got_full) == 1001
    assert 40 <= len(got_thin) - 1 <= 51  # <= 1 + 1 s x 50/s, and still samples
    assert all(s.dropped == 0 for s in got_thin)
    thin.cancel()
    full.cancel()
    await _until(lambda: feed.num_subscribers == 0)


@pytest.mark.parametrize("rate", [-1.0, math.nan, math.inf])
async def test_a_bad_sample_rate_is_refused(make_worker: WorkerFactory, rate: float) -> None:
    worker = await make_worker(Role.MIXED)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in worker.stub.WatchSteps(worker_pb2.WatchStepsRequest(max_samples_per_s=rate)):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_samples_per_s" in (err.value.details() or "")
