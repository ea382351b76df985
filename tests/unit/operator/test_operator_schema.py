"""Schema rules a user meets on `kubectl apply`: one message per mistake, with the values, naming
the field, and no library boilerplate (checked offline: JSON schema, pydantic, and CEL where
`cel-python` is installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from splitserve.api import crds
from splitserve.api import v1alpha1 as v1
from splitserve.core.errors import ConfigError
from splitserve.operator import reconcile as rc
from splitserve.operator import validate

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "charts/splitserve/crds"


def service(**spec: Any) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "deploy/examples/llmservice-sim.yaml").read_text())
    obj["spec"].update(spec)
    return dict(obj)


def errors(obj: dict[str, Any]) -> list[str]:
    return validate.validate_object(obj, validate.load_crd_schemas(CRDS))


@pytest.mark.parametrize(
    ("pools", "expected"),
    [
        (
            {"decode": {"replicas": 1, "minReplicas": 3, "maxReplicas": 2}},
            "spec.pools.decode: minReplicas (3) must be <= maxReplicas (2)",
        ),
        (
            {"decode": {"minReplicas": 2}},
            "spec.pools.decode: replicas (1) must be >= minReplicas (2)",
        ),
        (
            {"decode": {"replicas": 5, "maxReplicas": 4}},
            "spec.pools.decode: replicas (5) must be <= maxReplicas (4)",
        ),
    ],
    ids=["min-over-max", "below-min", "above-max"],
)
def test_bounds_one_message_with_values(pools: dict[str, Any], expected: str) -> None:
    found = errors(service(pools=pools))
    assert len(found) == 1, found
    assert found[0].endswith(expected), found


def test_negative_replicas_is_one_message() -> None:
    found = errors(service(pools={"decode": {"replicas": -1}}))
    assert len(found) == 1, found
    assert "spec.pools.decode.replicas" in found[0]


def test_pools_need_one_pool() -> None:
    found = errors(service(pools={}))
    assert len(found) == 1, found
    assert ": spec.pools:" in found[0]


def test_llmpool_bounds() -> None:
    pool: dict[str, Any] = {
        "apiVersion": v1.API_VERSION,
        "kind": "LLMPool",
        "metadata": {"name": "p"},
        "spec": {"service": "s", "role": "decode", "minReplicas": 5, "maxReplicas": 3},
    }
    assert errors(pool) == ["LLMPool/p: spec: minReplicas (5) must be <= maxReplicas (3)"]
    pool["spec"].update(minReplicas=1, replicas=9)  # kubectl scale past maxReplicas is allowed
    assert errors(pool) == []


@pytest.mark.parametrize("value", ["lots", "1.5.5", "16GB", ""])
def test_bad_quantities_are_refused(value: str) -> None:
    groups = [{"name": "w", "roles": ["decode"], "resources": {"requests": {"cpu": value}}}]
    found = errors(service(workerGroups=groups, pools={"decode": {"replicas": 1}}))
    assert len(found) == 1, found
    assert "spec.workerGroups[0].resources.requests.cpu" in found[0]


@pytest.mark.parametrize("value", [2, "500m", "1.5", "16Gi", "1e3", "0.5"])
def test_good_quantities_pass(value: int | str) -> None:
    groups = [{"name": "w", "roles": ["decode"], "resources": {"limits": {"memory": value}}}]
    assert errors(service(workerGroups=groups, pools={"decode": {"replicas": 1}})) == []
    v1.ResourceRequirements.model_validate({"limits": {"memory": value}})


def test_model_messages_have_no_library_urls() -> None:
    bad = service(pools={"decode": {"replicas": 2, "maxReplicas": 1}})
    with pytest.raises(ConfigError) as info:
        rc.parse_spec(bad)
    message = str(info.value)
    assert "pydantic" not in message
    assert "http" not in message
    assert "spec.pools.decode: replicas (2) must be <= maxReplicas (1)" in message
    with pytest.raises(ValidationError):
        v1.ResourceRequirements.model_validate({"requests": {"cpu": "lots"}})
    groups = [{"name": "w", "roles": ["decode"], "resources": {"requests": {"cpu": "lots"}}}]
    with pytest.raises(ConfigError) as info:
        rc.parse_spec(service(workerGroups=groups, pools={"decode": {}}))
    # One message for one mistake (not one per branch of int | str).
    assert str(info.value).count("spec.") == 1, str(info.value)
    assert "'lots' is not a quantity" in str(info.value)


def test_cel_messages_carry_the_values() -> None:
    celpy = pytest.importorskip("celpy")
    pools = crds.openapi_schema(crds.LLM_SERVICE)["properties"]["spec"]["properties"]["pools"]
    rules = pools["properties"]["decode"]["x-kubernetes-validations"]
    env = celpy.Environment()
    target = celpy.json_to_cel({"replicas": 1, "minReplicas": 3, "maxReplicas": 2})
    failed = []
    for rule in rules:
        ok = env.program(env.compile(rule["rule"])).evaluate({"self": target})
        if not ok:
            message = env.program(env.compile(rule["messageExpression"]))
            failed.append(str(message.evaluate({"self": target})))
    assert failed == ["minReplicas (3) must be <= maxReplicas (2)"]
    negative = celpy.json_to_cel({"replicas": -1, "minReplicas": 0})
    assert all(
        env.program(env.compile(r["rule"])).evaluate({"self": negative}) for r in rules
    )  # the schema's `minimum` reports it, once
