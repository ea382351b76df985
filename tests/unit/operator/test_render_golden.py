"""Golden renders of every example, each rendered object valid for a pinned Kubernetes version.

`splitserve operator render -f deploy/examples/X.yaml` must print exactly
`tests/unit/operator/golden/X.yaml`. After an intended change to what the operator renders:

    SPLITSERVE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/operator/test_render_golden.py

and review the diff. Built-in kinds are validated with `kubernetes-validate --strict` against the
Kubernetes version `mk/operator.mk` pins (`K8S_VERSION`); `LLMPool`s against our CRDs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from splitserve.api import v1alpha1 as v1
from splitserve.cli.operator import operator
from splitserve.operator import render, validate

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("llmservice-*.yaml"))
GOLDEN = Path(__file__).parent / "golden"
K8S_VERSION = re.search(
    r"^K8S_VERSION\s*\?=\s*(\S+)", (ROOT / "mk" / "operator.mk").read_text(), re.MULTILINE
)

kubernetes_validate = pytest.importorskip("kubernetes_validate")


def rendered(path: Path) -> str:
    result = CliRunner().invoke(operator, ["render", "-f", str(path), "-n", "ml"])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_matches_golden(example: Path) -> None:
    text = rendered(example)
    golden = GOLDEN / f"{example.stem}.yaml"
    if os.environ.get("SPLITSERVE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert golden.exists(), f"no golden render {golden.name}: run with SPLITSERVE_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{example.name} renders differently from {golden.name}"


def test_every_golden_has_an_example() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.yaml")) == [p.stem for p in EXAMPLES]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_rendered_object_is_valid(example: Path) -> None:
    assert K8S_VERSION is not None
    version = K8S_VERSION.group(1)
    schemas = validate.load_crd_schemas(ROOT / "charts" / "splitserve" / "crds")
    docs = list(yaml.safe_load_all(rendered(example)))
    assert docs
    for obj in docs:
        if obj["apiVersion"].startswith(v1.GROUP):
            assert validate.validate_object(obj, schemas) == []
        else:
            kubernetes_validate.validate(obj, version, strict=True)


def test_validation_fails_on_a_broken_object() -> None:
    """The validator used above does reject what the API server would."""
    assert K8S_VERSION is not None
    docs = list(
        yaml.safe_load_all(rendered(ROOT / "deploy/examples/llmservice-llama-8b-rdma.yaml"))
    )
    dep = next(d for d in docs if d["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION.group(1), strict=True)


def by_kind(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text)}


def test_gpu_examples_request_gpu_rdma_shm_and_cache() -> None:
    out = by_kind(rendered(ROOT / "deploy/examples/llmservice-llama-8b-rdma.yaml"))
    assert ("PersistentVolumeClaim", "llama-8b-model-cache") in out
    assert [k for k in out if k[0] == "Job"]
    pod = out[("Deployment", "llama-8b-h100")]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {
        "model-cache": "/models",
        "dshm": "/dev/shm",
        "internal-tls": "/var/run/splitserve/tls",
        "tmp": "/tmp",
        "home": "/var/lib/splitserve",
    }
    assert pod["initContainers"][0]["name"] == "wait-for-model"

    out = by_kind(rendered(ROOT / "deploy/examples/llmservice-llama-70b-tp4.yaml"))
    pod = out[("Deployment", "llama-70b-h100x4")]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "--tensor-parallel-size=4" in c["args"]
    assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_render_cli_refuses_invalid_services_naming_the_field(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "deploy/examples/llmservice-sim.yaml").read_text())
    doc["spec"]["workerGroups"][0]["nodes"] = 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(operator, ["render", "-f", str(bad)])
    assert result.exit_code != 0
    assert "workerGroups" in result.output
    assert "LeaderWorkerSet" in result.output


def test_render_cli_notes_skipped_documents(tmp_path: Path) -> None:
    f = tmp_path / "mixed.yaml"
    f.write_text(
        (ROOT / "deploy/examples/llmservice-sim.yaml").read_text()
        + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"
    )
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 0
    assert "skipped v1 ConfigMap" in result.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout)]
    assert "ConfigMap" in kinds  # the router's own ConfigMap
    assert all(d["metadata"]["namespace"] == "default" for d in yaml.safe_load_all(result.stdout))


def test_render_cli_is_the_operators_render() -> None:
    doc = yaml.safe_load((ROOT / "deploy/examples/llmservice-mixed.yaml").read_text())
    ref = render.ServiceRef(doc["metadata"]["name"], "ml", render.DRY_RUN_UID)
    spec = v1.LLMServiceSpec.model_validate(doc["spec"])
    expected = render.render(spec, render.Observed(ref))
    assert (
        list(yaml.safe_load_all(rendered(ROOT / "deploy/examples/llmservice-mixed.yaml")))
        == expected
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("apiVersion: splitserve.io/v1alpha1\nkind: LLMService\nspec: {}\n", "metadata.name"),
        ("- a\n- b\n", "not a Kubernetes object"),
        ("a: [\n", "not YAML (line 2): expected the node content, but found '<stream end>'"),
    ],
)
def test_render_cli_refuses_broken_files(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(text)
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1
    assert needle in result.output
    assert len(result.output.strip().splitlines()) == 1  # was yaml's four-line report


def test_render_cli_names_the_file_that_is_not_utf8(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_bytes(b"\xff\xfe a")
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1
    assert result.output.strip().endswith("x.yaml: not UTF-8 text (invalid start byte at byte 0)")


@pytest.mark.parametrize(
    ("meta", "needle"),
    [
        ("{name: Bad_Name!}", "metadata.name 'Bad_Name!'"),  # rendered objects named Bad_Name!-*
        # a Service name and a label value: 'my.svc' and '1abc' were rendered, a 64-character
        # name as a label value (the API server refuses those children part-way, a probe)
        ("{name: my.svc}", "metadata.name 'my.svc': must be at most 63"),
        ("{name: 1abc}", "metadata.name '1abc'"),
        ("{name: " + "a" * 64 + "}", "metadata.name '" + "a" * 64 + "'"),
        ("{name: ok, namespace: Not_A_Namespace}", "namespace 'Not_A_Namespace'"),
    ],
)
def test_render_cli_refuses_a_name_the_api_server_refuses(
    tmp_path: Path, meta: str, needle: str
) -> None:
    doc = yaml.safe_load((ROOT / "deploy/examples/llmservice-sim.yaml").read_text())
    f = tmp_path / "x.yaml"
    doc["metadata"] = yaml.safe_load(meta)
    f.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1, result.output
    assert needle in result.output
    assert "apiVersion" not in result.stdout


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "no LLMService"),
        ("apiVersion: splitserve.io/v1alpha1\nkind: LLMServic\n", "kind LLMServic is not a"),
    ],
)
def test_render_cli_refuses_a_file_without_an_llmservice(
    tmp_path: Path, text: str, needle: str
) -> None:
    # printed nothing and exit 0 (a typo in kind: only a note on stderr)
    f = tmp_path / "x.yaml"
    f.write_text(text)
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1, result.output
    assert needle in result.output
