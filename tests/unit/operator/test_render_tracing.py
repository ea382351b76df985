"""`spec.observability.tracing` reaches the router and every worker as the standard `OTEL_*`
variables that `splitserve.obs.tracing` and the OpenTelemetry SDK read; wrong input is refused
naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from splitserve.obs import tracing
from tests.unit.operator.test_render_pod import env_of, make_spec, router_pod, worker_pod

TRACED = {"tracing": {"endpoint": "http://otel-collector.monitoring:4318", "samplerRatio": 0.25}}


def _containers(spec: Any) -> list[dict[str, Any]]:
    return [worker_pod(spec)["containers"][0], router_pod(spec)["containers"][0]]


def test_tracing_renders_otel_env_into_router_and_workers() -> None:
    spec = make_spec(observability=TRACED)
    for container in _containers(spec):
        env = env_of(container)
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4318"
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
        assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        # What the processes decide from it: traces on.
        assert tracing.wanted({k: str(v) for k, v in env.items() if isinstance(v, str)})


def test_no_tracing_no_otel_env() -> None:
    for container in _containers(make_spec()):
        assert not [n for n in env_of(container) if n.startswith("OTEL_")]
        assert not tracing.wanted({k: str(v) for k, v in env_of(container).items()})


def test_the_sampler_ratio_defaults_to_every_request() -> None:
    spec = make_spec(observability={"tracing": {"endpoint": "https://collector:4318"}})
    assert env_of(router_pod(spec)["containers"][0])["OTEL_TRACES_SAMPLER_ARG"] == "1"


@pytest.mark.parametrize(
    ("observability", "engine_env", "words"),
    [
        ({"tracing": {"endpoint": "collector:4318"}}, [], "endpoint"),
        ({"tracing": {"endpoint": "http://c:4318", "samplerRatio": 1.5}}, [], "samplerRatio"),
        ({"tracing": {"endpoint": "http://c:4318", "sampler": "x"}}, [], "sampler"),
        (TRACED, [{"name": "OTEL_TRACES_SAMPLER", "value": "always_on"}], "OTEL_TRACES_SAMPLER"),
    ],
)
def test_bad_tracing_input_is_refused_naming_it(
    observability: dict[str, Any], engine_env: list[dict[str, str]], words: str
) -> None:
    with pytest.raises(ValidationError) as err:
        make_spec(
            observability=observability,
            engine={"kind": "vllm", "image": "img:1", "env": engine_env},
        )
    assert words in str(err.value)


def test_engine_env_otel_without_tracing_is_kept() -> None:
    spec = make_spec(
        engine={
            "kind": "vllm",
            "image": "img:1",
            "env": [{"name": "OTEL_TRACES_SAMPLER", "value": "always_on"}],
        }
    )
    assert env_of(worker_pod(spec)["containers"][0])["OTEL_TRACES_SAMPLER"] == "always_on"
