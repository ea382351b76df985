"""Worker request messages built from a core `Request`, and finish reasons read from replies.

Conventions of the Worker service: `sampling.max_tokens` counts every output token, the first
(sampled by the prefill worker) included; a `GenerateRequest` that takes over a stream carries
the prompt plus the tokens already emitted and only the tokens still owed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.request import FinishReason, Request, TokenLogprobs, seed_bits

FINISH_FROM_PB: Final = {
    common_pb2.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    common_pb2.FINISH_REASON_STOP: FinishReason.STOP,
    common_pb2.FINISH_REASON_CANCELLED: FinishReason.CANCELLED,
    common_pb2.FINISH_REASON_ERROR: FinishReason.ERROR,
}
"""FINISH_REASON_UNSPECIFIED (not finished) is absent: look it up with `.get`."""


def sampling(req: Request, max_tokens: int) -> common_pb2.SamplingParams:
    s = req.sampling
    return common_pb2.SamplingParams(
        max_tokens=max(max_tokens, 1),
        temperature=s.temperature,
        top_p=s.top_p,
        seed=seed_bits(s.seed or 0),
        stop_token_ids=s.stop_token_ids,
        ignore_eos=s.ignore_eos,
        top_k=s.top_k,
        min_p=s.min_p,
        presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty,
        logit_bias=dict(s.logit_bias),
        min_tokens=s.min_tokens,
        bad_words=s.bad_words,
        allowed_token_ids=s.allowed_token_ids,
        seeded=s.seed is not None,
        logprobs=s.logprobs is not None,
        top_logprobs=s.logprobs or 0,
        structured_outputs=s.structured_outputs,
        prompt_logprobs=s.prompt_logprobs is not None,
        prompt_top_logprobs=s.prompt_logprobs or 0,
    )


def logprobs_from_pb(pb: common_pb2.TokenLogprobs) -> TokenLogprobs:
    return TokenLogprobs(tuple(pb.token_ids), tuple(pb.logprobs), pb.rank)


def prompt_logprobs_from_pb(
    pbs: Sequence[common_pb2.TokenLogprobs],
) -> tuple[TokenLogprobs | None, ...]:
    """A prompt's log probabilities (`TokenChunk.prompt_logprobs`): an empty entry is None
    (the first position: nothing precedes it)."""
    return tuple(logprobs_from_pb(pb) if pb.token_ids else None for pb in pbs)


def prefill(
    req: Request,
    slo: common_pb2.SloContext | None = None,
    *,
    sampling_pb: common_pb2.SamplingParams | None = None,
) -> worker_pb2.PrefillRequest:
    """`sampling_pb`: `sampling(req, req.sampling.max_tokens)` when the caller already built it
    (a P/D request sends the same to its prefill and decode workers)."""
    return worker_pb2.PrefillRequest(
        request_id=req.id,
        prompt_token_ids=req.prompt_token_ids,
        sampling=sampling(req, req.sampling.max_tokens) if sampling_pb is None else sampling_pb,
        slo_class=req.slo_class,
        slo=slo,
    )


def decode(
    req: Request,
    first_token_id: int,
    kv: common_pb2.KvHandle,
    slo: common_pb2.SloContext | None = None,
    *,
    sampling_pb: common_pb2.SamplingParams | None = None,
) -> worker_pb2.DecodeRequest:
    """`sampling_pb`: as in `prefill`."""
    return worker_pb2.DecodeRequest(
        request_id=req.id,
        prompt_token_ids=req.prompt_token_ids,
        first_token_id=first_token_id,
        sampling=sampling(req, req.sampling.max_tokens) if sampling_pb is None else sampling_pb,
        kv=kv,
        slo_class=req.slo_class,
        slo=slo,
    )


def early_decode(
    req: Request,
    slo: common_pb2.SloContext | None = None,
    *,
    sampling_pb: common_pb2.SamplingParams | None = None,
) -> worker_pb2.DecodeRequest:
    """A Decode sent before the prefill answers (`kv_follows`): its first token and KV handle
    follow on the same Multiplex sub-request (`MuxStream.follow`)."""
    return worker_pb2.DecodeRequest(
        request_id=req.id,
        prompt_token_ids=req.prompt_token_ids,
        sampling=sampling(req, req.sampling.max_tokens) if sampling_pb is None else sampling_pb,
        slo_class=req.slo_class,
        slo=slo,
        kv_follows=True,
    )


def generate(
    req: Request, emitted: Sequence[int] = (), slo: common_pb2.SloContext | None = None
) -> worker_pb2.GenerateRequest:
    """The whole request, or (with `emitted`) the rest of it after the tokens already sent."""
    msg = worker_pb2.GenerateRequest(
        request_id=req.id,
        prompt_token_ids=[*req.prompt_token_ids, *emitted],
        sampling=sampling(req, req.sampling.max_tokens - len(emitted)),
        slo_class=req.slo_class,
        slo=slo,
    )
    if emitted and req.sampling.structured_outputs:
        msg.sampling.structured_outputs = guide_after(req.sampling.structured_outputs, len(emitted))
    return msg


GUIDE_GENERATED_KEY: Final = "splitserve_generated"
"""Key of a takeover's structured-outputs JSON: how many of the prompt's last tokens the request
already generated, which the worker's grammar accepts before it samples (vllm_adapter/guided.py
reads it under the same name)."""


def guide_after(spec: str, num_generated: int) -> str:
    """The request's structured-outputs JSON for a takeover after `num_generated` tokens."""
    fields = json.loads(spec)
    fields[GUIDE_GENERATED_KEY] = num_generated
    return json.dumps(fields, separators=(",", ":"), sort_keys=True)
