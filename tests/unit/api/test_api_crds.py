"""The generated CRDs obey Kubernetes' structural-schema rules and match what is committed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from splitserve.api import crds
from splitserve.api import v1alpha1 as v1
from splitserve.api.chart import ChartValues
from splitserve.cli import gen_k8s

ROOT = Path(__file__).resolve().parents[3]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key in ("properties",):
            for name, sub in node.get(key, {}).items():
                yield from walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.kind)
def test_schema_is_structural(kind: crds.Kind) -> None:
    schema = crds.openapi_schema(kind)
    for path, node in walk(schema):
        assert "$ref" not in node, path
        # anyOf only as structural schemas allow it: int-or-string's two branches.
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        assert "anyOf" not in node or (
            int_or_string and node["anyOf"] == [{"type": "integer"}, {"type": "string"}]
        ), path
        assert "oneOf" not in node, path
        assert "title" not in node, path
        assert not node.get("uniqueItems"), path
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed or node.get("x-kubernetes-preserve-unknown-fields"), f"untyped: {path}"
        assert not ("properties" in node and "additionalProperties" in node), path
        if "default" in node:
            assert node["default"] is not None, path
        if node.get("type") == "array" and node.get("x-kubernetes-list-type") == "map":
            assert "name" in node["items"]["required"], path
    assert "x-kubernetes-preserve-unknown-fields" not in str(schema)


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.kind)
def test_every_spec_field_is_described(kind: crds.Kind) -> None:
    schema = crds.openapi_schema(kind)
    bare = [p for p, n in walk(schema["properties"]["spec"]) if p and "description" not in n]
    bare = [p for p in bare if not p.endswith(("[]", "{}"))]
    assert bare == []


def test_llmpool_has_scale_subresource() -> None:
    version = crds.crd(crds.LLM_POOL)["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    service = crds.crd(crds.LLM_SERVICE)["spec"]["versions"][0]
    assert "scale" not in service["subresources"]
    names = [c["name"] for c in service["additionalPrinterColumns"]]
    assert names[:6] == ["Model", "Prefill", "Decode", "Mixed", "SLO", "Ready"]


def test_optional_pools_are_not_defaulted_but_settings_are() -> None:
    spec = crds.openapi_schema(crds.LLM_SERVICE)["properties"]["spec"]
    assert "default" not in spec["properties"]["pools"]["properties"]["decode"]
    assert spec["properties"]["scaling"]["default"] == {}
    assert spec["properties"]["scaling"]["properties"]["mode"]["default"] == "Managed"
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("pools.decode" in r for r in rules)


def test_quantities_are_int_or_string() -> None:
    spec = crds.openapi_schema(crds.LLM_SERVICE)["properties"]["spec"]
    requests = spec["properties"]["workerGroups"]["items"]["properties"]["resources"]
    assert requests["properties"]["requests"]["additionalProperties"] == {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": v1.QUANTITY_PATTERN,
    }


def test_values_schema_rejects_unknown_keys() -> None:
    import json

    schema = json.loads(crds.values_schema(ChartValues))
    assert schema["additionalProperties"] is False
    assert schema["properties"]["operator"]["additionalProperties"] is False
    assert "global" in schema["properties"]


def test_committed_files_are_up_to_date() -> None:
    outputs = {**gen_k8s.crd_outputs(), **gen_k8s.schema_outputs(), **gen_k8s.docs_outputs()}
    assert gen_k8s.drift(ROOT, outputs) == [], "run `splitserve gen crds|schema|docs`"


def test_check_reports_drift(tmp_path: Path) -> None:
    from click.testing import CliRunner

    runner = CliRunner()
    result = runner.invoke(gen_k8s.gen_k8s, ["crds", "--root", str(tmp_path), "--check"])
    assert result.exit_code == 1
    assert "charts/splitserve/crds/llmpools.splitserve.io.yaml" in result.output
    result = runner.invoke(gen_k8s.gen_k8s, ["crds", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(gen_k8s.gen_k8s, ["crds", "--root", str(tmp_path), "--check"])
    assert result.exit_code == 0, result.output


def test_chart_values_match_the_model() -> None:
    import yaml

    values = yaml.safe_load((ROOT / "charts/splitserve/values.yaml").read_text())
    assert ChartValues.model_validate(values) == ChartValues()
