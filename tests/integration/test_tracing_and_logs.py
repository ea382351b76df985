"""Traces and structured logs through real processes.

`splitserve up` (1 prefill + 1 decode worker, the router: three processes) runs with the standard
OTEL_* variables pointing at an OTLP/HTTP receiver in this test, and `--log-format json`. One
disaggregated request carrying a client `traceparent` and `x-request-id` must give one trace:
the client's span -> `router.request` -> `router.admission`, `router.prefill`, `router.decode`,
with `worker.prefill` under `router.prefill` and `worker.decode` under `router.decode` (parents
crossing processes through gRPC metadata), and a JSON access line naming the request, the
client's id, the trace, class, path and outcome. Without OTEL_* nothing is exported.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from tests.integration.processes import up_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "splitserve-sim"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@dataclass
class Receiver:
    spans: list[dict[str, object]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, body: bytes) -> None:
        req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        with self.lock:
            for rs in req.resource_spans:
                service = next(
                    a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
                )
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        attrs = {}
                        for a in s.attributes:
                            v = a.value
                            attrs[a.key] = getattr(v, v.WhichOneof("value") or "string_value")
                        self.spans.append(
                            {
                                "name": s.name,
                                "service": service,
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent": s.parent_span_id.hex(),
                                "attributes": attrs,
                                "events": [e.name for e in s.events],
                            }
                        )


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.path == "/v1/traces", self.path
            rec.add(body)
            out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _up(run_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    argv = [
        sys.executable, "-m", "splitserve", "up",
        "--prefill", "1", "--decode", "1",
        "--port", "0", "--grpc-port", "0", "--sim-time-scale", "0.2",
        "--run-dir", str(run_dir), "--log-level", "INFO", "--log-format", "json",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    up_ready(proc, run_dir)
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def test_one_trace_per_request_across_processes_and_a_json_access_line(
    receiver: tuple[Receiver, int], tmp_path: Path
) -> None:
    rec, port = receiver
    env = dict(
        os.environ,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_BSP_SCHEDULE_DELAY="100",
        SPLITSERVE_CACHE_DIR=str(tmp_path / "cache"),
    )
    env.pop("OTEL_SDK_DISABLED", None)
    proc = _up(tmp_path, env)
    try:
        router = json.loads((tmp_path / "router.ready.json").read_text())
        r = httpx.post(
            f"http://127.0.0.1:{router['port']}/v1/completions",
            json={"model": MODEL, "prompt": "trace me " * 40, "max_tokens": 6},
            headers={
                "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
                "x-request-id": "client-abc-123",
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "client-abc-123"
        names = {"router.request", "router.prefill", "router.decode", "worker.prefill",
                 "worker.decode", "router.admission", "worker.kv_pull"}  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with rec.lock:
                got = {s["name"] for s in rec.spans if s["trace_id"] == CLIENT_TRACE}
            if names <= got:
                break
            time.sleep(0.2)
    finally:
        _stop(proc)
    spans = {str(s["name"]): s for s in rec.spans if s["trace_id"] == CLIENT_TRACE}
    assert names <= set(spans), sorted(spans)
    root = spans["router.request"]
    assert root["parent"] == CLIENT_SPAN  # the client's traceparent is the parent
    assert root["service"] == "splitserve-router"
    for child in ("router.admission", "router.prefill", "router.decode"):
        assert spans[child]["parent"] == root["span_id"], child
    assert spans["worker.prefill"]["parent"] == spans["router.prefill"]["span_id"]
    assert spans["worker.decode"]["parent"] == spans["router.decode"]["span_id"]
    assert spans["worker.prefill"]["service"] == spans["worker.decode"]["service"]
    assert spans["worker.prefill"]["service"] == "splitserve-worker"
    attrs = root["attributes"]
    assert isinstance(attrs, dict)
    assert attrs["splitserve.outcome"] == "ok"
    assert attrs["splitserve.path"] == "disaggregated"
    admission = spans["router.admission"]["attributes"]
    assert isinstance(admission, dict)
    assert admission["splitserve.path"] == "disaggregated"
    assert admission["splitserve.placement_reason"]
    assert admission["splitserve.prefill_workers"]
    prefill = spans["worker.prefill"]["attributes"]
    assert isinstance(prefill, dict)
    assert prefill["splitserve.kv_bytes"] > 0
    assert "splitserve.queue_s" in prefill
    assert "splitserve.prefill_s" in prefill
    decode = spans["worker.decode"]["attributes"]
    assert isinstance(decode, dict)
    assert decode["splitserve.kv_bytes"] == prefill["splitserve.kv_bytes"]
    events = spans["worker.decode"]["events"]
    assert isinstance(events, list)
    assert "token" in events
    assert events.count("first_token") == 1
    # The decode worker's KV pull: a child of its decode span, with bytes and time.
    pull = spans["worker.kv_pull"]
    assert pull["parent"] == spans["worker.decode"]["span_id"]
    pull_attrs = pull["attributes"]
    assert isinstance(pull_attrs, dict)
    assert pull_attrs["splitserve.kv_bytes"] == prefill["splitserve.kv_bytes"]
    assert pull_attrs["splitserve.kv_pull_s"] >= 0

    lines = [
        json.loads(x)
        for x in (tmp_path / "router.log").read_text().splitlines()
        if x.startswith("{")
    ]
    access = [x for x in lines if x["logger"] == "splitserve.access"]
    assert len(access) == 1, access
    line = access[0]
    assert line["client_request_id"] == "client-abc-123"
    assert line["trace_id"] == CLIENT_TRACE
    assert line["request_id"].startswith("cmpl-")
    assert line["request_id"] != "client-abc-123"  # the router mints its own id
    assert (line["slo_class"], line["path"], line["outcome"]) == ("default", "disaggregated", "ok")
    assert line["output_tokens"] == 6
    assert line["component"] == "router"
    assert line["level"] == "INFO"


def test_traces_off_means_no_spans_and_no_trace_id(
    receiver: tuple[Receiver, int], tmp_path: Path
) -> None:
    rec, port = receiver
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["SPLITSERVE_CACHE_DIR"] = str(tmp_path / "cache")
    # An endpoint alone would turn traces on; OTEL_TRACES_EXPORTER=none keeps them off.
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    env["OTEL_TRACES_EXPORTER"] = "none"
    proc = _up(tmp_path, env)
    try:
        router = json.loads((tmp_path / "router.ready.json").read_text())
        r = httpx.post(
            f"http://127.0.0.1:{router['port']}/v1/completions",
            json={"model": MODEL, "prompt": "no traces", "max_tokens": 3},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=60,
        )
        assert r.status_code == 200
        assert "x-request-id" not in r.headers
        time.sleep(1)
    finally:
        _stop(proc)
    assert rec.spans == []
    access = [
        json.loads(x)
        for x in (tmp_path / "router.log").read_text().splitlines()
        if x.startswith("{") and '"splitserve.access"' in x
    ]
    assert len(access) == 1
    assert "trace_id" not in access[0]
    assert "client_request_id" not in access[0]
