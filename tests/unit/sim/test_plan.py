"""`splitserve plan`: search by simulation, print a valid LLMService."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from splitserve.api import v1alpha1 as v1
from splitserve.cli.plan import plan


def test_plan_prints_candidates_and_a_valid_service() -> None:
    result = CliRunner().invoke(plan, ["--rate", "2", "--requests", "120", "--tp", "1"])
    assert result.exit_code == 0, result.output
    assert "| 1 |" in result.output
    doc = result.output[result.output.index("apiVersion:") :]
    body = yaml.safe_load(doc)
    spec = v1.LLMServiceSpec.model_validate(body["spec"])
    pools = dict(spec.pools.items())
    assert all(p.replicas >= 1 for p in pools.values())
    assert "predicted attainment" in result.output


def test_plan_refuses_bad_input_by_name() -> None:
    r = CliRunner().invoke(plan, ["--rate", "2", "--model", "gpt-9"])
    assert r.exit_code != 0
    assert "--model" in r.output
    r = CliRunner().invoke(plan, ["--rate", "2", "--tp", "x"])
    assert r.exit_code != 0
    assert "--tp" in r.output
    r = CliRunner().invoke(plan, [])
    assert r.exit_code != 0
    assert "--rate" in r.output


def test_per_pool_tp_search_tries_every_pair_and_counts_gpus_per_pool() -> None:
    import numpy as np

    from splitserve.core.roles import Role
    from splitserve.sim import plan as planner
    from splitserve.sim.autoscale import SloTarget, with_class
    from splitserve.sim.workload import LogNormal, Poisson, synthetic

    items = with_class(
        synthetic(
            Poisson(2.0), LogNormal(1000, 0.6), LogNormal(200, 0.6), 120, np.random.default_rng(0)
        ),
        "default",
    )
    slo = SloTarget("default", 2.0, 0.1, 0.9, 0.99)
    found = planner.plan(items, "llama-2-13b", "a100-80g", slo, (1, 2), per_pool=True)
    pairs = {(c.tps[Role.PREFILL], c.tps[Role.DECODE]) for c in found}
    assert pairs == {(1, 1), (1, 2), (2, 1), (2, 2)}
    for c in found:
        assert c.gpus == sum(c.tps[r] * n for r, n in c.pools.items())
    met = [c for c in found if c.result is not None]
    assert met
    assert [c.gpus for c in met] == sorted(c.gpus for c in met)  # fewest GPUs first
    shared = planner.plan(items, "llama-2-13b", "a100-80g", slo, (1, 2))
    assert {(c.tps[Role.PREFILL], c.tps[Role.DECODE]) for c in shared} == {(1, 1), (2, 2)}


def test_plan_with_two_tps_has_one_group_per_role() -> None:
    from splitserve.core.roles import Role
    from splitserve.sim import plan as planner
    from splitserve.sim.autoscale import SloTarget

    best = planner.Candidate(
        {Role.PREFILL: 2, Role.DECODE: 1}, {Role.PREFILL: 1, Role.DECODE: 3}, None
    )
    assert best.gpus == 5
    body = yaml.safe_load(
        planner.service_yaml("p", "m", "org/m", SloTarget("default", 2.0, 0.1), best)
    )
    spec = v1.LLMServiceSpec.model_validate(body["spec"])
    groups = {g.name: (tuple(g.roles), g.tensor_parallel) for g in spec.worker_groups}
    assert groups == {"prefill": ((Role.PREFILL,), 2), "decode": ((Role.DECODE,), 1)}


def test_static_gpu_hours_count_each_pool_at_its_tp() -> None:
    from dataclasses import replace

    from splitserve.core.roles import Role
    from splitserve.sim.autoscale import Setup, run_static
    from splitserve.sim.workload import WorkItem

    items = (WorkItem(0.0, 100, 10), WorkItem(3600.0, 100, 10))
    setup = replace(Setup(), tp_by_role={Role.PREFILL: 1, Role.DECODE: 2})
    r = run_static(items, setup, {Role.PREFILL: 1, Role.DECODE: 1})
    # One TP-1 prefill worker and one TP-2 decode worker for just over an hour: 3 GPU-hours.
    assert 3.0 <= r.gpu_hours < 3.01


def test_cli_per_pool_tp_prints_both_degrees() -> None:
    result = CliRunner().invoke(
        plan, ["--rate", "2", "--requests", "80", "--tp", "1,2", "--per-pool-tp"]
    )
    assert result.exit_code == 0, result.output
    assert "| 1 / 2 |" in result.output
    assert "searched: TP per pool" in result.output
    doc = result.output[result.output.index("apiVersion:") :]
    v1.LLMServiceSpec.model_validate(yaml.safe_load(doc)["spec"])


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--rate", "0"),
        ("--rate", "-1"),
        ("--requests", "0"),
        ("--requests", "-5"),
        ("--ttft-ms", "0"),
        ("--tpot-ms", "-1"),
        ("--sigma", "-1"),
        ("--prompt-median", "0"),
        ("--output-median", "-3"),
    ],
)
def test_plan_refuses_out_of_range_numbers_naming_the_flag(flag: str, value: str) -> None:
    """Each of these ran into a ValueError traceback from the workload or SLO constructors."""
    args = ["--requests", "10", "--tp", "1"] if flag != "--requests" else ["--tp", "1"]
    r = CliRunner().invoke(plan, ["--rate", "2", *args, flag, value])
    assert r.exit_code == 2, r.output
    assert isinstance(r.exception, SystemExit)
    assert flag in r.output


def test_plan_says_when_the_printed_source_is_only_the_preset_name() -> None:
    base = ["--rate", "2", "--requests", "60", "--tp", "1"]
    r = CliRunner().invoke(plan, base)
    assert r.exit_code == 0, r.output
    assert "give --source" in r.output
    r = CliRunner().invoke(plan, [*base, "--source", "meta-llama/Llama-2-13b-hf"])
    assert r.exit_code == 0, r.output
    assert "give --source" not in r.output
    assert "source: meta-llama/Llama-2-13b-hf" in r.output


def test_a_start_beyond_the_limit_is_cut_to_it() -> None:
    # 2 requests 1 µs apart size the first pools for 2e6 req/s; they were built and simulated
    # (minutes of building workers), later not simulated at all: the candidate was "not met"
    # although a plan within the limit met (`plan --rate 300 --tp 1`: nothing at the hidden 64,
    # P35:D22 with more allowed). The start is now scaled down to the limit.
    from splitserve.core.ids import SloClassName
    from splitserve.sim import plan as planner
    from splitserve.sim.autoscale import SloTarget
    from splitserve.sim.workload import WorkItem

    cls = SloClassName("default")
    items = (WorkItem(0.0, 1000, 200, cls), WorkItem(1e-6, 1000, 200, cls))
    slo = SloTarget("default", 2.0, 0.1, 0.9, 0.99)
    (only,) = planner.plan(items, "llama-2-13b", "a100-80g", slo, (1,), limit=6)
    assert only.result is not None
    assert 2 <= sum(only.pools.values()) <= 6


def test_a_workload_arriving_at_one_instant_is_refused() -> None:
    from splitserve.core.ids import SloClassName
    from splitserve.sim import plan as planner
    from splitserve.sim.autoscale import SloTarget
    from splitserve.sim.workload import WorkItem

    items = (WorkItem(0.0, 1000, 200, SloClassName("default")),)
    with pytest.raises(ValueError, match="at once"):
        planner.plan(items, "llama-2-13b", "a100-80g", SloTarget("default", 2, 0.1, 0.9, 0.99))


def test_the_plan_sizes_for_the_rate_scale_to_rate_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    # plan sized for n / span, scale_to_rate set (n - 1) / span: a 2-request workload 1 s apart
    # was planned at 2 req/s, twice its rate
    from splitserve.core.ids import SloClassName
    from splitserve.policy.planner.autoscaler import work_by_role as real
    from splitserve.sim import plan as planner
    from splitserve.sim.autoscale import SloTarget
    from splitserve.sim.workload import WorkItem, scale_to_rate

    seen: list[float] = []

    def spy(roles: object, rate: float, *args: object) -> object:
        seen.append(rate)
        return real(roles, rate, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(planner, "work_by_role", spy)
    cls = SloClassName("default")
    items = scale_to_rate((WorkItem(0.0, 100, 20, cls), WorkItem(5.0, 100, 20, cls)), 1.0)
    slo = SloTarget("default", 2.0, 0.1, 0.9, 0.99)
    planner.plan(items, "tiny", "a100-80g", slo, (1,), limit=4)
    assert seen
    assert all(r == pytest.approx(1.0) for r in seen)
