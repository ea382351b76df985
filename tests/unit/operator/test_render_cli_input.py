"""`splitserve operator render` on documents whose shape is wrong: a one-line error and exit 1
(docs/install.md), never a Python traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.operator import operator


@pytest.mark.parametrize("metadata", ["5", "[1]", "just-a-name"])
def test_metadata_that_is_not_a_mapping_is_refused(tmp_path: Path, metadata: str) -> None:
    f = tmp_path / "svc.yaml"
    f.write_text(f"apiVersion: splitserve.io/v1alpha1\nkind: LLMService\nmetadata: {metadata}\n")
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "document 0: metadata must be a mapping" in result.output


SERVICE = """apiVersion: splitserve.io/v1alpha1
kind: LLMService
metadata: {name: t}
spec:
  model: {name: m, source: org/m}
  engine: {kind: sim, image: x:1}
  workerGroups: [{name: w, roles: [decode]}]
  pools: {decode: {replicas: 1}}
"""


@pytest.mark.parametrize(
    ("edit", "field", "kind"),
    [
        ("pools: {decode: {replicas: '3'}}", "spec.pools.decode.replicas", "integer"),
        ("pools: {decode: {replicas: true}}", "spec.pools.decode.replicas", "integer"),
        ("networkPolicy: {enabled: 'false'}", "spec.networkPolicy.enabled", "boolean"),
        (
            "workerGroups: [{name: w, roles: [decode], gpus: '1'}]",
            "spec.workerGroups[0].gpus",
            "integer",
        ),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_as_the_api_server_does(
    tmp_path: Path, edit: str, field: str, kind: str
) -> None:
    """Found by the operator probe: render coerced what `kubectl apply` refuses (the CRD's
    schema types): `replicas: '3'` rendered 3 replicas, `enabled: 'false'` no NetworkPolicy,
    so a reviewed dry run showed objects the cluster would never get."""
    key = edit.split(":")[0]
    text = "\n".join(ln for ln in SERVICE.splitlines() if not ln.startswith(f"  {key}:"))
    f = tmp_path / "svc.yaml"
    f.write_text(f"{text}\n  {edit}\n")
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1, result.output
    assert f"{field}: must be of type {kind}" in result.output
    assert "'3'" not in result.output  # no values echoed
    assert "True" not in result.output


def test_a_rule_over_the_whole_spec_names_its_field_not_spec_dot_colon(tmp_path: Path) -> None:
    """Was `spec.: planner.mode Apply needs ...` (an empty location printed after `spec.`)."""
    f = tmp_path / "svc.yaml"
    f.write_text(SERVICE + "  scaling: {mode: Managed}\n  planner: {mode: Apply}\n")
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1, result.output
    assert "  spec: planner.mode Apply needs scaling.mode Manual" in result.output
    assert "spec.:" not in result.output
    f.write_text(SERVICE.replace("spec:\n", "spec: [1]\nx:\n", 1).split("x:\n")[0])
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1, result.output
    assert "spec.:" not in result.output
    assert "spec: must be of type object" in result.output


def test_an_unquoted_off_says_yaml_read_it_as_false(tmp_path: Path) -> None:
    """`planner: {mode: Off}` as written in the docs' table: YAML 1.1 (PyYAML, kubectl) reads
    an unquoted Off as false, and the error named only the type."""
    f = tmp_path / "svc.yaml"
    f.write_text(SERVICE + "  planner: {mode: Off}\n")
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1, result.output
    assert "spec.planner.mode: must be of type string" in result.output
    assert "YAML reads an unquoted Off as false: write 'Off'" in result.output


@pytest.mark.parametrize("image", ["", " ", "reg/router 1"])
def test_a_router_image_option_with_whitespace_is_refused(tmp_path: Path, image: str) -> None:
    """Was rendered as the router container's image (`image: ' '`), which the API server or
    the kubelet refuses; `operator run --router-image` takes the same check."""
    f = tmp_path / "svc.yaml"
    f.write_text(SERVICE)
    result = CliRunner().invoke(operator, ["render", "-f", str(f), "--router-image", image])
    assert result.exit_code == 2, result.output
    assert "--router-image" in result.output
    result = CliRunner().invoke(operator, ["run", "-n", "ml", "--router-image", image])
    assert result.exit_code == 2, result.output
    assert "--router-image" in result.output


@pytest.mark.parametrize(
    ("head", "says"),
    [
        (
            "apiVersion: splitserve.io/v1beta1\nkind: LLMService\n",
            "an LLMService of apiVersion splitserve.io/v1beta1: this version serves "
            "splitserve.io/v1alpha1",
        ),
        (
            "apiVersion: splitserve.io/v1alpha1\nkind: LLMservice\n",
            "kind LLMservice is not a splitserve.io kind (LLMService, LLMPool)",
        ),
    ],
    ids=["version", "kind-typo"],
)
def test_a_near_miss_of_an_llmservice_is_refused_naming_what_is_wrong(
    tmp_path: Path, head: str, says: str
) -> None:
    """Was "skipped splitserve.io/v1beta1 LLMService (not an LLMService)": an LLMService called
    not an LLMService, and a typo'd kind under the group skipped like any other document (the
    API server refuses both: no such version, no such kind)."""
    f = tmp_path / "svc.yaml"
    f.write_text(SERVICE.replace("apiVersion: splitserve.io/v1alpha1\nkind: LLMService\n", head))
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1, result.output
    assert says in result.output
    assert "(not an LLMService)" not in result.output


def test_the_same_llmservice_twice_is_refused_naming_both_documents(tmp_path: Path) -> None:
    """Was rendered twice (every object printed twice, the second set silently the one a
    `kubectl apply` of the file would leave)."""
    f = tmp_path / "svc.yaml"
    f.write_text(SERVICE + "---\n" + SERVICE.replace("replicas: 1", "replicas: 2"))
    result = CliRunner().invoke(operator, ["render", "-f", str(f), "-n", "ml"])
    assert result.exit_code == 1, result.output
    assert "document 1: LLMService ml/t is also document 0" in result.output
    other = SERVICE.replace("metadata: {name: t}", "metadata: {name: t, namespace: other}")
    f.write_text(SERVICE + "---\n" + other)
    result = CliRunner().invoke(operator, ["render", "-f", str(f), "-n", "ml"])
    assert result.exit_code == 0, result.output
