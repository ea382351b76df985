"""The router's gRPC Generate refuses bad input as its HTTP face does (a new-user probe found
each difference):

- a refusal before dispatch counts in `splitserve_router_requests_total{outcome="rejected",
  path="none"}` (the HTTP 400s did; the gRPC ones changed no series);
- the message names the field as the gRPC request spells it (`slo_class`, not the HTTP header
  `x-slo-class`; `prompt_token_ids`, not `prompt`, for ids);
- a temperature of NaN or infinity is refused at the router, before placement (it was admitted,
  placed and sent to a worker, which refused it).
"""

from __future__ import annotations

import math

import grpc
import pytest
from grpc import aio

from splitserve._gen.v1 import common_pb2, router_pb2, router_pb2_grpc
from splitserve.core.request import SamplingSpec
from splitserve.core.roles import Role
from tests.unit.router.conftest import ServerFactory, WorkerFactory


def _hot(temperature: float) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=4, temperature=temperature)


def _rejected(server: object) -> float:
    """Refusals before dispatch, over every `slo_class` label (an unknown class is `other`)."""
    registry = server.registry  # type: ignore[attr-defined]
    return sum(
        float(sample.value)
        for family in registry.collect()
        if family.name == "splitserve_router_requests"
        for sample in family.samples
        if sample.name == "splitserve_router_requests_total"
        and sample.labels.get("outcome") == "rejected"
        and sample.labels.get("path") == "none"
    )


@pytest.mark.parametrize(
    ("request_fields", "named"),
    [
        ({"prompt": "hi", "slo_class": "nope"}, "slo_class: unknown SLO class 'nope'"),
        ({"prompt_token_ids": router_pb2.TokenIds(ids=[1, 4_000_000_000])},
         "prompt_token_ids: token id 4000000000 is outside the vocabulary"),
        ({"prompt": "hi", "sampling": _hot(math.nan)}, "temperature must be a finite number"),
        ({"prompt": "hi", "sampling": _hot(math.inf)}, "temperature must be a finite number"),
        ({"prompt": "hi", "sampling": common_pb2.SamplingParams(top_k=3)}, "sampling.top_k"),
    ],
    ids=["slo-class", "token-ids", "nan-temperature", "inf-temperature", "top-k"],
)  # fmt: skip
async def test_grpc_refusals_are_counted_and_name_the_grpc_field(
    make_worker: WorkerFactory,
    make_router: ServerFactory,
    request_fields: dict[str, object],
    named: str,
) -> None:
    m = await make_worker(Role.MIXED)
    server = await make_router(m.address)
    before = _rejected(server)
    async with aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        req = router_pb2.RouterGenerateRequest(**request_fields)  # type: ignore[arg-type]
        with pytest.raises(aio.AioRpcError) as err:
            _ = [c async for c in stub.Generate(req)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (err.value.details() or "")
    assert "x-slo-class" not in (err.value.details() or "")
    assert _rejected(server) == before + 1
    assert m.names() == []  # no worker saw it


@pytest.mark.parametrize("field", ["temperature", "presence_penalty", "repetition_penalty"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_sampling_spec_refuses_non_finite_knobs(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        SamplingSpec(max_tokens=4, **{field: value})  # type: ignore[arg-type]
