"""`vllm_adapter.stats`: step time and per-request KV-pull time taken from vLLM's scheduler hooks,
over a fake scheduler (the real engine's run is tests/contract/vllm/test_vllm_engine_pd.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from splitserve.worker.vllm_adapter.stats import (
    MAX_TIMED_REQUESTS,
    MAX_TRACKED_PULLS,
    KvPullHook,
    KvPullTimer,
    RequestTimes,
    StepHook,
    StepTimer,
    external_id_of,
)


@dataclass
class FakeClock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Sink:
    steps: list[tuple[float | None, int]] = field(default_factory=list)
    pulls: list[tuple[str, int, float]] = field(default_factory=list)
    on_step_time: StepHook | None = None
    on_kv_pull: KvPullHook | None = None

    def __post_init__(self) -> None:
        self.on_step_time = lambda s, p: self.steps.append((s, p))
        self.on_kv_pull = lambda r, b, s: self.pulls.append((r, b, s))


class FakeScheduler:
    """The parts of vLLM's scheduler the hooks wrap or read."""

    def __init__(self) -> None:
        self.requests: dict[str, Any] = {}
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()
        self.next_tokens = 0

    def schedule(self) -> Any:
        return SimpleNamespace(total_num_scheduled_tokens=self.next_tokens)

    def add_request(self, request: Any) -> None:
        self.requests[request.request_id] = request

    def _update_from_kv_xfer_finished(self, output: Any) -> None:
        for rid in output.finished_recving:
            if rid not in self.failed_recving_kv_req_ids:
                self.finished_recving_kv_req_ids.add(rid)


def _request(rid: str, remote: bool, tokens: int = 10) -> Any:
    params = {"do_remote_prefill": True} if remote else None
    return SimpleNamespace(request_id=rid, kv_transfer_params=params, num_computed_tokens=tokens)


def test_a_step_is_timed_from_schedule_to_record_and_idle_steps_are_not() -> None:
    sink, clock, sched = Sink(), FakeClock(), FakeScheduler()
    timer = StepTimer(sink, now=clock)
    timer.tap(sched)
    sched.next_tokens = 8
    sched.schedule()
    clock.t += 0.25
    timer.record(SimpleNamespace(num_preempted_reqs=0))
    sched.next_tokens = 0  # nothing scheduled: the engine thread only polled
    sched.schedule()
    clock.t += 1.0
    timer.record(None)
    assert sink.steps == [(0.25, 0)]
    sched.next_tokens = 4
    sched.schedule()
    timer.record(SimpleNamespace(num_preempted_reqs=2))
    sched.next_tokens = 0
    sched.schedule()
    timer.record(SimpleNamespace(num_preempted_reqs=1))  # preempted in a step with no tokens
    assert sink.steps[1:] == [(0.0, 2), (None, 1)]


def test_a_pull_is_timed_from_admission_to_received() -> None:
    async def run() -> list[tuple[str, int, float]]:
        sink, clock, sched = Sink(), FakeClock(), FakeScheduler()
        timer = KvPullTimer(sink, asyncio.get_running_loop(), 64, lambda r: r.split("-")[0], clock)
        assert timer.tap(sched)
        sched.add_request(_request("a-1234", remote=True, tokens=10))
        sched.add_request(_request("b-5678", remote=False))  # aggregated: no pull
        sched.add_request(_request("c-0000", remote=True))
        sched.failed_recving_kv_req_ids.add("c-0000")
        clock.t += 0.5
        sched._update_from_kv_xfer_finished(SimpleNamespace(finished_recving={"a-1234"}))
        sched._update_from_kv_xfer_finished(SimpleNamespace(finished_recving={"c-0000"}))
        sched._update_from_kv_xfer_finished(SimpleNamespace(finished_recving={"a-1234"}))
        await asyncio.sleep(0)  # the hook runs on the loop
        return sink.pulls

    # One pull, once: bytes are the received tokens at the model's bytes per token; the failed
    # one and the repeated report are not observed.
    assert asyncio.run(run()) == [("a", 640, 0.5)]


def test_a_pull_done_in_step_is_timed_through_its_hook() -> None:
    """`nixl.PullInStep` hides in-step loads from `finished_recving` and reports them here."""

    async def run() -> list[tuple[str, int, float]]:
        sink, clock, sched = Sink(), FakeClock(), FakeScheduler()
        timer = KvPullTimer(sink, asyncio.get_running_loop(), 64, lambda r: r.split("-")[0], clock)
        assert timer.tap(sched)
        sched.add_request(_request("a-1", remote=True, tokens=301))  # + the step's token
        sched.add_request(_request("f-2", remote=True))
        clock.t += 0.25
        timer.received_in_step(sched.requests["a-1"], True, 300)
        timer.received_in_step(sched.requests["f-2"], False, 10)  # a failed read: not observed
        timer.received_in_step(sched.requests["a-1"], True, 300)  # once
        await asyncio.sleep(0)
        return sink.pulls

    assert asyncio.run(run()) == [("a", 300 * 64, 0.25)]


def test_pulls_of_requests_that_vanished_are_forgotten() -> None:
    loop = asyncio.new_event_loop()
    try:
        sched = FakeScheduler()
        timer = KvPullTimer(Sink(), loop, 1, str)
        timer.tap(sched)
        for i in range(MAX_TRACKED_PULLS + 10):
            sched.add_request(_request(f"r{i}", remote=True))
        assert len(timer._started) == MAX_TRACKED_PULLS
        assert "r0" not in timer._started
    finally:
        loop.close()


def test_a_scheduler_without_the_hooks_times_nothing() -> None:
    loop = asyncio.new_event_loop()
    try:
        assert KvPullTimer(Sink(), loop, 1, str).tap(SimpleNamespace()) is False
    finally:
        loop.close()


def test_external_ids_come_from_vllms_output_processor() -> None:
    states = {"x-abcdef12": SimpleNamespace(external_req_id="x")}
    engine = SimpleNamespace(output_processor=SimpleNamespace(request_states=states))
    external = external_id_of(engine)
    assert external("x-abcdef12") == "x"
    assert external("unknown") == "unknown"


def test_finished_requests_keep_vllms_queue_and_prefill_times_until_asked() -> None:
    times = RequestTimes()
    finished = [
        SimpleNamespace(request_id="p", queued_time=0.125, prefill_time=0.5),
        SimpleNamespace(request_id=None, queued_time=1.0, prefill_time=1.0),
    ]
    times.record(SimpleNamespace(finished_requests=finished))
    times.record(None)  # a step without request outputs
    assert times.pop("p") == (0.125, 0.5)
    assert times.pop("p") is None  # once
    for i in range(MAX_TIMED_REQUESTS + 5):
        one = SimpleNamespace(request_id=f"r{i}", queued_time=0.0, prefill_time=0.0)
        times.record(SimpleNamespace(finished_requests=[one]))
    assert times.pop("r0") is None  # nobody asked: forgotten
    assert times.pop(f"r{MAX_TIMED_REQUESTS + 4}") == (0.0, 0.0)
