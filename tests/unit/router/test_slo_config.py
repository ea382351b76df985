"""From the CRD to the running router: the service's SLO classes, default class, placement
profile, disaggregation, predictor and queue size reach `RouterConfig` through the ConfigMap the
operator renders; `engine.batching` is a registered step policy and reaches the workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from prometheus_client import CollectorRegistry

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import RouterFile
from splitserve.cli.router import config_from_file
from splitserve.core.clock import ManualClock
from splitserve.obs.metrics import RouterMetrics
from splitserve.operator import render
from splitserve.policy.batching.builtin import BATCHING
from splitserve.router.slo import SloRuntime

REF = render.ServiceRef(name="llama", namespace="ml", uid="uid-1")


def _spec(**overrides: Any) -> v1.LLMServiceSpec:
    spec: dict[str, Any] = {
        "model": {"name": "llama-8b", "source": "meta/llama"},
        "engine": {"kind": "sim", "image": "img:1"},
        "workerGroups": [{"name": "g", "roles": ["prefill", "decode"]}],
        "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
        "sloClasses": [
            {"name": "chat", "ttftMs": 300, "tpotMs": 40, "priority": 10},
            {"name": "batch", "jobCompletionSeconds": 3600, "sheddable": True},
        ],
        "defaultSloClass": "batch",
        "router": {
            "placementProfile": "aladdin",
            "disaggregation": "Never",
            "lengthPredictor": "history",
            "admissionQueueCapacity": 7,
        },
    }
    spec.update(overrides)
    return v1.LLMServiceSpec.model_validate(spec)


def _router_yaml(spec: v1.LLMServiceSpec) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(yaml.safe_dump(render.router_config(spec, REF)))
    return data


def test_the_crd_reaches_the_router_config(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(_router_yaml(_spec())))
    config = config_from_file(path, {"tokenizer_dir": "/tok"})
    assert config.placement.profile is v1.PlacementProfile.ALADDIN
    assert config.placement.disaggregation is v1.Disaggregation.NEVER
    assert config.slo.length_predictor is v1.LengthPredictor.HISTORY
    assert config.slo.queue_capacity == 7
    assert [c.name for c in config.slo.classes] == ["chat", "batch"]
    assert config.slo.default_class == "batch"
    runtime = SloRuntime(config.slo, ManualClock(), RouterMetrics(CollectorRegistry()))
    assert runtime.table.default.name == "batch"
    chat = runtime.table.resolve("chat")
    assert (chat.ttft_s, chat.tpot_s, chat.priority) == (0.3, 0.04, 10)
    assert runtime.table.resolve("batch").job_completion_s == 3600


def test_the_unfitted_prefill_cap_reaches_the_router_config(tmp_path: Path) -> None:
    """`router.unfittedPrefillsPerWorker` in the LLMService: default 4, a value, and 0 (the
    CRD has no nulls) rendered as the router's null, the open gate before a fitted rate."""
    path = tmp_path / "router.yaml"
    for given, admission, setting in ((None, 4, 4), (9, 9, 9), (0, None, None)):
        spec = _spec()
        if given is not None:
            spec = _spec(router={"unfittedPrefillsPerWorker": given})
        data = _router_yaml(spec)
        assert data["admission"]["unfittedPrefillsPerWorker"] == admission, given
        path.write_text(yaml.safe_dump(data))
        config = config_from_file(path, {"tokenizer_dir": "/tok"})
        assert config.slo.unfitted_prefills_per_worker == setting, given
    with pytest.raises(pydantic.ValidationError, match="unfittedPrefillsPerWorker"):
        _spec(router={"unfittedPrefillsPerWorker": -1})


def test_flags_override_single_placement_fields(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(_router_yaml(_spec())))
    config = config_from_file(
        path, {"tokenizer_dir": "/tok", "placement": {"min_prompt_tokens_for_pd": 64}}
    )
    assert config.placement.min_prompt_tokens_for_pd == 64
    assert config.placement.profile is v1.PlacementProfile.ALADDIN  # the file's, kept


def test_unknown_profile_in_the_file_is_refused() -> None:
    data = _router_yaml(_spec())
    data["placement"]["profile"] = "magic"
    with pytest.raises(pydantic.ValidationError, match="profile"):
        RouterFile.from_configmap(data)


def test_batching_names_are_the_registry() -> None:
    assert sorted(v.value for v in v1.BatchingPolicyName) == BATCHING.names()


def test_engine_batching_reaches_the_workers_and_is_validated() -> None:
    spec = _spec(
        engine={"kind": "sim", "image": "i", "batching": "bros", "batchingParams": '{"x": 1}'}
    )
    workers = [
        m
        for m in render.render(spec, render.Observed(REF))
        if m["kind"] == "Deployment" and m["metadata"]["name"] != "llama-router"
    ]
    args = workers[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--batching=bros" in args
    assert '--batching-params={"x": 1}' in args
    plain = [
        m
        for m in render.render(_spec(), render.Observed(REF))
        if m["kind"] == "Deployment" and m["metadata"]["name"] != "llama-router"
    ]
    assert not any(
        a.startswith("--batching")
        for a in plain[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    with pytest.raises(pydantic.ValidationError, match="batching"):
        _spec(engine={"kind": "sim", "image": "i", "batching": "magic"})
    with pytest.raises(pydantic.ValidationError, match="JSON object"):
        _spec(engine={"kind": "sim", "image": "i", "batchingParams": "[1]"})
