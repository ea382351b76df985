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


@pytest.fixture
def no_tracing() -> Iterator[None]:
    yield
    tracing.shutdown()


@pytest.mark.parametrize(
    ("env", "kinds"),
    [
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, ["OTLPSpanExporter", "ConsoleSpanExporter"]),
        ({"OTEL_TRACES_EXPORTER": " Console , none"}, ["ConsoleSpanExporter"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ["OTLPSpanExporter"]),
    ],
)
def test_exporter_list_is_the_spec_comma_form(
    env: dict[str, str], kinds: list[str], monkeypatch: pytest.MonkeyPatch, no_tracing: None
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing.configure("test")
    processors = tracing._state["provider"]._active_span_processor._span_processors
    assert [type(p.span_exporter).__name__ for p in processors] == kinds


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp,jaeger"}, "OTEL_TRACES_EXPORTER"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            },
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
    ],
)
def test_unusable_otel_settings_are_one_line_errors(
    env: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch, no_tracing: None
) -> None:
    """Without the gRPC exporter installed, `grpc` is refused (it used to be ignored: spans went
    over HTTP to the collector's gRPC port and were lost)."""
    monkeypatch.setattr(tracing, "_grpc_exporter", lambda: None)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(tracing.TracingConfigError) as err:
        tracing.check()
    assert named in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(tracing.TracingConfigError):
        tracing.configure("test")
    assert not tracing.enabled()


@pytest.mark.parametrize(
    "var", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
)
def test_grpc_protocol_uses_the_grpc_exporter_when_installed(
    var: str, monkeypatch: pytest.MonkeyPatch, no_tracing: None
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class GrpcExporter(InMemorySpanExporter):
        pass

    monkeypatch.setattr(tracing, "_grpc_exporter", lambda: GrpcExporter)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")
    monkeypatch.setenv(var, "grpc")
    assert tracing.configure("test")
    processors = tracing._state["provider"]._active_span_processor._span_processors
    assert [type(p.span_exporter) for p in processors] == [GrpcExporter]


@pytest.mark.parametrize(
    "argv",
    [["router", "serve", "--worker", "127.0.0.1:1"], ["worker", "serve"], ["up"]],
)
def test_cli_refuses_a_bad_traces_exporter_in_one_line(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, no_tracing: None
) -> None:
    from click.testing import CliRunner

    from splitserve.cli.main import cli

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # no traceback
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "OTEL_TRACES_EXPORTER" in lines[0]
