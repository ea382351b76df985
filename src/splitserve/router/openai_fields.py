"""What each OpenAI request field does, per engine: acts, or is refused with a 400 naming it.

One table (`FIELDS`) says it for every field of every request model; the HTTP face refuses
from it (`refusal`) and `docs/openai-api.md` is generated from it (`splitserve gen openai-doc`),
so the two cannot disagree. A test checks that every field of every request model has a row.

Engines: `vllm` (our worker over vLLM) and `sim` (the simulated engine, whose synthetic tokens
depend only on the prompt, the seed and the position: see docs/simulator.md).
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pydantic

from splitserve.router import openai_models as wire
from splitserve.router.generation import SamplerKnobs
from splitserve.router.logprobs import MAX_LOGPROBS
from splitserve.router.openai_errors import ApiError

ENGINES: Final = ("vllm", "sim")


@dataclass(frozen=True, slots=True)
class Field:
    """One request field: what it does with each engine."""

    vllm: str
    """"acts", "refused", or "accepted" (no effect by design, said in `note`)."""
    sim: str
    note: str = ""
    refused_because: str = ""
    """Why the field is refused (the 400's message); empty when it is not refused anywhere."""


_ACTS = Field("acts", "acts")
_SAMPLER = Field(
    "acts",
    "accepted",
    "Passed to vLLM's sampler. The simulated engine's synthetic tokens ignore it.",
)
_NO_TOOLS = (
    "the simulated engine's synthetic tokens depend only on the prompt, the seed and the "
    "position, so they cannot call tools"
)
_NO_GUIDED = "the simulated engine's synthetic tokens cannot follow a grammar"
_NO_LOGPROBS = (
    "the simulated engine's synthetic tokens come from no probability distribution, so it has "
    "no log probabilities to report"
)


def _refused(why: str, note: str = "") -> Field:
    return Field("refused", "refused", note, why)


def _refused_by_sim(why: str, note: str) -> Field:
    return Field("acts", "refused", note, why)


PRIORITY_REFUSED: Final = (
    "splitserve orders requests by SLO class, not by vLLM's per-request priority: send the "
    "`x-slo-class` header (each class has a priority, docs/slo.md)"
)

COMMON: Final[dict[str, Field]] = {
    "model": Field("acts", "acts", "Must be the served name; another name is a 404."),
    "max_tokens": Field(
        "acts",
        "acts",
        "Absent: chat runs until end of text or the context limit (`router.default_max_tokens` "
        "caps it); a completion stops at 16 tokens (OpenAI's and vLLM's default; `null`: as "
        "chat).",
    ),
    "temperature": _SAMPLER,
    "top_p": _SAMPLER,
    "seed": Field(
        "acts",
        "acts",
        "vLLM: seeds the sampler (in P/D the decode half's random stream differs from an "
        "aggregated run's). Simulated engine: chooses the synthetic token sequence.",
    ),
    "stop": Field(
        "acts",
        "acts",
        "Stop strings, matched by the router on the detokenized text. An empty string is a 400 "
        "(as vLLM). The choice's `stop_reason` (vLLM's extension) is the string that ended the "
        "answer.",
    ),
    "n": Field("acts", "acts", "Only 1; more is refused (400)."),
    "stream": _ACTS,
    "stream_options": Field(
        "acts", "acts", "Only with `stream: true` (else a 400 naming it, as vLLM refuses it)."
    ),
    "stream_options.include_usage": _ACTS,
    "stream_options.continuous_usage_stats": _ACTS,
    "ignore_eos": Field(
        "acts",
        "acts",
        "The simulated engine ends each answer with its tokenizer's end-of-text token at a "
        "length drawn per prompt (`--sim-answer-tokens`, median 128); with `ignore_eos` it runs "
        "to `max_tokens` instead.",
    ),
    "user": Field("accepted", "accepted"),
    "top_k": _SAMPLER,
    "min_p": _SAMPLER,
    "presence_penalty": Field(
        "acts",
        "accepted",
        "vLLM counts output tokens only; in P/D the decode worker counts the prefill's first "
        "token as output, like aggregated serving (after a mid-stream takeover the tokens "
        "already sent count as prompt). Simulated engine: no effect.",
    ),
    "frequency_penalty": Field(
        "acts", "accepted", "As `presence_penalty` (P/D and takeover alike)."
    ),
    "repetition_penalty": _SAMPLER,
    "logit_bias": Field(
        "acts",
        "accepted",
        "Ids outside the vocabulary are a 400.",
    ),
    "min_tokens": Field(
        "acts",
        "acts",
        "In P/D the prefill worker's first token counts (it cannot end the request early). "
        "Above `max_tokens` (chat: `max_completion_tokens` when set) it is a 400, as vLLM "
        "refuses it. The simulated engine moves its end of text to the first position allowed "
        "and keeps stop token ids out of the positions before it.",
    ),
    "bad_words": _SAMPLER,
    "allowed_token_ids": _SAMPLER,
    "stop_token_ids": Field(
        "acts",
        "acts",
        "Added to the model's end-of-text tokens (also with `ignore_eos`). As in vLLM, the "
        "stop token's text is left out of the answer (kept with `include_stop_str_in_output`); "
        "it counts in `usage`; the choice's `stop_reason` is its id (null for an end-of-text "
        "token, as vLLM).",
    ),
    "include_stop_str_in_output": Field(
        "acts",
        "acts",
        "As vLLM: the text ends with the stop string that matched, or the stop token's text "
        "(empty for special tokens unless `skip_special_tokens` is false). Applied by the "
        "router's detokenizer; the tokens and `usage` do not change.",
    ),
    "prompt_logprobs": _refused_by_sim(
        _NO_LOGPROBS,
        "0-20, as vLLM: each prompt token's log probability and the k most likely tokens at its "
        "position, as `prompt_logprobs` (on the choice for completions, at the top for chat: "
        "null for the first position, then `{token id: {logprob, rank, decoded_token}}`). Not "
        "with `stream` (a 400, as vLLM). Computed by the worker that runs the prompt (the "
        "prefill worker in P/D).",
    ),
    "truncate_prompt_tokens": Field(
        "acts",
        "acts",
        "As vLLM: only the prompt's last k tokens are sent (for chat, of the rendered "
        "messages); -1: the context's length. 0, below -1 or above the context is a 400.",
    ),
    "return_tokens_as_token_ids": Field(
        "acts",
        "acts",
        "As vLLM: the log probabilities' token strings are `token_id:N` (their `bytes` and "
        "completions' `text_offset` are those strings'). Without log probabilities a 400 (it "
        "would do nothing).",
    ),
    "priority": _refused(
        PRIORITY_REFUSED,
        "`0` (vLLM's default) is accepted; any other value is a 400 whatever the engine.",
    ),
    "return_token_ids": Field(
        "acts",
        "acts",
        "As vLLM: the prompt's token ids (`prompt_token_ids`: on the choice for completions, at "
        "the top for chat; in a stream on the first chunk only) and the answer's (`token_ids` "
        "on the choice: every token, a stop token included; in a stream each chunk's own).",
    ),
    "skip_special_tokens": Field(
        "acts",
        "acts",
        "As vLLM (default true): `false` keeps special tokens' text (end of text, ...) in the "
        "answer. Applied by the router's detokenizer; log probabilities' token strings keep "
        "special tokens either way, as vLLM's do.",
    ),
    "response_format": _refused_by_sim(
        _NO_GUIDED,
        '`{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"schema": ...}}`: '
        "vLLM's guided decoding (as `structured_outputs` `json_object` / `json`). "
        '`{"type": "text"}` (the default) is accepted by every engine.',
    ),
    "structured_outputs": _refused_by_sim(
        _NO_GUIDED,
        "vLLM 0.32's `StructuredOutputsParams`: exactly one of `json` (a schema), `regex`, "
        "`choice`, `grammar` (EBNF or Lark), `json_object`; any other kind (`structural_tag`) "
        "is a 400 naming it. The options `disable_any_whitespace`, "
        "`disable_additional_properties` and `whitespace_pattern` are a 400 when set: vLLM 0.32 "
        "accepts them per request but its backends read only the engine's "
        "`--structured-outputs-config` (a worker engine argument). A constraint vLLM's backend "
        "rejects (a bad regex, schema or grammar) is a 400 from the worker. In P/D the prefill "
        "worker samples the first token under the grammar and the decode worker advances its "
        "grammar past that token before sampling.",
    ),
}

COMPLETION: Final[dict[str, Field]] = {
    **COMMON,
    "prompt": Field(
        "acts",
        "acts",
        "One prompt: text or token ids (a list of one is accepted). A token id outside the "
        "tokenizer's vocabulary is a 400 naming it.",
    ),
    "add_special_tokens": Field(
        "acts",
        "acts",
        "As vLLM (default true): `false` encodes a text prompt without the tokens the "
        "tokenizer adds (a start token); token-id prompts are sent as given either way.",
    ),
    "echo": Field(
        "acts",
        "acts",
        "The answer's text starts with the prompt's: a text prompt as sent, a token-id prompt "
        "(or one cut by `truncate_prompt_tokens`: what was sent) decoded, special tokens kept; "
        "in a stream, on the first chunk. With `logprobs` (what lm-eval's loglikelihood tasks "
        "send), `logprobs` opens with the prompt's tokens (the first with null "
        "`token_logprobs` / `top_logprobs`), as vLLM; not streamed (a 400), and the simulated "
        "engine refuses `logprobs`.",
    ),
    "logprobs": _refused_by_sim(
        _NO_LOGPROBS,
        "0-20: each token's log probability and the `logprobs` most likely tokens at its "
        "position (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`, as vLLM writes "
        "them), streamed or not. In P/D the first token's come from the prefill worker. "
        "Simulated engine: `null` only.",
    ),
    "suffix": _refused("suffix is not supported", "`null` is accepted."),
    "best_of": _refused("best_of is not supported", "`1` is accepted."),
}

_MESSAGE_FIELDS: Final[dict[str, Field]] = {
    "messages.role": _ACTS,
    "messages.content": Field(
        "acts",
        "acts",
        "Text, or text parts (each with `text`; the parts' texts joined with newlines, as "
        "vLLM joins them for a chat template that reads `content` as a string); image and "
        "audio parts, and a text part carrying `image_url` or `input_audio`, are refused (400).",
    ),
    "messages.content.type": _ACTS,
    "messages.content.text": _ACTS,
    "messages.content.image_url": _refused("images are not supported"),
    "messages.content.input_audio": _refused("audio is not supported"),
    "messages.name": _ACTS,
}
_HISTORY_FIELDS: Final[dict[str, Field]] = {
    f"messages.tool_calls{sub}": _ACTS
    for sub in ("", ".id", ".type", ".function", ".function.name", ".function.arguments")
} | {"messages.tool_call_id": _ACTS}
_TOOL_FIELDS: Final[dict[str, Field]] = {
    f"tools{sub}": _ACTS
    for sub in (
        ".type",
        ".function",
        ".function.name",
        ".function.description",
        ".function.parameters",
    )
} | {"tools.function.strict": _ACTS}
_TOOL_CHOICE_FIELDS: Final = (
    "tool_choice.type",
    "tool_choice.function",
    "tool_choice.function.name",
)
_SEE_PARENT = Field("acts", "refused", "As its parent.")
"""A part of a field the simulated engine refuses (the 400 names the parent)."""

_TEMPLATE_FIELDS: Final[dict[str, Field]] = {
    "add_generation_prompt": Field(
        "acts", "acts", "As vLLM (default true): the prompt ends with the assistant's header."
    ),
    "continue_final_message": Field(
        "acts",
        "acts",
        "As vLLM: the prompt ends with the last message's text, left open for the model to "
        "continue (cut as transformers cuts it). With `add_generation_prompt: true` a 400.",
    ),
    "chat_template_kwargs": Field(
        "acts",
        "acts",
        "As vLLM: more variables for the chat template (`enable_thinking` for Qwen3, ...). A "
        "variable the served template does not read, or one the router sets itself "
        "(`messages`, `tools`, `add_generation_prompt`, the special tokens' names), is a 400 "
        "naming it (vLLM drops the first kind without a word; with "
        "`edge.allow_unknown_fields` the router drops it too).",
    ),
}

CHAT: Final[dict[str, Field]] = {
    **COMMON,
    "messages": Field(
        "acts",
        "acts",
        "Rendered with the model's chat template. Text content only (a string or `text` "
        "parts; other part types are a 400 naming the part, e.g. `messages[0].content[1].type`). "
        "As OpenAI's API (vLLM accepts these): a `system`, `developer`, `user` or `tool` "
        "message without content, an `assistant` message with neither content nor "
        "`tool_calls`, and an empty list of parts are a 400 naming `messages[i].content`.",
    ),
    **_MESSAGE_FIELDS,
    "messages.tool_calls": _refused_by_sim(_NO_TOOLS, ""),
    "messages.tool_call_id": _refused_by_sim(_NO_TOOLS, ""),
    **{k: _SEE_PARENT for k in _HISTORY_FIELDS if k.startswith("messages.tool_calls.")},
    "max_completion_tokens": Field("acts", "acts", "As `max_tokens` (wins when both are set)."),
    "logprobs": _refused_by_sim(
        _NO_LOGPROBS,
        "`choices[].logprobs.content[]` (`token`, `logprob`, `bytes`, `top_logprobs`) as vLLM "
        "writes it, streamed or not. In P/D the first token's come from the prefill worker. "
        "Simulated engine: `false` only.",
    ),
    "top_logprobs": _refused_by_sim(
        _NO_LOGPROBS,
        "0-20, with `logprobs: true` (more than 0 without it is a 400; 0 without it asks for "
        "nothing and is accepted on every engine, as vLLM). As vLLM, the list starts with the "
        "sampled token.",
    ),
    "tools": _refused_by_sim(
        _NO_TOOLS,
        "Rendered by the chat template (`tools=`, as vLLM and transformers pass them); a "
        "template that does not read `tools` is a 400. An empty list is accepted everywhere.",
    ),
    **{k: _SEE_PARENT for k in _TOOL_FIELDS if k != "tools.function.strict"},
    "tools.function.strict": _refused_by_sim(
        _NO_TOOLS,
        '`true` is honoured with `tool_choice` `"required"` or a named function (the answer is '
        "guided by the tool's schema); with `\"auto\"` it is a 400 (the model's own calls are "
        "not guided). `false` is accepted.",
    ),
    "tool_choice": _refused_by_sim(
        _NO_TOOLS,
        '`"auto"` (the default with tools): calls are read from the answer by the router\'s '
        "tool-call parser (`edge.tool_call_parser`: `hermes`, `llama3_json` or `pythonic`; "
        "vLLM's `--tool-call-parser`) and returned as `tool_calls` (streamed: "
        "`delta.tool_calls`, vLLM's shape), finish reason "
        '`tool_calls`; without a parser, a 400. `"none"` (accepted by every engine): tools '
        'rendered, no calls read. `"required"` and a named function force calls with guided '
        "decoding, as vLLM does (a JSON schema of an array of `{name, parameters}` any of the "
        "tools, or the named function's `parameters`), from the first token in P/D; no parser "
        "is needed for them. Finish reason `tool_calls` for `required` (when the answer "
        "stopped), the answer's own for a named function. With `response_format` or "
        "`structured_outputs` they are a 400.",
    ),
    **dict.fromkeys(_TOOL_CHOICE_FIELDS, _SEE_PARENT),
    "parallel_tool_calls": _refused_by_sim(
        _NO_TOOLS, "`false`: only the first call is returned (as vLLM)."
    ),
    **_TEMPLATE_FIELDS,
}

TOKENIZE: Final[dict[str, Field]] = {
    "model": Field("acts", "acts", "Optional; when set, the served name."),
    "prompt": _ACTS,
    "add_special_tokens": _ACTS,
    "return_token_strs": _ACTS,
}
TOKENIZE_CHAT: Final[dict[str, Field]] = {
    "model": TOKENIZE["model"],
    "messages": CHAT["messages"],
    **_MESSAGE_FIELDS,
    **_HISTORY_FIELDS,
    **_TEMPLATE_FIELDS,
    "return_token_strs": _ACTS,
    "tools": _ACTS,
    **_TOOL_FIELDS,
}
DETOKENIZE: Final[dict[str, Field]] = {"model": TOKENIZE["model"], "tokens": _ACTS}

TABLES: Final[dict[type[wire._Wire], dict[str, Field]]] = {
    wire.CompletionRequest: COMPLETION,
    wire.ChatCompletionRequest: CHAT,
    wire.TokenizeCompletionRequest: TOKENIZE,
    wire.TokenizeChatRequest: TOKENIZE_CHAT,
    wire.DetokenizeRequest: DETOKENIZE,
}


def _nested(annotation: Any) -> Iterator[type[pydantic.BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _nested(arg)


def field_names(model: type[pydantic.BaseModel], prefix: str = "") -> list[str]:
    """Every field of a request model, nested ones dotted (`messages.content.type`)."""
    out: list[str] = []
    for name, info in model.model_fields.items():
        out.append(prefix + name)
        for sub in _nested(info.annotation):
            out += field_names(sub, f"{prefix}{name}.")
    return list(dict.fromkeys(out))


def _set(value: Any) -> bool:
    """Was a field sent with a value that asks for something (beyond the default)?"""
    return value not in (None, False, [], {})


def _offending(req: wire.SamplingFields, engines: Sequence[str] = ENGINES) -> str | None:
    """The first field the request uses that one of `engines` refuses, by its dotted name."""
    table = CHAT if isinstance(req, wire.ChatCompletionRequest) else COMPLETION
    for name in _used(req):
        status = table[name]
        if any(getattr(status, e, "refused") == "refused" for e in (engines or ENGINES)):
            return name
    return None


def _used(req: wire.SamplingFields) -> Iterator[str]:
    """The request's fields (dotted names) that are refused by some engine, where it uses them."""
    name = _used_first(req)
    if name is not None:
        yield name
    if _set(req.response_format) and req.response_format != {"type": "text"}:
        yield "response_format"
    if _set(req.structured_outputs):
        yield "structured_outputs"
    if req.prompt_logprobs is not None:
        yield "prompt_logprobs"
    if isinstance(req, wire.CompletionRequest) and req.logprobs is not None:
        yield "logprobs"
    if isinstance(req, wire.ChatCompletionRequest):
        if req.logprobs:
            yield "logprobs"
        if req.top_logprobs:  # 0 asks for nothing (vLLM accepts it without `logprobs`)
            yield "top_logprobs"
        yield from _used_tools(req)


def _used_first(req: wire.SamplingFields) -> str | None:
    if isinstance(req, wire.CompletionRequest):
        if req.suffix:
            return "suffix"
        if (req.best_of or 1) > 1:
            return "best_of"
    return None


def _used_tools(req: wire.ChatCompletionRequest) -> Iterator[str]:
    if _set(req.tools):
        yield "tools"
        if any(t.function.strict for t in req.tools or ()):
            yield "tools.function.strict"
    if req.tool_choice not in (None, "none"):
        yield "tool_choice"
    if req.parallel_tool_calls is not None:
        yield "parallel_tool_calls"
    for m in req.messages:
        if _set(m.tool_calls):
            yield "messages.tool_calls"
        if m.tool_call_id is not None:
            yield "messages.tool_call_id"


_REFUSABLE: Final = frozenset(
    (
        "response_format",
        "structured_outputs",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "suffix",
        "best_of",
        "prompt_logprobs",
    )
)
"""The top-level fields `_used` reads (besides the chat messages' `tool_calls` and
`tool_call_id`): a request that sets none of them has them all at their defaults, which use
nothing."""


def refusal(req: wire.SamplingFields, engines: Sequence[str]) -> ApiError | None:
    """A 400 naming the first field of `req` that the serving engines cannot honour."""
    if req.model_fields_set.isdisjoint(_REFUSABLE) and not _history_tools(req):
        return None  # `_used` finds nothing (most requests): the same answer, cheaper
    name = _offending(req, engines)
    if name is None:
        return None
    table = CHAT if isinstance(req, wire.ChatCompletionRequest) else COMPLETION
    return _refuse(name, table, engines)


def _history_tools(req: wire.SamplingFields) -> bool:
    """Does a chat message carry `tool_calls` or `tool_call_id` (what `_used_tools` reads of
    the messages)?"""
    if not isinstance(req, wire.ChatCompletionRequest):
        return False
    return any(m.tool_calls or m.tool_call_id is not None for m in req.messages)


def _refuse(name: str, table: dict[str, Field], engines: Sequence[str]) -> ApiError:
    engine = "/".join(engines) or "unknown"
    status = table[name]
    known = [e for e in engines if e in ENGINES and getattr(status, e) == "refused"]
    why = status.refused_because
    if engines and not known:  # only a backend kind the table has no column for refuses it
        why = (
            "the router does not pass this field to "
            + "/".join(e for e in engines if e not in ENGINES)
            + " backends (stock `vllm serve` servers)"
        )
    return ApiError(
        400,
        f"`{name}` is not supported by the {engine} engine behind this router: "
        f"{why} (see docs/openai-api.md)",
        param=name,
        code="unsupported_field",
    )


def requested_logprobs(req: wire.SamplingFields) -> int | None:
    """How many most likely tokens to return per position (None: no log probabilities).

    Raises:
        ApiError: out of [0, MAX_LOGPROBS], or chat `top_logprobs` without `logprobs: true`.
    """
    if isinstance(req, wire.CompletionRequest):
        top, name = req.logprobs, "logprobs"
    elif isinstance(req, wire.ChatCompletionRequest):
        top, name = req.top_logprobs, "top_logprobs"
        if not req.logprobs:
            if top:
                raise ApiError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
            return None
        top = top or 0
    else:
        return None
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise ApiError(400, f"{name} must be in [0, {MAX_LOGPROBS}], got {top}", param=name)
    return top


GUIDES: Final = ("json", "regex", "choice", "grammar", "json_object")
"""vLLM's structured-output constraint kinds (exactly one per request)."""
_GUIDE_OPTIONS: Final = {
    "disable_any_whitespace": bool,
    "disable_additional_properties": bool,
    "whitespace_pattern": str,
}


_ENGINE_WIDE: Final = {
    "disable_any_whitespace": (
        "is not read per request by vLLM 0.32 (its backends take it from the engine's "
        "configuration): start the vLLM workers with the engine argument "
        "`--structured-outputs-config "
        """'{"backend": "xgrammar", "disable_any_whitespace": true}'`"""
    ),
    "disable_additional_properties": (
        "is not read per request by vLLM 0.32 (its guidance backend takes it from the engine's "
        "configuration): start the vLLM workers with the engine argument "
        "`--structured-outputs-config "
        """'{"backend": "guidance", "disable_additional_properties": true}'`"""
    ),
    "whitespace_pattern": "is not read by any of vLLM 0.32's structured-output backends",
}
"""Options of vLLM's `StructuredOutputsParams` that vLLM 0.32 accepts per request and ignores
(its backends read the engine's `StructuredOutputsConfig`): refused when set, not dropped."""


def structured_outputs(req: wire.SamplingFields) -> str:
    """The request's guided decoding as vLLM's `StructuredOutputsParams` JSON ("" for none):
    `structured_outputs`, with `response_format` setting its constraint as vLLM does.

    Raises:
        ApiError: an unknown key, a malformed value, or not exactly one constraint.
    """
    so: dict[str, Any] = dict(req.structured_outputs or {})
    for key, value in so.items():
        param = f"structured_outputs.{key}"
        if key in _GUIDE_OPTIONS:
            if value is not None and not isinstance(value, _GUIDE_OPTIONS[key]):
                raise ApiError(
                    400, f"{param} must be a {_GUIDE_OPTIONS[key].__name__}", param=param
                )
            if value:  # asks for something vLLM would drop
                raise ApiError(400, f"{param} {_ENGINE_WIDE[key]}", param=param)
        elif key not in GUIDES:
            raise ApiError(
                400,
                f"{param} is not supported (constraint kinds: {', '.join(GUIDES)})",
                param=param,
            )
    rf = req.response_format
    if rf is not None and rf != {"type": "text"}:
        kind = rf.get("type")
        if kind == "json_object":
            so["json_object"] = True
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise ApiError(
                    400,
                    "response_format.json_schema.schema must be a JSON schema (an object)",
                    param="response_format",
                )
            so["json"] = spec["schema"]
        else:
            raise ApiError(
                400,
                f"response_format.type must be text, json_object or json_schema, got {kind!r}",
                param="response_format",
            )
    if not so and req.structured_outputs is None:
        return ""
    kinds = [k for k in GUIDES if so.get(k) is not None]
    if len(kinds) != 1:
        raise ApiError(
            400,
            "structured outputs need exactly one constraint of "
            f"{', '.join(GUIDES)} (with response_format counted), got {kinds or 'none'}",
            param="structured_outputs",
        )
    _check_guide(kinds[0], so[kinds[0]])
    return json.dumps(so, separators=(",", ":"), sort_keys=True)


def _check_guide(kind: str, value: Any) -> None:
    param = f"structured_outputs.{kind}"
    ok = {
        "json": isinstance(value, dict | str),
        "regex": isinstance(value, str) and bool(value),
        "grammar": isinstance(value, str) and bool(value),
        "choice": isinstance(value, list)
        and bool(value)
        and all(isinstance(c, str) for c in value),
        "json_object": value is True,
    }[kind]
    if not ok:
        what = {
            "json": "a JSON schema (object or string)",
            "regex": "a non-empty string",
            "grammar": "a non-empty string",
            "choice": "a non-empty list of strings",
            "json_object": "true",
        }[kind]
        raise ApiError(400, f"{param} must be {what}", param=param)


_KNOB_FIELDS: Final = frozenset(
    (
        "logit_bias",
        "allowed_token_ids",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_tokens",
        "bad_words",
        "stop_token_ids",
    )
)
"""The fields `sampler_knobs` reads."""
_NO_KNOBS: Final = SamplerKnobs()
"""What `sampler_knobs` builds for a request that sets none of `_KNOB_FIELDS` (each at its
default, None): the engine's defaults."""


def sampler_knobs(req: wire.SamplingFields) -> SamplerKnobs:
    """The sampler fields of a request. Raises `ApiError` for malformed `logit_bias`."""
    if req.model_fields_set.isdisjoint(_KNOB_FIELDS):
        return _NO_KNOBS  # what the lines below build then (most requests), built once
    bias: list[tuple[int, float]] = []
    for key, value in (req.logit_bias or {}).items():
        # ASCII digits only: str.isdigit() also holds for "²", which int() refuses.
        if not (key.isascii() and key.isdigit()):
            raise ApiError(400, f"logit_bias: {key!r} is not a token id", param="logit_bias")
        if not -100 <= value <= 100:
            raise ApiError(
                400, f"logit_bias: the bias of {key} must be in [-100, 100]", param="logit_bias"
            )
        bias.append((int(key), value))
    if req.allowed_token_ids is not None and not req.allowed_token_ids:
        raise ApiError(400, "allowed_token_ids must not be empty", param="allowed_token_ids")
    # As vLLM's SamplingParams refuses it (was served, the vLLM worker clamping min_tokens to
    # the limit). The limit the request runs under: max_completion_tokens wins in chat.
    limit_field, limit = "max_tokens", req.max_tokens
    completion_limit: int | None = getattr(req, "max_completion_tokens", None)
    if completion_limit is not None:
        limit_field, limit = "max_completion_tokens", completion_limit
    if req.min_tokens is not None and limit is not None and req.min_tokens > limit:
        raise ApiError(
            400,
            f"min_tokens: must be less than or equal to {limit_field} ({limit}), "
            f"got {req.min_tokens}",
            param="min_tokens",
        )
    return SamplerKnobs(
        top_k=req.top_k or 0,
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=tuple(sorted(bias)),
        min_tokens=req.min_tokens or 0,
        bad_words=tuple(req.bad_words or ()),
        allowed_token_ids=tuple(req.allowed_token_ids or ()),
        stop_token_ids=tuple(req.stop_token_ids or ()),
    )
