"""Worker groups that cannot size the pools are said in status, not left silent (a new-user
probe): a group with a fixed `replicas` below its pools' sizes ran 1 pod for 3 wanted with
`SpecApplied=True "the spec is applied as written"`; a group that serves no pool ran 0 pods
forever without a word. Both are now `SpecApplied=False` with a reason and an Event, and
`operator render` prints them as warnings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from splitserve.api import v1alpha1 as v1
from splitserve.cli.operator import operator
from splitserve.core.roles import Role
from splitserve.operator import render
from tests.fakes.kube import FakeWorkers, MemoryKube
from tests.unit.operator.test_operator_reconcile import NS, make_service, run

ROOT = Path(__file__).resolve().parents[3]
W = {"name": "w", "roles": ["prefill", "decode"]}


def _spec(groups: list[dict[str, Any]]) -> v1.LLMServiceSpec:
    return v1.LLMServiceSpec.model_validate(
        {
            "model": {"name": "m", "source": "org/m"},
            "engine": {"kind": "sim", "image": "img:1"},
            "workerGroups": groups,
            "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
        }
    )


@pytest.mark.parametrize(
    ("groups", "reasons"),
    [
        ([W], []),
        ([{**W, "replicas": 3}], []),  # fixed, and enough
        ([{**W, "replicas": 1}], ["PoolsNotSized"]),
        ([W, {"name": "x", "roles": ["decode"]}], ["GroupServesNoPool"]),
        ([W, {"name": "x", "roles": ["mixed"]}], ["GroupServesNoPool"]),
        ([{"name": "p", "roles": ["prefill"]}, {"name": "d", "roles": ["decode"]}], []),
    ],
    ids=["one-group", "fixed-enough", "fixed-short", "second-decode", "mixed-no-pool", "split"],
)
def test_group_coverage_problems(groups: list[dict[str, Any]], reasons: list[str]) -> None:
    spec = _spec(groups)
    desired = {Role.PREFILL: 1, Role.DECODE: 2}
    assert [r for r, _ in render.group_coverage_problems(spec, desired)] == reasons


def test_status_says_a_fixed_group_cannot_hold_its_pools() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube, workerGroups=[{**W, "replicas": 1}])
    run(kube, workers)
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    applied = {c["type"]: c for c in svc["status"]["conditions"]}["SpecApplied"]
    assert applied["status"] == "False"
    assert applied["reason"] == "PoolsNotSized"
    assert "prefill 1, decode 2" in applied["message"]
    assert "(w (1): 1 pods in all), so 2 can never run" in applied["message"]
    warned = [e for e in kube.list("v1", "Event", NS) if e["reason"] == "PoolsNotSized"]
    assert [e["type"] for e in warned] == ["Warning"]


def test_render_warns_of_a_group_that_serves_no_pool(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "deploy/examples/llmservice-sim.yaml").read_text())
    doc["spec"]["workerGroups"].append({"name": "spare", "roles": ["mixed"]})
    f = tmp_path / "svc.yaml"
    f.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 0, result.output
    assert "warning GroupServesNoPool: workerGroups[1] (spare) serves no pool" in result.stderr
