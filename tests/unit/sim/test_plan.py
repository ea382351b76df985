"""`splitserve plan`: search by simulation, print a valid LLMService."""

from __future__ import annotations

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
