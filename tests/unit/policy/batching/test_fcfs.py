"""FCFS with chunked prefill: running first, then waiting in arrival order, no overtaking."""

from __future__ import annotations

import pytest

from splitserve.core.errors import ConfigError
from splitserve.core.ids import RequestId
from splitserve.policy.batching import FcfsParams, FcfsPolicy, SeqView, StepView
from splitserve.policy.batching.builtin import BATCHING, make_batching_policy


def seq(
    rid: str, prompt: int, computed: int = 0, out: int = 0, held: int = 0, arrival: float = 0.0
) -> SeqView:
    return SeqView(RequestId(rid), arrival, prompt, out, computed, 100, held)


def view(
    waiting: tuple[SeqView, ...] = (), running: tuple[SeqView, ...] = (), free: int = 100
) -> StepView:
    return StepView(0.0, waiting, running, free, 100, 16)


def test_running_decodes_come_before_waiting_prefills() -> None:
    policy = FcfsPolicy(FcfsParams(max_num_batched_tokens=100))
    d = view(waiting=(seq("w", 200),), running=(seq("r", 10, computed=12, out=3, held=1),))
    decision = policy.decide(d)
    assert decision.chunks == ((RequestId("r"), 1), (RequestId("w"), 99))


def test_no_overtaking_when_head_does_not_fit() -> None:
    policy = FcfsPolicy()
    d = view(waiting=(seq("big", 400, arrival=0), seq("small", 10, arrival=1)), free=10)
    assert policy.decide(d).chunks == ()


def test_seq_cap() -> None:
    policy = FcfsPolicy(FcfsParams(max_num_seqs=2))
    d = view(waiting=tuple(seq(f"w{i}", 10, arrival=i) for i in range(5)))
    assert [rid for rid, _ in policy.decide(d).chunks] == ["w0", "w1"]


def test_unchunked_prompt_over_budget_runs_alone() -> None:
    policy = FcfsPolicy(FcfsParams(max_num_batched_tokens=64, chunked_prefill=False))
    assert policy.decide(view(waiting=(seq("a", 100),))).chunks == ((RequestId("a"), 100),)
    two = view(waiting=(seq("s", 10), seq("a", 100, arrival=1)))
    assert policy.decide(two).chunks == ((RequestId("s"), 10),)


def test_preempts_latest_running_when_decodes_cannot_grow() -> None:
    policy = FcfsPolicy()
    running = (
        seq("old", 16, computed=16, out=1, held=1, arrival=0),
        seq("new", 16, computed=16, out=1, held=1, arrival=1),
    )
    decision = policy.decide(view(running=running, free=0))
    assert decision.preempt == (RequestId("new"),)
    assert decision.chunks == ((RequestId("old"), 1),)


def test_registry_builds_by_name_and_rejects_unknown() -> None:
    assert "fcfs" in BATCHING.names()
    policy = make_batching_policy("fcfs", max_num_batched_tokens=32)
    assert isinstance(policy, FcfsPolicy)
    assert policy.params.max_num_batched_tokens == 32
    with pytest.raises(ConfigError, match=r"valid: .*fcfs"):
        make_batching_policy("nope")
