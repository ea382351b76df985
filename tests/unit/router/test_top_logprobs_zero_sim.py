"""`top_logprobs: 0` with `logprobs: false` asks for nothing: vLLM's OpenAI server accepts it
(it refuses only -1 or more than 0 without `logprobs`), so the simulated engine must too."""

from __future__ import annotations

from splitserve.router import openai_models as wire
from splitserve.router.openai_fields import refusal, requested_logprobs


def _chat(**fields: object) -> wire.ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return wire.ChatCompletionRequest.model_validate(body)


def test_top_logprobs_zero_without_logprobs_is_accepted_by_the_sim_engine() -> None:
    req = _chat(top_logprobs=0, logprobs=False)
    assert refusal(req, ["sim"]) is None  # was a 400 "`top_logprobs` is not supported"
    assert requested_logprobs(req) is None


def test_top_logprobs_above_zero_is_still_refused_by_the_sim_engine() -> None:
    err = refusal(_chat(top_logprobs=2, logprobs=True), ["sim"])
    assert err is not None
    assert err.status == 400
