"""OpenAI wire format: request models (validated strictly) and response / chunk bodies.

Unknown request fields are refused (400 naming the field; `edge.allow_unknown_fields` relaxes
this for clients that send vendor extras); known fields are checked strictly (a string where a
number belongs is a 400, never coerced). Every field either acts or is refused: `FIELD_STATUS`
says which, per engine, and `docs/openai-api.md` is generated from it. Response bodies are plain
dicts shaped like OpenAI's, so the official client parses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from splitserve.core.request import FinishReason, TokenLogprobs
from splitserve.router.generation import TextChunk, Usage
from splitserve.router.logprobs import MAX_LOGPROBS, LogprobsFormatter

_FINISH_NAMES: Final = {
    FinishReason.LENGTH: "length",
    FinishReason.STOP: "stop",
    FinishReason.CANCELLED: "abort",
    FinishReason.ERROR: "error",
}


class _Wire(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True
    )


class StreamOptions(_Wire):
    include_usage: bool = False
    """Send a last chunk with the usage of the whole request."""
    continuous_usage_stats: bool = False
    """vLLM's extension: every chunk carries the usage so far (with `include_usage`)."""


COMPLETION_MAX_TOKENS: Final = 16
"""`/v1/completions` without `max_tokens` (OpenAI's default, and vLLM's)."""


class SamplingFields(_Wire):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)  # vLLM's int64
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    """vLLM's extension: keep generating past end-of-text tokens."""
    user: str | None = None
    """OpenAI's end-user label: accepted and not used (it has no effect in OpenAI's API either
    beyond abuse monitoring)."""
    # Sampling beyond OpenAI's (vLLM's extensions), passed to the engine's sampler.
    top_k: int | None = Field(None, ge=-1, le=2**31 - 1)  # the proto's int32
    """Sample from the k most likely tokens (0 or -1: all). `1` is greedy."""
    min_p: float | None = Field(None, ge=0, le=1)
    """Drop tokens less likely than `min_p` x the most likely token's probability."""
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    logit_bias: dict[str, float] | None = None
    """Token id (as a string, OpenAI's form) -> bias added to its logit, in [-100, 100]."""
    min_tokens: int | None = Field(None, ge=0, le=2**32 - 1)  # the proto's uint32
    """Generate at least this many tokens before an end-of-text token or stop token may end it."""
    bad_words: list[str] | None = None
    """Words (tokenized by the engine) that are never generated."""
    allowed_token_ids: list[int] | None = None
    """Only these token ids may be generated."""
    stop_token_ids: list[int] | None = None
    """vLLM's extension: more token ids that end the completion (besides end of text)."""
    include_stop_str_in_output: bool = False
    """vLLM's extension: the text ends with the stop string (or stop token's text) that
    ended it."""
    skip_special_tokens: bool = True
    """vLLM's extension: `false` keeps special tokens' text (end of text, ...) in the answer."""
    return_token_ids: bool | None = None
    """vLLM's extension: the prompt's and the answer's token ids with the text."""
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    """vLLM's extension: each prompt token's log probability and the k most likely tokens at
    its position (not with `stream`)."""
    truncate_prompt_tokens: int | None = Field(None, ge=-(2**63), lt=2**63)
    """vLLM's extension: keep only the prompt's last k tokens (-1: the context's length)."""
    return_tokens_as_token_ids: bool | None = None
    """vLLM's extension: log probabilities name tokens as `token_id:N`."""
    priority: int = Field(0, ge=-(2**63), lt=2**63)
    """vLLM's priority-scheduler field: only 0 (splitserve orders requests by SLO class)."""
    # Refused for now (400 naming the field and the engine): see `openai_fields`.
    response_format: dict[str, Any] | None = None
    """Structured output (`json_object`, `json_schema`)."""
    structured_outputs: dict[str, Any] | None = None
    """vLLM's guided decoding (`json`, `regex`, `choice`, `grammar`)."""

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(
        cls, value: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        # As vLLM ("Stream options can only be defined when `stream=True`"): without `stream`
        # they would have no effect, and nothing is ignored silently.
        if value is not None and not info.data.get("stream"):
            raise PydanticCustomError(
                "stream_options", "stream options can only be given with `stream: true`"
            )
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        so = self.stream_options
        return so is not None and so.include_usage and so.continuous_usage_stats


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    # OpenAI's and vLLM's completions default when absent; `null`: as chat's absent one.
    max_tokens: int | None = Field(COMPLETION_MAX_TOKENS, ge=1)
    echo: bool | None = False
    add_special_tokens: bool = True
    """vLLM's extension: `false` encodes a text prompt without the tokens the tokenizer adds
    (a start token)."""
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


class ContentPart(_Wire):
    type: str
    text: str | None = None
    image_url: Any = None
    """Accepted by the parser so the refusal can name the part's type (images: refused)."""
    input_audio: Any = None
    """As `image_url` (audio: refused)."""


class FunctionDefinition(_Wire):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """The arguments' JSON schema, passed to the chat template."""
    strict: bool | None = None
    """`true`: arguments forced to match `parameters`."""


class Tool(_Wire):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionCall(_Wire):
    name: str
    arguments: str
    """JSON text; the chat template gets it parsed, as vLLM passes it (not JSON: a 400)."""


class ToolCall(_Wire):
    """A call the assistant made, in the history."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class NamedFunction(_Wire):
    name: str


class NamedToolChoice(_Wire):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    """Passed to the chat template (templates that know it use it; the default tokenizer's, which
    `make run` serves, writes it after the role in the turn's header)."""
    tool_calls: list[ToolCall] | None = None
    """The calls an assistant message made (tool-call history), passed to the chat template."""
    tool_call_id: str | None = None
    """Which call a `tool` message answers, passed to the chat template."""

    def text(self) -> str:
        """The message content as one string (text parts joined).

        Raises:
            ContentError: content OpenAI's API refuses (none for a role that needs it, an empty
                list of parts) or that this router cannot serve (a part other than text); its
                `path` is the field's path within the message (`content[2].text`).
        """
        if self.content is None:
            if self.role != "assistant":
                raise ContentError("content", f"a {self.role} message needs content")
            if not self.tool_calls:
                raise ContentError("content", "an assistant message needs content or tool_calls")
            return ""
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            raise ContentError("content", "an empty list (give at least one content part)")
        for j, part in enumerate(self.content):
            if part.type != "text":
                raise ContentError(
                    f"content[{j}].type", f"content parts of type {part.type!r} are not supported"
                )
            if part.text is None:
                raise ContentError(f"content[{j}].text", "a content part of type 'text' needs it")
            for media in ("image_url", "input_audio"):  # would be dropped: refused, named
                if getattr(part, media) is not None:
                    raise ContentError(
                        f"content[{j}].{media}",
                        "a content part of type 'text' cannot carry it "
                        "(images and audio are not supported)",
                    )
        # one text per part, joined with newlines: what vLLM hands a chat template that reads
        # `content` as a string (`chat_utils`), so both render the same prompt
        return "\n".join(part.text or "" for part in self.content)


class ContentError(ValueError):
    """A message's content refused; `path` is where, within the message (`content[0].text`)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    """vLLM's extension: end the prompt with the assistant's turn header."""
    continue_final_message: bool = False
    """vLLM's extension: leave the last message open, to be continued (needs
    `add_generation_prompt: false`)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's extension: more variables for the chat template (`enable_thinking`, ...)."""


class TokenizeCompletionRequest(_Wire):
    """`POST /tokenize` with a prompt (vLLM's shape)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Wire):
    """`POST /tokenize` with chat messages (vLLM's shape)."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    """As in a chat completion."""
    chat_template_kwargs: dict[str, Any] | None = None
    """As in a chat completion."""
    return_token_strs: bool | None = False
    tools: list[Tool] | None = None
    """Rendered by the chat template, as in a chat completion."""


class DetokenizeRequest(_Wire):
    """`POST /detokenize` (vLLM's shape)."""

    model: str | None = None
    tokens: list[int]


def finish_name(reason: FinishReason | None) -> str | None:
    return None if reason is None else _FINISH_NAMES[reason]


def usage_body(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


class Formatter:
    """Builds the bodies of one response (chat or plain completion)."""

    def __init__(self, *, chat: bool, response_id: str, created: int, model: str) -> None:
        self.chat = chat
        self.response_id = response_id
        self._head: dict[str, Any] = {"id": response_id, "created": created, "model": model}
        self._delta_parts: dict[bool, tuple[bytes, bytes]] = {}
        self.logprobs: LogprobsFormatter | None = None
        """Set when the request asked for log probabilities (`with_logprobs`)."""
        self._sent_chars = 0
        self.token_ids = False
        """The answer's token ids go on every choice (vLLM's `return_token_ids`)."""
        self._prompt_ids: list[int] | None = None
        """The prompt's token ids, until a body has carried them."""
        self.prompt: list[int] | None = None
        """The prompt's token ids, when the answer shows the prompt's log probabilities
        (`with_prompt_logprobs`)."""
        self.prompt_in_logprobs = False
        """Completions' `echo` with `logprobs`: the prompt's tokens open the `logprobs`."""
        self._prompt_lps: LogprobsFormatter | None = None
        self.prompt_field = False
        """The answer carries vLLM's `prompt_logprobs` field."""

    def with_prompt_logprobs(
        self,
        prompt_token_ids: Sequence[int],
        tokenizer: Any,
        *,
        echoed: bool,
        field: bool,
        as_ids: bool,
    ) -> None:
        """Show the prompt's log probabilities: as `prompt_logprobs` (vLLM's field; on the
        choice for completions, at the top for chat), or with `echoed` (completions' `echo`
        with `logprobs`) at the head of `logprobs` (`with_logprobs` first); `field`: also as
        `prompt_logprobs`."""
        self.prompt = list(prompt_token_ids)
        self.prompt_in_logprobs = echoed
        self.prompt_field = field
        self._prompt_lps = LogprobsFormatter(tokenizer, chat=self.chat, top=0, as_ids=as_ids)

    def with_token_ids(self, prompt_token_ids: Sequence[int]) -> None:
        """Put the prompt's token ids on the first body (on its choice for completions, at its
        top for chat, as vLLM) and each chunk's token ids on its choice."""
        self.token_ids = True
        self._prompt_ids = list(prompt_token_ids)

    def _take_prompt_ids(self, body: dict[str, Any], choice: dict[str, Any]) -> None:
        if self._prompt_ids is not None:
            (body if self.chat else choice)["prompt_token_ids"] = self._prompt_ids
            self._prompt_ids = None

    def with_logprobs(self, top: int | None, tokenizer: Any, *, as_ids: bool = False) -> None:
        """Put log probabilities on every choice (`top`: None, none were asked for; `as_ids`:
        tokens named `token_id:N`)."""
        if top is not None:
            self.logprobs = LogprobsFormatter(tokenizer, chat=self.chat, top=top, as_ids=as_ids)

    def logprobs_of(self, chunk: TextChunk, *, stream: bool) -> dict[str, Any] | None:
        """The `logprobs` of a chunk's tokens (None when none were asked for)."""
        if self.logprobs is None:
            return None
        if self.prompt_in_logprobs and self.prompt is not None and not stream:
            self._sent_chars += len(chunk.text)
            return self.logprobs.echoed(
                self.prompt, chunk.prompt_logprobs, chunk.token_ids, chunk.logprobs
            )
        start = self._sent_chars if stream else None
        self._sent_chars += len(chunk.text)
        return self.logprobs.body(chunk.token_ids, chunk.logprobs, start)

    def delta_event(self, text: str, *, with_usage: bool) -> bytes:
        """The SSE event of a mid-stream chunk (no finish reason), as bytes.

        The hot path of a stream: the bytes around the text are built once per response and
        only the text is encoded per event; the event equals `sse(self.chunk(text, None, ...))`.
        """
        parts = self._delta_parts.get(with_usage)
        if parts is None:
            marker = "\ue000"
            body = self.chunk(marker, None, with_usage=with_usage)
            head, _, tail = orjson.dumps(body).partition(orjson.dumps(marker))
            parts = self._delta_parts[with_usage] = (b"data: " + head, tail + b"\n\n")
        return parts[0] + orjson.dumps(text) + parts[1]

    def _choice(
        self,
        text: str,
        reason: FinishReason | None,
        *,
        stream: bool,
        logprobs: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        finish: str | None = None,
        stop_reason: str | int | None = None,
        token_ids: Sequence[int] = (),
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": logprobs,
            "finish_reason": finish or finish_name(reason),
        }
        if reason is not None:  # vLLM's extension: what stopped it (a stop string or token id)
            choice["stop_reason"] = stop_reason
        if self.token_ids:
            choice["token_ids"] = list(token_ids)
        if not self.chat:
            choice["text"] = text
        elif stream:
            choice["delta"] = body if body is not None else ({"content": text} if text else {})
        else:
            choice["message"] = body if body is not None else {"role": "assistant", "content": text}
        return choice

    def _object(self, *, stream: bool) -> str:
        if self.chat:
            return "chat.completion.chunk" if stream else "chat.completion"
        return "text_completion"

    def response(
        self,
        text: str,
        reason: FinishReason | None,
        usage: Usage,
        logprobs: dict[str, Any] | None = None,
        *,
        message: dict[str, Any] | None = None,
        finish: str | None = None,
        stop_reason: str | int | None = None,
        token_ids: Sequence[int] = (),
        prompt_logprobs: Sequence[TokenLogprobs | None] = (),
    ) -> dict[str, Any]:
        """The whole non-streamed response (`message`, `finish`: a chat message and finish
        reason other than the text's, e.g. with tool calls; `stop_reason`: vLLM's;
        `token_ids`: the answer's, shown with `with_token_ids`)."""
        choice = self._choice(
            text,
            reason,
            stream=False,
            logprobs=logprobs,
            body=message,
            finish=finish,
            stop_reason=stop_reason,
            token_ids=token_ids,
        )
        out = {
            **self._head,
            "object": self._object(stream=False),
            "choices": [choice],
            "usage": usage_body(usage),
        }
        self._take_prompt_ids(out, choice)
        if self._prompt_lps is not None and self.prompt is not None and self.prompt_field:
            (out if self.chat else choice)["prompt_logprobs"] = self._prompt_lps.prompt_body(
                self.prompt, prompt_logprobs
            )
        return out

    def role_chunk(self, *, with_usage: bool, usage: Usage | None = None) -> dict[str, Any]:
        """The first chat chunk, naming the role (as OpenAI sends it)."""
        body = self.chunk("", None, with_usage=with_usage, usage=usage)
        body["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        return body

    def chunk(
        self,
        text: str,
        reason: FinishReason | None,
        *,
        with_usage: bool,
        usage: Usage | None = None,
        logprobs: dict[str, Any] | None = None,
        delta: dict[str, Any] | None = None,
        finish: str | None = None,
        stop_reason: str | int | None = None,
        token_ids: Sequence[int] = (),
    ) -> dict[str, Any]:
        """A streamed chunk (`delta`, `finish`: a chat delta and finish reason other than the
        text's, e.g. with tool calls; `stop_reason`: vLLM's, on the last one; `token_ids`: the
        chunk's, shown with `with_token_ids`)."""
        choice = self._choice(
            text,
            reason,
            stream=True,
            logprobs=logprobs,
            body=delta,
            finish=finish,
            stop_reason=stop_reason,
            token_ids=token_ids,
        )
        body: dict[str, Any] = {
            **self._head,
            "object": self._object(stream=True),
            "choices": [choice],
        }
        if with_usage:
            body["usage"] = None if usage is None else usage_body(usage)
        self._take_prompt_ids(body, choice)
        return body

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {
            **self._head,
            "object": self._object(stream=True),
            "choices": [],
            "usage": usage_body(usage),
        }
