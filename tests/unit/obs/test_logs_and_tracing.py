"""JSON logs, the per-request line, and tracing's off-by-default switch and span tree."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from splitserve.obs import logs, tracing


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_traces_are_off_unless_otel_env_asks(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_off_means_no_op_objects() -> None:
    assert not tracing.enabled()
    assert tracing.RequestTrace.start("r1", "default") is tracing.NOOP_TRACE
    assert tracing.NOOP_TRACE.begin("prefill") is None
    assert tracing.NOOP_TRACE.trace_id == ""
    assert tracing.inject() == []
    assert tracing.current_trace_id() == ""
    assert tracing.placement_attributes(object()) == {}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    assert tracing.configure("test", exporter=exp)
    yield exp
    tracing.shutdown()
    assert not tracing.enabled()


def test_request_trace_tree_and_propagation(exporter: InMemorySpanExporter) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    token = tracing.client_carrier.set({"traceparent": f"00-{trace_id}-{parent}-01"})
    try:
        t = tracing.RequestTrace.start("r1", "chat")
    finally:
        tracing.client_carrier.reset(token)
    md = t.begin("prefill", {"splitserve.worker": "p0"})
    assert md is not None
    value = next(v for k, v in md if k == "traceparent")
    assert value.startswith(f"00-{trace_id}-")
    t.event("fallback", {"splitserve.reason": "prefill_retry"})
    t.end("prefill")
    t.finish({"splitserve.outcome": "ok"})
    assert t.trace_id == trace_id
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root, child = spans["router.request"], spans["router.prefill"]
    assert root.parent is not None
    assert format(root.parent.span_id, "016x") == parent
    assert child.parent is not None
    assert child.parent.span_id == root.context.span_id
    assert value.split("-")[2] == format(child.context.span_id, "016x")
    assert root.attributes is not None
    assert root.attributes["splitserve.slo_class"] == "chat"
    assert [e.name for e in root.events] == ["fallback"]


def test_json_formatter_and_access_line(caplog: pytest.LogCaptureFixture) -> None:
    token = logs.client_request_id.set("abc")
    try:
        with caplog.at_level(logging.INFO, logger="splitserve.access"):
            logs.request_finished(
                "cmpl-1", outcome="ok", path="aggregated", slo_class="batch",
                prompt_tokens=5, output_tokens=7, ttft_s=0.25, e2e_s=1.0, trace_id="ab" * 16,
            )  # fmt: skip
    finally:
        logs.client_request_id.reset(token)
    (record,) = caplog.records
    assert "outcome=ok" in record.getMessage()
    line = json.loads(logs.JsonFormatter("router").format(record))
    assert line["component"] == "router"
    assert line["logger"] == "splitserve.access"
    assert line["request_id"] == "cmpl-1"
    assert line["client_request_id"] == "abc"
    assert line["trace_id"] == "ab" * 16
    assert (line["slo_class"], line["path"], line["outcome"]) == ("batch", "aggregated", "ok")
    assert line["ttft_ms"] == 250.0
    assert line["ts"].endswith("Z")
