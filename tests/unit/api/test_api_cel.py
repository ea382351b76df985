"""The CRD's CEL rules agree with the pydantic validators (runs where `cel-python` is installed).

The API server enforces the CEL rules; the operator and `splitserve.operator.validate` enforce the
pydantic validators. Hypothesis generates specs around the cross-field rules and both sides must
accept or reject each one alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from splitserve.api import crds
from splitserve.api import v1alpha1 as v1

celpy = pytest.importorskip("celpy")

JsonNode = dict[str, Any]


def rules(node: JsonNode, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule["rule"]
    for name, sub in node.get("properties", {}).items():
        yield from rules(sub, (*path, name))
    if "items" in node:
        yield from rules(node["items"], (*path, "[]"))


SPEC_SCHEMA = crds.openapi_schema(crds.LLM_SERVICE)["properties"]["spec"]
ENV = celpy.Environment()
PROGRAMS = [(path, ENV.program(ENV.compile(rule))) for path, rule in rules(SPEC_SCHEMA)]


def targets(obj: Any, path: tuple[str, ...]) -> Iterator[Any]:
    if not path:
        yield obj
        return
    head, rest = path[0], path[1:]
    if head == "[]":
        for item in obj if isinstance(obj, list) else []:
            yield from targets(item, rest)
    elif isinstance(obj, dict) and head in obj:
        yield from targets(obj[head], rest)


def cel_accepts(spec: JsonNode) -> bool:
    for path, program in PROGRAMS:
        for target in targets(spec, path):
            if not bool(program.evaluate({"self": celpy.json_to_cel(target)})):
                return False
    return True


def decode_spec(**fields: Any) -> dict[str, Any]:
    """The smallest valid spec (one decode pool), with `fields` added or replaced."""
    spec: dict[str, Any] = {
        "model": {"name": "m", "source": "s"},
        "engine": {"image": "i"},
        "workerGroups": [{"name": "w", "roles": ["decode"]}],
        "pools": {"decode": {"replicas": 1, "minReplicas": 0}},
    }
    return {**spec, **fields}


def pydantic_accepts(spec: JsonNode) -> bool:
    try:
        v1.LLMServiceSpec.model_validate(spec)
    except ValidationError:
        return False
    return True


roles = st.lists(
    st.sampled_from(["prefill", "decode", "mixed"]), min_size=1, max_size=3, unique=True
)
pool = st.builds(
    lambda r, lo, hi: {
        "replicas": r,
        "minReplicas": lo,
        **({"maxReplicas": hi} if hi is not None else {}),
    },
    st.integers(0, 4),
    st.integers(0, 4),
    st.one_of(st.none(), st.integers(0, 4)),
)
slo = st.builds(
    lambda name, ttft, tpot, job: {
        "name": name,
        **({"ttftMs": ttft} if ttft else {}),
        **({"tpotMs": tpot} if tpot else {}),
        **({"jobCompletionSeconds": job} if job else {}),
        "percentile": 0.9,
        "attainment": 0.9,
    },
    st.sampled_from(["a", "b"]),
    st.one_of(st.none(), st.just(100.0)),
    st.one_of(st.none(), st.just(10.0)),
    st.one_of(st.none(), st.just(60.0)),
)


@st.composite
def specs(draw: st.DrawFn) -> JsonNode:
    groups = [
        {"name": name, "roles": draw(roles)}
        for name in draw(
            st.lists(st.sampled_from(["w", "x", "router"]), min_size=1, max_size=2, unique=True)
        )
    ]
    pools = {
        r: draw(pool)
        for r in draw(
            st.lists(st.sampled_from(["prefill", "decode", "mixed"]), min_size=1, unique=True)
        )
    }
    engine: JsonNode = {"image": "i"}
    kind = draw(st.one_of(st.none(), st.sampled_from(["vllm", "sim"])))
    if kind is not None:
        engine["kind"] = kind
    if draw(st.booleans()):
        engine["args"] = draw(st.lists(st.just("--x"), max_size=1))
    for g in groups:
        if draw(st.booleans()):
            g["engineArgs"] = draw(st.lists(st.just("--y"), max_size=1))
    spec: JsonNode = {
        "model": {"name": "m", "source": "s"},
        "engine": engine,
        "workerGroups": groups,
        "pools": pools,
    }
    classes = draw(st.lists(slo, max_size=2, unique_by=lambda c: c["name"]))
    if classes:
        spec["sloClasses"] = classes
    default = draw(st.one_of(st.none(), st.sampled_from(["a", "b", "default"])))
    if default is not None:
        spec["defaultSloClass"] = default
    planner = draw(st.one_of(st.none(), st.sampled_from(["Off", "Advise", "Apply"])))
    if planner is not None:
        spec["planner"] = {"mode": planner}
    scaling = draw(st.one_of(st.none(), st.sampled_from(["Managed", "External", "Manual"])))
    if scaling is not None:
        spec["scaling"] = {"mode": scaling}
    return spec


@settings(max_examples=300, deadline=None)
@given(specs())
def test_cel_rules_match_pydantic(spec: JsonNode) -> None:
    assert cel_accepts(spec) == pydantic_accepts(spec), spec


def test_sim_engine_args_refused_by_both() -> None:
    base: JsonNode = {
        "model": {"name": "m", "source": "s"},
        "workerGroups": [{"name": "w", "roles": ["mixed"]}],
        "pools": {"mixed": {"replicas": 1, "minReplicas": 0}},
    }
    for engine, group in (({"args": ["--x"]}, {}), ({}, {"engineArgs": ["--y"]})):
        spec = {
            **base,
            "engine": {"image": "i", "kind": "sim", **engine},
            "workerGroups": [{"name": "w", "roles": ["mixed"], **group}],
        }
        assert not cel_accepts(spec), spec
        assert not pydantic_accepts(spec), spec
        vllm = {**spec, "engine": {**spec["engine"], "kind": "vllm"}}
        assert cel_accepts(vllm), vllm
        assert pydantic_accepts(vllm), vllm


def test_prometheus_url_is_refused_where_it_would_be_ignored() -> None:
    """`scaling.prometheusUrl` is read only with `metricsSource: Prometheus`; with the router
    source it would be ignored silently, so both sides refuse it, naming the field."""
    base: JsonNode = {
        "model": {"name": "m", "source": "s"},
        "engine": {"image": "i"},
        "workerGroups": [{"name": "w", "roles": ["mixed"]}],
        "pools": {"mixed": {"replicas": 1, "minReplicas": 0}},
    }
    url = "http://prom:9090"
    for scaling in ({"prometheusUrl": url}, {"metricsSource": "Router", "prometheusUrl": url}):
        spec = {**base, "scaling": scaling}
        assert not cel_accepts(spec), spec
        with pytest.raises(ValidationError, match=r"scaling: prometheusUrl is read only"):
            v1.LLMServiceSpec.model_validate(spec)
    spec = {**base, "scaling": {"metricsSource": "Prometheus", "prometheusUrl": url}}
    assert cel_accepts(spec), spec
    assert pydantic_accepts(spec), spec


ROOT_RULES = [
    ENV.program(ENV.compile(r["rule"]))
    for r in crds.openapi_schema(crds.LLM_SERVICE).get("x-kubernetes-validations", [])
]


@pytest.mark.parametrize(
    ("name", "ok"),
    [("tiny", True), ("llama-3-8b", True), ("a" * 63, True), ("a" * 64, False),
     ("my.svc", False), ("1abc", False), ("a-", False), ("Big", False)],
)  # fmt: skip
def test_the_crds_name_rule_agrees_with_the_operator(name: str, ok: bool) -> None:
    """The API server (the CRD's root rule) and `operator render` refuse the same names."""
    assert ROOT_RULES, "the LLMService CRD has a rule on metadata.name"
    obj = celpy.json_to_cel({"metadata": {"name": name}})
    assert all(bool(p.evaluate({"self": obj})) for p in ROOT_RULES) is ok
    assert (v1.service_name_problem(name) is None) is ok


@pytest.mark.parametrize(
    ("classes", "default", "ok"),
    [(None, "default", True), (None, "a", False), ([], "default", True),
     ([{"name": "a", "ttftMs": 100, "tpotMs": 10, "percentile": 0.9, "attainment": 0.9}],
      "default", False)],
)  # fmt: skip
def test_default_class_without_classes_is_the_implicit_default(
    classes: list[JsonNode] | None, default: str, ok: bool
) -> None:
    """A service without classes has one, `default` (the field's doc, the router): naming it
    was refused by both (a new-user probe)."""
    spec = decode_spec(defaultSloClass=default)
    if classes is not None:
        spec["sloClasses"] = classes
    assert cel_accepts(spec) is ok
    assert pydantic_accepts(spec) is ok


def test_allow_overrides_on_an_offline_class_is_refused_by_both() -> None:
    """`allowOverrides: true` on a class with only `jobCompletionSeconds` did nothing: every
    override header was then a 400 ("has no such target"). Both sides refuse it, naming it."""
    offline = {"name": "batch", "jobCompletionSeconds": 600, "allowOverrides": True}
    spec = decode_spec(sloClasses=[offline])
    assert cel_accepts(spec) is False
    assert pydantic_accepts(spec) is False
    with pytest.raises(ValidationError, match="allowOverrides needs ttftMs or tpotMs"):
        v1.LLMServiceSpec.model_validate(spec)
    for ok in (
        {**offline, "allowOverrides": False},
        {**offline, "ttftMs": 500},
        {"name": "chat", "ttftMs": 500, "tpotMs": 50, "allowOverrides": True},
    ):
        assert cel_accepts(decode_spec(sloClasses=[ok])) is True
        assert pydantic_accepts(decode_spec(sloClasses=[ok])) is True


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"engine": {"image": "i", "grpcPort": 9090}}, "engine.grpcPort and engine.metricsPort"),
        (
            {"engine": {"image": "i", "grpcPort": 7000, "metricsPort": 7000}},
            "engine.grpcPort and engine.metricsPort",
        ),
        ({"router": {"grpcPort": 8000}}, "router.httpPort and router.grpcPort"),
        ({"router": {"httpPort": 9000, "grpcPort": 9000}}, "router.httpPort and router.grpcPort"),
    ],
)
def test_two_ports_of_one_container_that_are_the_same_are_refused_by_both(
    fields: JsonNode, says: str
) -> None:
    """Found by the operator probe: `engine.grpcPort: 9090` (the metrics port's default) and
    `router.grpcPort: 8000` were accepted; the worker or router then cannot bind its second
    port (a crash loop) and the router's Service has one port twice (the API server refuses
    it)."""
    spec = decode_spec(**fields)
    assert not cel_accepts(spec), spec
    with pytest.raises(ValidationError, match=says):
        v1.LLMServiceSpec.model_validate(spec)
    fine = decode_spec(engine={"image": "i", "grpcPort": 9091}, router={"grpcPort": 8001})
    assert cel_accepts(fine)
    assert pydantic_accepts(fine)


@pytest.mark.parametrize(
    "url", ["prometheus:9090", "prometheus.monitoring.svc:9090", "http://prom:9090/api/v1/query"]
)
def test_a_prometheus_url_the_loop_cannot_query_is_refused_by_both(url: str) -> None:
    """Found by the operator probe: a prometheusUrl without http:// (which urllib cannot open)
    or with the query path already in it (the loop appends /api/v1/query) was accepted; the
    control loop then held every tick on a failed query."""
    spec = decode_spec(scaling={"metricsSource": "Prometheus", "prometheusUrl": url})
    with pytest.raises(ValidationError, match="prometheusUrl"):
        v1.LLMServiceSpec.model_validate(spec)
    schema = crds.structural_schema(v1.LLMServiceSpec)["properties"]["scaling"]
    url_schema = schema["properties"]["prometheusUrl"]
    import re

    shape_ok = re.search(url_schema["pattern"], url) is not None
    assert not (shape_ok and cel_accepts(spec)), spec
    for good in ("http://prometheus.monitoring:9090", "https://thanos.example.com/prometheus/"):
        spec = decode_spec(scaling={"metricsSource": "Prometheus", "prometheusUrl": good})
        assert pydantic_accepts(spec), good
        assert cel_accepts(spec), good
        assert re.search(url_schema["pattern"], good)


def test_a_class_named_other_is_refused_by_both() -> None:
    """`other` is the metric label of requests naming an undeclared class: a class named so
    had its requests counted together with those (the live SLO probe, 2026-11-29)."""
    other = {"name": "other", "ttftMs": 500, "tpotMs": 50}
    spec = decode_spec(sloClasses=[other], defaultSloClass="other")
    assert cel_accepts(spec) is False
    assert pydantic_accepts(spec) is False
    with pytest.raises(ValidationError, match="'other' is reserved"):
        v1.LLMServiceSpec.model_validate(spec)
    ok = decode_spec(sloClasses=[{**other, "name": "others"}], defaultSloClass="others")
    assert cel_accepts(ok) is True
    assert pydantic_accepts(ok) is True
