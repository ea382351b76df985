"""vLLM's OpenAI HTTP protocol for P/D, as pure functions: request bodies from the Worker
service's messages, and load reports from a server's `/metrics` text.

The protocol (vLLM's disaggregation proxy does the same): the prefill server gets the prompt with
`max_tokens: 1`, `stream: false` and `kv_transfer_params: {"do_remote_decode": true}`; it computes
the prompt, samples one token, keeps the KV blocks under a lease and answers with the
`kv_transfer_params` a decode server needs (`remote_engine_id`, `remote_block_ids`,
`remote_host`, `remote_port`, `remote_request_id`, ...). The decode server gets the same prompt
and those parameters; its NixlConnector pulls the prompt's KV and it samples every output token
itself, the first one again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from splitserve._gen.v1 import common_pb2
from splitserve.core.request import seed_of_bits
from splitserve.core.roles import Role

PREFILL_KV_PARAMS: Final[Mapping[str, Any]] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""What the prefill request carries (vLLM's `toy_proxy_server.py` sends the same)."""

FINISH_FROM_VLLM: Final[Mapping[str, int]] = {
    "length": common_pb2.FINISH_REASON_LENGTH,
    "stop": common_pb2.FINISH_REASON_STOP,
    "abort": common_pb2.FINISH_REASON_CANCELLED,
    "error": common_pb2.FINISH_REASON_ERROR,
}

ROLE_TO_PB: Final[Mapping[Role, int]] = {
    Role.PREFILL: common_pb2.ROLE_PREFILL,
    Role.DECODE: common_pb2.ROLE_DECODE,
    Role.MIXED: common_pb2.ROLE_MIXED,
}

_INT63: Final = (1 << 63) - 1


ENGINE: Final = "vllm-serve"
"""The engine kind stock servers report to the router. Not "vllm": the HTTP backend passes the
sampler fields but not `logprobs` / structured outputs, so the router refuses those (400 naming
the field) rather than have them dropped."""


def pd_seed(request_id: str) -> int:
    """The seed an unseeded sampled request gets on both halves of a P/D run, so the decode
    server's re-sample of the first token equals the prefill's (same logits, same seed)."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big") & _INT63


def completion_body(
    model: str,
    prompt_token_ids: list[int],
    sampling: common_pb2.SamplingParams,
    *,
    max_tokens: int,
    stream: bool,
    kv_transfer_params: Mapping[str, Any] | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """A `/v1/completions` body: the prompt as token ids, token ids back, every sampler field
    of `sampling` that differs from vLLM's default (stop strings stay the router's)."""
    s = sampling
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt_token_ids,
        "max_tokens": max(1, max_tokens),
        "stream": stream,
        "return_token_ids": True,
        "temperature": s.temperature,
        "top_p": s.top_p if 0 < s.top_p <= 1 else 1.0,
    }
    if s.seeded:
        body["seed"] = seed_of_bits(s.seed)
    elif seed is not None and s.temperature > 0:
        body["seed"] = seed
    if s.stop_token_ids:
        body["stop_token_ids"] = list(s.stop_token_ids)
    if s.ignore_eos:
        body["ignore_eos"] = True
    if s.top_k > 0:
        body["top_k"] = s.top_k
    optional: dict[str, Any] = {
        "min_p": s.min_p,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty,
        "min_tokens": s.min_tokens,
    }
    body.update({k: v for k, v in optional.items() if v})
    if s.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in s.logit_bias.items()}
    if s.bad_words:
        body["bad_words"] = list(s.bad_words)
    if s.allowed_token_ids:
        body["allowed_token_ids"] = list(s.allowed_token_ids)
    if stream:
        body["stream_options"] = {"include_usage": True}
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = dict(kv_transfer_params)
    return body


def finish_reason(value: object) -> int:
    """vLLM's `finish_reason` as the Worker service's (UNSPECIFIED: not finished)."""
    if value is None:
        return common_pb2.FINISH_REASON_UNSPECIFIED
    return FINISH_FROM_VLLM.get(str(value), common_pb2.FINISH_REASON_ERROR)


def load_report(
    metrics_text: str, *, worker_id: str, role: Role, seq: int, model: str
) -> common_pb2.LoadReport:
    """A load report from a vLLM server's Prometheus text.

    Read: `vllm:num_requests_running`, `vllm:num_requests_waiting` (summed over the server's
    engines), `vllm:kv_cache_usage_perc` (the fraction of KV blocks in use, averaged) and
    `vllm:cache_config_info`'s `num_gpu_blocks` / `block_size` labels. A stock server reports
    no pending prefill tokens: that field is 0 and the router's own ledger of the prompts it
    sent there is the floor placement uses.

    Raises:
        ValueError: the text has none of vLLM's request gauges (not a vLLM server).
    """
    running = waiting = 0.0
    usage: list[float] = []
    total_blocks = block_size = 0
    seen = False
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            name = sample.name
            if name == "vllm:num_requests_running":
                running += sample.value
                seen = True
            elif name == "vllm:num_requests_waiting":
                waiting += sample.value
            elif name == "vllm:kv_cache_usage_perc":
                usage.append(sample.value)
            elif name == "vllm:cache_config_info":
                labels = sample.labels
                total_blocks += _int(labels.get("num_gpu_blocks"))
                block_size = block_size or _int(labels.get("block_size"))
    if not seen:
        raise ValueError("no vllm:num_requests_running series: not a vLLM server's /metrics")
    used = min(1.0, max(0.0, sum(usage) / len(usage))) if usage else 0.0
    free = round(total_blocks * (1.0 - used))
    return common_pb2.LoadReport(
        worker_id=worker_id,
        role=ROLE_TO_PB[role],  # type: ignore[arg-type]
        num_waiting=int(waiting),
        num_running=int(running),
        kv_blocks_free=free,
        kv_blocks_total=total_blocks,
        kv_block_size=block_size or 16,
        seq=seq,
        engine=ENGINE,
        model=model,
    )


def _int(value: str | None) -> int:
    try:
        return int(float(value)) if value not in (None, "", "None") else 0
    except ValueError:
        return 0
