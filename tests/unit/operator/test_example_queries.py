"""The autoscaling examples in deploy/examples query series of the objects the example service
renders: each trigger's LLMPool exists, its `pod=~` regexes match pods of a rendered Deployment,
its `model_name` is the served name, and no selector names a Service that is not rendered.

Found by a new-user probe: `keda-vllm-waiting.yaml` selected `pod=~"llama-decode-.*"` and
`model_name="llama"` (the workers are `llama-h100-...`, the served name
`llama-3.1-8b-instruct`), and `keda-router.yaml` `service="llama-router"` (the router Service is
`llama`): both would have matched no series, so the pools never scaled.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from splitserve.operator.render import render_documents

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "deploy/examples"
KEDA = sorted(EXAMPLES.glob("keda-*.yaml"))


def _rendered() -> tuple[set[tuple[str, str]], str]:
    docs = list(yaml.safe_load_all((EXAMPLES / "llmservice-gpu.yaml").read_text()))
    manifests, _ = render_documents(docs, None, "router:dev")
    served = docs[0]["spec"]["model"]["name"]
    return {(m["kind"], m["metadata"]["name"]) for m in manifests}, served


@pytest.mark.parametrize("path", KEDA, ids=[p.name for p in KEDA])
def test_keda_example_selects_rendered_objects(path: Path) -> None:
    objects, served = _rendered()
    scaled = yaml.safe_load(path.read_text())
    target = scaled["spec"]["scaleTargetRef"]
    assert ("LLMPool", target["name"]) in objects
    deployments = [name for kind, name in objects if kind == "Deployment"]
    for trigger in scaled["spec"]["triggers"]:
        query = trigger["metadata"]["query"]
        for regex in re.findall(r'pod=~"([^"]+)"', query):
            pods = [f"{d}-5d9c8b7f6-x2x4q" for d in deployments]  # a ReplicaSet pod's name
            assert any(re.fullmatch(regex, p) for p in pods), (regex, deployments)
        for model in re.findall(r'model_name="([^"]+)"', query):
            assert model == served
        for service in re.findall(r'service="([^"]+)"', query):
            assert ("Service", service) in objects


@pytest.mark.parametrize(
    "path", [EXAMPLES / "hpa-decode.yaml", *KEDA], ids=["hpa-decode.yaml", *[p.name for p in KEDA]]
)
def test_autoscaler_example_bounds_are_the_pools_bounds(path: Path) -> None:
    """Found by the operator probe: keda-router.yaml let KEDA take llama-decode down to 1
    worker while the service it drives (llmservice-gpu.yaml) says `decode.minReplicas: 2`:
    in External mode the HPA's bounds are the ones applied, so the example's floor was not the
    service's."""
    docs = list(yaml.safe_load_all((EXAMPLES / "llmservice-gpu.yaml").read_text()))
    pools = docs[0]["spec"]["pools"]
    scaler = yaml.safe_load(path.read_text())
    role = scaler["spec"]["scaleTargetRef"]["name"].removeprefix(docs[0]["metadata"]["name"] + "-")
    spec = scaler["spec"]
    low = spec.get("minReplicas", spec.get("minReplicaCount"))
    high = spec.get("maxReplicas", spec.get("maxReplicaCount"))
    assert (low, high) == (pools[role]["minReplicas"], pools[role]["maxReplicas"])
