"""No secret value ever lands in what the operator writes or says.

A Secret holding a recognisable value sits in the namespace; an `LLMService` refers to it for
`HF_TOKEN` (model download and workers) and for an engine variable. After reconciling (and after
an invalid spec that tried a literal token), the value must appear in no object the operator
created or patched (CRs, ConfigMaps, Deployments, Jobs, annotations, status), in no Event, in no
log record, and not in `splitserve operator render` output.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from splitserve.api import v1alpha1 as v1
from splitserve.cli.operator import operator
from splitserve.core.errors import ConfigError
from splitserve.operator import reconcile as rc
from tests.fakes.kube import FakeWorkers, MemoryKube

NS = "ml"
NOW = "2026-01-01T00:00:00Z"
TOKEN = "hf_LEAKCANARY_3f9a1c27"
OTHER = "sk-LEAKCANARY-other-7d2e"
SECRET_TEXTS = (TOKEN, OTHER, base64.b64encode(TOKEN.encode()).decode())


def service_spec() -> dict[str, Any]:
    return {
        "model": {
            "name": "llama",
            "source": "hf://meta-llama/Llama-3.1-8B-Instruct@main",
            "authSecret": {"name": "hf-token", "key": "HF_TOKEN"},
            "cache": {"size": "40Gi"},
        },
        "engine": {
            "kind": "vllm",
            "image": "img:1",
            "env": [
                {
                    "name": "OPENAI_API_KEY",
                    "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "OTHER"}},
                }
            ],
            "envFrom": [{"secretRef": {"name": "hf-token"}}],
        },
        "workerGroups": [{"name": "gpu", "roles": ["prefill", "decode"], "gpus": 1}],
        "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
        "kvTransfer": {"transports": ["rdma"], "rdmaResource": "rdma/ib"},
        # The router's API keys: mounted from the Secret, never copied (issue 19).
        "router": {"apiKeySecret": "hf-token"},
    }


def seeded_kube() -> MemoryKube:
    kube = MemoryKube()
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf-token", "namespace": NS},
            "data": {
                "HF_TOKEN": base64.b64encode(TOKEN.encode()).decode(),
                "OTHER": base64.b64encode(OTHER.encode()).decode(),
            },
        }
    )
    return kube


def leaks(text: str) -> list[str]:
    return [s for s in SECRET_TEXTS if s in text]


def everything_but_the_secret(kube: MemoryKube) -> str:
    objs = [o for k, o in kube.objects.items() if k[1] != "Secret"]
    return json.dumps(objs, sort_keys=True)


def test_reconcile_writes_and_logs_no_secret_value(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    kube = seeded_kube()
    kube.create(
        {
            "apiVersion": v1.API_VERSION,
            "kind": "LLMService",
            "metadata": {"name": "llama", "namespace": NS},
            "spec": service_spec(),
        }
    )
    out = rc.reconcile(kube, FakeWorkers(), NS, "llama", rc.Settings(), NOW)
    assert "created Job" in " ".join(out.actions)
    assert "created PersistentVolumeClaim llama-model-cache" in out.actions
    written = everything_but_the_secret(kube)
    # the references are there, the values are not
    assert '"secretKeyRef": {"key": "HF_TOKEN", "name": "hf-token"}' in written
    assert leaks(written) == []
    assert leaks(caplog.text) == []
    assert leaks(json.dumps(out.actions)) == []
    assert out.status is not None
    assert out.status.model_artifact is not None
    assert out.status.model_artifact.phase is v1.ArtifactPhase.PENDING


def test_a_literal_token_is_refused_without_echoing_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    kube = seeded_kube()
    spec = service_spec()
    spec["engine"]["env"] = [{"name": "HF_TOKEN", "value": TOKEN}]
    kube.create(
        {
            "apiVersion": v1.API_VERSION,
            "kind": "LLMService",
            "metadata": {"name": "llama", "namespace": NS},
            "spec": spec,
        }
    )
    with pytest.raises(ConfigError) as err:
        rc.reconcile(kube, FakeWorkers(), NS, "llama", rc.Settings(), NOW)
    assert "valueFrom.secretKeyRef" in str(err.value)
    assert leaks(str(err.value)) == []
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "llama")
    assert svc is not None
    assert leaks(json.dumps(svc.get("status", {}))) == []
    events = [o for k, o in kube.objects.items() if k[1] == "Event"]
    assert leaks(json.dumps(events)) == []
    assert leaks(caplog.text) == []


def test_dry_run_render_holds_references_only(tmp_path: Path) -> None:
    f = tmp_path / "svc.yaml"
    doc = {
        "apiVersion": v1.API_VERSION,
        "kind": "LLMService",
        "metadata": {"name": "llama"},
        "spec": service_spec(),
    }
    f.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 0, result.output
    assert "secretKeyRef" in result.stdout
    assert leaks(result.output) == []
