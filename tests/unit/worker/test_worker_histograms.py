"""The worker's step-time and KV-pull-time histograms, and the decode worker's KV-pull span and
first-token event, over a real P/D hand-off between two in-process workers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from splitserve._gen.v1 import worker_pb2
from splitserve.core.roles import Role
from splitserve.obs import tracing
from tests.unit.worker.conftest import WorkerFactory
from tests.unit.worker.test_server import PROMPT, collect, sampling


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure("worker", exporter=exporter)
    yield exporter
    tracing.shutdown()


async def test_step_and_kv_pull_times_and_the_pull_span(
    make_worker: WorkerFactory, spans: InMemorySpanExporter
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    pre = await p.stub.Prefill(
        worker_pb2.PrefillRequest(request_id="a", prompt_token_ids=PROMPT, sampling=sampling())
    )
    await collect(
        d.stub.Decode(
            worker_pb2.DecodeRequest(
                request_id="a",
                prompt_token_ids=PROMPT,
                first_token_id=pre.first_token_id,
                sampling=sampling(),
                kv=pre.kv,
            )
        )
    )
    steps = d.sample("splitserve_worker_step_seconds_count")
    assert steps == d.sample("splitserve_worker_steps_total") > 0
    assert d.sample("splitserve_worker_step_seconds_sum") > 0
    assert p.sample("splitserve_worker_step_seconds_count") > 0
    assert d.sample("splitserve_worker_kv_pull_seconds_count") == 1
    assert d.sample("splitserve_worker_kv_pull_seconds_sum") >= 0
    assert p.sample("splitserve_worker_kv_pull_seconds_count") == 0  # prefill pulls nothing
    by_name = {s.name: s for s in spans.get_finished_spans()}
    decode, pull = by_name["worker.decode"], by_name["worker.kv_pull"]
    assert pull.parent is not None
    assert decode.context is not None
    assert pull.parent.span_id == decode.context.span_id
    assert pull.attributes is not None
    assert pull.attributes["splitserve.kv_bytes"] == pre.kv.num_bytes
    assert [e.name for e in decode.events].count("first_token") == 1
