"""Workers see the class: the router's SLO context (class, priority, TTFT budget) reaches the
engine's step policy as `SeqView.slo_class / priority / deadline_s` (issue 10 item 7)."""

from __future__ import annotations

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.clock import ManualClock
from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.kv import BlockManager
from splitserve.core.request import Request, SamplingSpec
from splitserve.core.roles import Role
from splitserve.policy.batching import FcfsParams, FcfsPolicy, StepDecision, StepView
from splitserve.policy.batching.engine import EngineModel, RequestMode
from splitserve.router import messages
from tests.unit.worker.conftest import WorkerFactory


class Recording:
    name = "recording"
    steady_decode = False

    def __init__(self) -> None:
        self.inner = FcfsPolicy(FcfsParams())
        self.views: list[StepView] = []

    def decide(self, view: StepView) -> StepDecision:
        self.views.append(view)
        return self.inner.decide(view)


def test_engine_model_puts_priority_and_deadline_in_the_seq_view() -> None:
    policy = Recording()
    engine = EngineModel(policy, BlockManager(64, 16), None)
    req = Request(
        RequestId("r"),
        (1,) * 20,
        SamplingSpec(max_tokens=3),
        arrival_s=5.0,
        slo_class=SloClassName("interactive"),
        priority=7,
        deadline_s=5.5,
    )
    engine.add(req, RequestMode.GENERATE)
    engine.schedule(5.0)
    [seq] = policy.views[0].waiting
    assert (seq.slo_class, seq.priority, seq.deadline_s) == ("interactive", 7, 5.5)


class _AbortingContext:
    """A servicer context whose `abort` fails the test (the request must be valid)."""

    async def abort(self, code: object, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


async def test_worker_rebases_the_routers_budget_on_its_own_clock(
    make_worker: WorkerFactory,
) -> None:
    w = await make_worker(Role.MIXED)
    clock = ManualClock(100.0)
    w.service.clock = clock
    ctx = common_pb2.SloContext(priority=3, ttft_budget_s=0.25, tpot_target_s=0.05)
    msg = messages.generate(
        Request(RequestId("r"), (1, 2), SamplingSpec(max_tokens=2), 0.0, SloClassName("batch")),
        slo=ctx,
    )
    ctx_ = _AbortingContext()
    req = await w.service._request(ctx_, msg)
    assert req.slo_class == "batch"
    assert req.priority == 3
    assert req.deadline_s == 100.25
    bare = worker_pb2.GenerateRequest(request_id="x", prompt_token_ids=[1], sampling=msg.sampling)
    none = await w.service._request(ctx_, bare)
    assert (none.slo_class, none.priority, none.deadline_s) == ("default", 0, None)
