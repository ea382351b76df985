"""An early Decode's vLLM input prepared before its first token (`VllmEngine.prepare_decode`):
which decode a prepared input fits, and what adding it writes in. No vLLM runs here: vLLM's
`EngineCoreRequest` and the engine's three add steps are stand-ins; the real engine is checked
token by token in tests/contract/vllm/test_vllm_engine_pd.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.worker.vllm_adapter.engine import _continued, _Prepared

PROMPT = (1, 5, 6, 7)


def _request(max_tokens: int = 8) -> Request:
    return Request(RequestId("d"), PROMPT, SamplingSpec(max_tokens=max_tokens), 0.0)


@dataclass
class _Params:
    extra_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Processed:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: _Params
    arrival_time: float = 0.0


class _Engine:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.input_processor = self
        self.output_processor = self
        self.engine_core = self

    def assign_request_id(self, request: _Processed) -> None:
        self.calls.append("assign")
        request.request_id += "-x"

    def add_request(self, request: _Processed, *args: Any) -> None:
        self.calls.append(f"add{len(args)}")


def _prepared(max_tokens: int = 8) -> _Prepared:
    continued = _continued(_request(max_tokens), PROMPT[-1])  # the placeholder
    processed = _Processed("d", list(continued.prompt_token_ids), _Params({"slo": 1}))
    return _Prepared(PROMPT, continued.sampling, processed)


def test_it_fits_the_decode_it_was_made_for_only() -> None:
    prepared = _prepared()
    assert prepared.fits(_continued(_request(), 42))  # any first token
    assert not prepared.fits(_continued(_request(max_tokens=9), 42))  # other sampling
    other = replace(_request(), prompt_token_ids=(1, 5, 6, 8))
    assert not prepared.fits(_continued(other, 42))  # other prompt


def test_adding_writes_the_first_token_and_the_decodes_params_in() -> None:
    prepared = _prepared()
    engine = _Engine()
    late = _Params({"kv_transfer_params": {"remote_engine_id": "e"}, "slo": 2})
    internal = prepared.add(engine, 42, late)
    request = prepared.processed
    assert request.prompt_token_ids == [*PROMPT, 42]
    assert request.sampling_params.extra_args == late.extra_args
    assert request.arrival_time > 0
    # As LLMEngine.add_request adds a processed input: id, output processor, engine core.
    assert engine.calls == ["assign", "add3", "add0"]
    assert internal == "d-x"
