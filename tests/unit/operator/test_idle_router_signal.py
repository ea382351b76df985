"""An idle router (no request yet) is "no traffic yet", not "a router without the SLO metrics".

The router declares its metric families from start-up (obs.metrics `RouterMetrics`), but a
labelled counter has no sample before its first request: the exposition carries the family's
`# TYPE` line and nothing else. That is a normal state; only a router whose exposition lacks the
families is misconfigured."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from splitserve.obs.metrics import RouterMetrics
from splitserve.operator.control.loop import held_key
from splitserve.operator.control.signals import (
    ClassTargets,
    Samples,
    Snapshot,
    Window,
    parse,
)
from splitserve.policy.planner.signals import Observation, SignalState
from tests.fakes.router_metrics import FakeRouterMetrics

ROUTER = "10.0.0.1:8000"
CHAT = [ClassTargets("chat", 2.0, 0.1, 0.9, 0.9)]


def _idle_text() -> str:
    registry = CollectorRegistry()
    RouterMetrics(registry)
    return generate_latest(registry).decode()


def _observe(*texts: str) -> list[str]:
    w = Window(60.0, 30.0)
    for i, text in enumerate(texts):
        w.add(Snapshot(10.0 * i, {ROUTER: parse(text)}))
    obs = w.observe(10.0 * (len(texts) - 1), CHAT, {})
    assert not obs.usable
    assert all(p.state is SignalState.MISSING for p in obs.problems)
    return [str(p) for p in obs.problems]


def test_an_idle_router_reads_no_traffic_yet() -> None:
    idle = _idle_text()
    problems = _observe(idle, idle)
    assert not any("without the SLO metrics" in p for p in problems), problems
    assert any(p.startswith(f"router {ROUTER}") and "no traffic yet" in p for p in problems)


def test_a_router_admitting_but_with_no_request_finished_yet_is_not_misconfigured() -> None:
    idle = _idle_text()
    # Arrivals counted, no SLO result yet: the SLO family is declared with no sample.
    text = idle.replace(
        "# TYPE splitserve_router_admission_total counter\n",
        "# TYPE splitserve_router_admission_total counter\n"
        'splitserve_router_admission_total{outcome="admitted",slo_class="chat"} 3.0\n',
    )
    assert "admission_total{" in text
    problems = _observe(text, text)
    assert not any("without the SLO metrics" in p for p in problems), problems


def test_an_idle_router_beside_a_busy_one_is_no_problem() -> None:
    fake = FakeRouterMetrics()
    idle = _idle_text()
    w = Window(60.0, 30.0)
    w.add(Snapshot(0.0, {ROUTER: parse(fake.text()), "10.0.0.2:8000": parse(idle)}))
    fake.serve(20)
    w.add(Snapshot(10.0, {ROUTER: parse(fake.text()), "10.0.0.2:8000": parse(idle)}))
    obs = w.observe(10.0, CHAT, {})
    assert obs.problems == ()
    assert obs.classes[0].requests == 20


def test_a_router_without_the_families_is_still_reported_as_such() -> None:
    text = "# TYPE splitserve_router_requests_total counter\nsplitserve_router_requests_total 5\n"
    problems = _observe(text, text)
    assert any("without the SLO metrics" in p for p in problems)
    assert not any("no traffic yet" in p for p in problems)


def _window_obs(*texts: str) -> Observation:
    w = Window(60.0, 30.0)
    for i, text in enumerate(texts):
        w.add(Snapshot(10.0 * i, {ROUTER: parse(text)}))
    return w.observe(10.0 * (len(texts) - 1), CHAT, {})


def _queued(text: str, n: int, router_queue: int | None = None) -> str:
    """`text` with `n` requests counted at arrival (queued at the gate, their prompts
    observed) and none finished: no SLO result, no output length."""
    out = text.replace(
        "# TYPE splitserve_router_admission_total counter\n",
        "# TYPE splitserve_router_admission_total counter\n"
        f'splitserve_router_admission_total{{outcome="queued",slo_class="chat"}} {n}.0\n',
    )
    out = out.replace(
        "# TYPE splitserve_router_prompt_length_tokens histogram\n",
        "# TYPE splitserve_router_prompt_length_tokens histogram\n"
        f'splitserve_router_prompt_length_tokens_bucket{{le="+Inf",slo_class="chat"}} {n}.0\n'
        f'splitserve_router_prompt_length_tokens_count{{slo_class="chat"}} {n}.0\n'
        f'splitserve_router_prompt_length_tokens_sum{{slo_class="chat"}} {2000 * n}.0\n',
    )
    if router_queue is not None:
        out = out.replace(
            "# TYPE splitserve_router_queue_depth gauge\n",
            "# TYPE splitserve_router_queue_depth gauge\n"
            f'splitserve_router_queue_depth{{slo_class="chat"}} {router_queue}.0\n',
        )
    return out


def test_the_first_arrivals_change_the_hold_that_up_and_the_operator_print() -> None:
    """`up --autoscale` and the operator print a hold once per change of `held_key`: when the
    first requests arrive (queued, none finished yet) the printed "no traffic yet" must give
    way to what the loop knows now, not stay on screen while requests queue."""
    idle = _idle_text()
    busy = _queued(idle, 60)
    before, after = _window_obs(idle, idle), _window_obs(idle, busy)
    assert any("no traffic yet" in str(p) for p in before.problems)
    assert after.no_finish_yet
    assert "no request finished yet" in after.why_unusable()
    assert held_key(before) != held_key(after)


def test_arrivals_before_the_first_finish_are_no_problem_but_a_known_state() -> None:
    """Requests arrived and queue at the router, none finished: the rate, the prompts and the
    queue are known, the output lengths and SLO results not. Not a missing signal that holds
    the loop (it acts on the queue, `autoscaler.before_first_finish`): `no_finish_yet`. An idle
    second router beside it is no problem either (its zero is known, it declares the
    metrics)."""
    idle = _idle_text()
    w = Window(60.0, 30.0)
    w.add(Snapshot(0.0, {ROUTER: parse(idle), "10.0.0.2:8000": parse(idle)}))
    w.add(Snapshot(10.0, {ROUTER: parse(_queued(idle, 60, 40)), "10.0.0.2:8000": parse(idle)}))
    obs = w.observe(10.0, CHAT, {})
    assert obs.problems == ()
    assert obs.no_finish_yet
    assert obs.arrival_rate_per_s == 6.0
    assert obs.mean_prompt_tokens == 2000.0
    assert obs.mean_output_tokens is None
    assert obs.router_queue == 40
    assert obs.classes[0].requests == 0
    # Once a request finished (its SLO result and output length counted): a usable window.
    done = _queued(idle, 61, 39).replace(
        "# TYPE splitserve_router_slo_requests_total counter\n",
        "# TYPE splitserve_router_slo_requests_total counter\n"
        'splitserve_router_slo_requests_total{result="met",slo_class="chat"} 1.0\n',
    )
    done = done.replace(
        "# TYPE splitserve_router_output_length_tokens histogram\n",
        "# TYPE splitserve_router_output_length_tokens histogram\n"
        'splitserve_router_output_length_tokens_bucket{le="+Inf",slo_class="chat"} 1.0\n'
        'splitserve_router_output_length_tokens_count{slo_class="chat"} 1.0\n'
        'splitserve_router_output_length_tokens_sum{slo_class="chat"} 100.0\n',
    )
    w.add(Snapshot(20.0, {ROUTER: parse(done), "10.0.0.2:8000": parse(idle)}))
    obs = w.observe(20.0, CHAT, {})
    assert obs.usable, obs.why_unusable()
    assert not obs.no_finish_yet


def test_from_prometheus_an_idle_router_and_a_misconfigured_one_read_alike_and_say_so() -> None:
    """Prometheus keeps no series without a sample: a pod with only its gauges (idle, or
    without the SLO metrics) cannot be told apart, and the reason names both."""
    pod: Samples = {("splitserve_router_inflight_requests", ()): 0.0}
    w = Window(60.0, 30.0)
    w.add(Snapshot(0.0, {"router-0": dict(pod)}))
    w.add(Snapshot(10.0, {"router-0": dict(pod)}))
    (problem,) = w.observe(10.0, CHAT, {}).problems
    assert problem.signal == "router router-0"
    assert "series in Prometheus (no traffic yet, or a router without the SLO metrics)" in str(
        problem
    )


def test_from_prometheus_a_router_with_arrivals_and_no_request_finished_yet_is_no_finish_yet() -> (
    None
):
    """Prometheus keeps no declarations, but a pod with admission series is a router with the
    SLO metrics (`RouterMetrics` exports both families, always together): with arrivals counted
    and no SLO result yet it is the state the loop acts on (`no_finish_yet`), as from a direct
    scrape, not a missing signal that holds it until the first request finishes."""
    idle = _idle_text()
    # What a Prometheus instant query returns: the samples only (`parse` minus `declared`).
    before: Samples = dict(parse(idle))
    after: Samples = dict(parse(_queued(idle, 60, 40)))
    w = Window(60.0, 30.0)
    w.add(Snapshot(0.0, {"router-0": before}))
    w.add(Snapshot(10.0, {"router-0": after}))
    obs = w.observe(10.0, CHAT, {})
    assert obs.problems == ()
    assert obs.no_finish_yet
    assert obs.arrival_rate_per_s == 6.0
    assert obs.router_queue == 40
