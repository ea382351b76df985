"""ALISE predicted-SRPT step policy.

Invariants:
1. with room for one, the sequence with the shorter predicted remaining time runs first;
2. a misprediction doubles the prediction (50 -> 100 -> 200 -> 400) up to the output cap and
   demotes the sequence;
3. a sequence that has not run for `aging_s` is promoted, and one aged past every queue is served
   before any unaged sequence, however short (no starvation);
4. a waiting sequence of a strictly better queue displaces the worst running one; the
   swap/recompute choice follows the PCIe-vs-prefill cost model;
5. decisions drive the engine to completion for random workloads (every decision is valid);
6. it is registered as "alise";
7. with `preemption="swap"` a victim is swapped out while the host has room, else recomputed; a
   swapped sequence resumes through an ordinary chunk; the engine's predicted length
   (`SeqView.predicted_output_tokens`) is used in place of the policy's own predictor.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import RequestId
from splitserve.policy.batching import SeqView, StepView, make_batching_policy
from splitserve.policy.batching.alise import AliseParams, AlisePolicy
from splitserve.policy.predict import OraclePredictor
from splitserve.sim.reproductions.pastfuture_cluster import run_token_level


def seq(
    rid: str, prompt: int, outputs: int = 0, arrival: float = 0.0, held: int | None = None
) -> SeqView:
    computed = prompt + outputs - 1 if outputs else 0
    return SeqView(
        RequestId(rid), arrival, prompt, outputs, computed, 4096, computed if held is None else held
    )


def oracle(truth: dict[str, int], **kw: object) -> AlisePolicy:
    params = AliseParams(**kw)  # type: ignore[arg-type]
    return AlisePolicy(params, OraclePredictor({RequestId(k): v for k, v in truth.items()}))


def test_shortest_predicted_first() -> None:
    policy = oracle({"long": 1000, "short": 20}, max_num_seqs=1)
    view = StepView(0.0, (seq("long", 10), seq("short", 10, arrival=1.0)), (), 100, 100, 1)
    assert policy.decide(view).chunks == ((RequestId("short"), 10),)


def test_overrun_doubles_and_demotes() -> None:
    policy = oracle({"a": 50}, max_output_tokens=300)
    seen = []
    for out in (10, 50, 100, 200, 300):
        policy.decide(StepView(0.0, (), (seq("a", 5, out),), 10_000, 10_000, 1))
        job = policy._jobs[RequestId("a")]
        seen.append((job.predicted_tokens, job.demotions))
    assert seen == [(50, 0), (100, 1), (200, 2), (300, 3), (300, 3)]


def test_aged_sequence_goes_first() -> None:
    policy = oracle({"long": 4000, "short": 2}, max_num_seqs=1, aging_s=1.0)
    waiting = (seq("long", 10), seq("short", 10, arrival=0.5))
    # Long has waited 12 s: promoted once per step it is seen waiting past the aging threshold.
    for now in range(1, 13):
        decision = policy.decide(StepView(float(now), waiting, (), 100, 100, 1))
    assert decision.chunks == ((RequestId("long"), 10),)
    fresh = oracle({"long": 4000, "short": 2}, max_num_seqs=1, aging_s=1.0)
    first = fresh.decide(StepView(0.0, waiting, (), 100, 100, 1))
    assert first.chunks == ((RequestId("short"), 10),)


def test_waiting_short_job_displaces_long_running_one() -> None:
    policy = oracle({"long": 4000, "short": 3}, displace_running=True)
    running = (seq("long", 50, 10),)  # holds 59 of 60 blocks
    view = StepView(0.0, (seq("short", 20, arrival=1.0),), running, 1, 60, 1)
    decision = policy.decide(view)
    assert decision.preempt == (RequestId("long"),)
    assert (RequestId("short"), 20) in decision.chunks
    assert sum(policy.preemption_choices.values()) == 1
    default = oracle({"long": 4000, "short": 3})
    assert default.decide(view).preempt == ()


def test_swap_or_recompute() -> None:
    big = seq("x", 4000, 10)
    slow_pcie = AlisePolicy(AliseParams(pcie_bytes_per_s=1e9))
    fast_pcie = AlisePolicy(AliseParams(pcie_bytes_per_s=1e12))
    assert not slow_pcie.prefers_swap(big, 1)
    assert fast_pcie.prefers_swap(big, 1)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(2, 60)), min_size=1, max_size=25))
def test_runs_to_completion(lengths: list[tuple[int, int]]) -> None:
    policy = AlisePolicy(AliseParams(max_output_tokens=64, aging_s=20.0, max_num_batched_tokens=64))
    run = run_token_level(policy, lengths, 200, block_size=4)
    assert run.num_requests == len(lengths)


def test_registered() -> None:
    policy = make_batching_policy("alise", aging_s=2.0)
    assert isinstance(policy, AlisePolicy)
    assert policy.params.aging_s == 2.0


def test_swap_preemption_uses_host_space_then_recomputes() -> None:
    running = (seq("long", 50, 10),)  # holds 59 of 60 blocks
    waiting = (seq("short", 20, arrival=1.0),)
    truth = {"long": 4000, "short": 3}
    swapping = oracle(truth, displace_running=True, preemption="swap")
    roomy = StepView(0.0, waiting, running, 1, 60, 1, host_free_tokens=1000)
    decision = swapping.decide(roomy)
    assert decision.swap_out == (RequestId("long"),)
    assert decision.preempt == ()
    assert swapping.preemption_choices["swap"] == 1
    full = oracle(truth, displace_running=True, preemption="swap")
    decision = full.decide(StepView(0.0, waiting, running, 1, 60, 1, host_free_tokens=10))
    assert decision.preempt == (RequestId("long"),)
    assert decision.swap_out == ()
    assert full.preemption_choices["recompute"] == 1


def test_swapped_sequence_resumes_through_a_chunk() -> None:
    policy = oracle({"back": 30}, preemption="swap")
    back = SeqView(RequestId("back"), 0.0, 20, 5, 24, 4096, 0)  # swapped: computed, no blocks
    assert back.swapped
    decision = policy.decide(StepView(0.0, (back,), (), 100, 100, 1))
    assert decision.chunks == ((RequestId("back"), 1),)


def test_engine_prediction_wins_over_own_predictor() -> None:
    policy = oracle({"a": 1000, "b": 1000}, max_num_seqs=1)
    a = replace(seq("a", 10), predicted_output_tokens=900)
    b = replace(seq("b", 10, arrival=1.0), predicted_output_tokens=5)
    assert policy.decide(StepView(0.0, (a, b), (), 100, 100, 1)).chunks == ((RequestId("b"), 10),)
    assert policy._jobs[RequestId("b")].predicted_tokens == 5
