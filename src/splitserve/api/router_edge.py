"""The router's HTTP / gRPC edge limits: what one client may send and how long it may take.

Every limit answers with a clear OpenAI-style error naming it (413 for the body, 400 for prompt
and stop-string limits, 429 when the connection limit is reached, 408 when a client is too slow
sending its request) instead of tying the router up. The request deadline is
`DispatchSettings.request_timeout_s` (504 when it passes).
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

TOOL_CALL_PARSERS: Final = ("hermes", "llama3_json", "pythonic")
"""The tool-call parsers the router has (`splitserve.router.tool_parsers`)."""


class EdgeSettings(BaseModel):
    """Limits and timeouts of the router's client-facing edge (per router process)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
    )

    max_body_bytes: int = Field(8 << 20, ge=1024)
    """Largest HTTP request body; a larger one is refused with 413 before it is read in full."""
    max_prompt_chars: int | None = Field(None, ge=1)
    """Longest prompt, in characters (all chat message contents, 32 per message for its turn's
    markup, and tool definitions' JSON together), checked before tokenizing; a chat's message
    count is checked against it before its body is validated. None: 32 x `max_model_len` (no
    tokenizer packs 32 characters into every token, and every chat template gives a message a
    token of its own, so a longer prompt cannot fit the context anyway)."""
    max_stop_strings: int = Field(16, ge=0)
    """Most stop strings per request (OpenAI allows 4)."""
    max_stop_string_chars: int = Field(1024, ge=1)
    """Longest stop string, in characters."""
    max_connections: int = Field(4096, ge=1)
    """Open HTTP connections per router process; the next one gets a 429 and is closed."""
    header_timeout_s: float = Field(10.0, gt=0)
    """A request's line and headers must arrive within this time of its first byte (else 408)."""
    body_timeout_s: float = Field(60.0, gt=0)
    """A request's body must arrive within this time after its headers (else 408)."""
    idle_timeout_s: float = Field(30.0, gt=0)
    """A connection with no request in progress is closed after this long (keep-alive idle, and
    a new connection that sends nothing)."""
    inline_tokenize_max_chars: int = Field(2048, ge=0)
    """Prompts up to this many characters are tokenized on the event loop (cheaper than a thread
    hand-off); longer ones in a worker thread, so the loop keeps serving other clients."""
    tokenizer_threads: int = Field(2, ge=1)
    """Threads that tokenize long prompts (the tokenizer releases the GIL)."""
    drain_grace_s: float = Field(30.0, ge=0)
    """On SIGTERM: how long in-flight requests may run on before they are cut (with an error
    event on streams)."""

    allow_unknown_fields: bool = False
    """Request bodies with fields the API does not know are refused (400 naming the field).
    True: such fields are dropped instead (for clients that send vendor extras); known fields
    are still checked and still act or are refused."""

    tool_call_parser: str | None = None
    """How tool calls are read from the model's text, as vLLM's `--tool-call-parser`: `hermes`
    (`<tool_call>{json}</tool_call>`: Hermes 2 Pro, Qwen 2 / 2.5 / 3), `llama3_json` (JSON
    objects `{"name", "arguments"}` separated by `;`: Llama 3.x), `pythonic` (a Python list of
    calls `[f(x=1)]`: Llama 3.2 / 4). None: requests whose `tool_choice` is `auto` (the default
    when `tools` are given) are refused with a 400;
    `tool_choice: none` still renders the tools into the prompt. See docs/openai-api.md."""

    @field_validator("tool_call_parser")
    @classmethod
    def _known_parser(cls, value: str | None) -> str | None:
        if value is not None and value not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"unknown tool-call parser {value!r} (known: {', '.join(TOOL_CALL_PARSERS)})"
            )
        return value

    def prompt_chars_limit(self, max_model_len: int) -> int:
        return self.max_prompt_chars or 32 * max_model_len
