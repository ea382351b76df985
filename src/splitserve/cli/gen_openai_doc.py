"""`splitserve gen openai-doc`: docs/openai-api.md from the request models and their status table.

Every endpoint and every request field, with what it does per engine, rendered from
`router.openai_models` (fields, types, docstrings) and `router.openai_fields` (status, notes), so
the page cannot drift from what the router does: `--check` fails when the committed page differs
(`make gen-check`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pydantic

from splitserve.router import openai_fields as fields
from splitserve.router import openai_models as wire

DEST = Path("docs/openai-api.md")

ENDPOINTS = (
    ("POST", "/v1/completions", "A text completion (whole, or streamed as server-sent events)."),
    ("POST", "/v1/chat/completions", "A chat completion (whole, or streamed)."),
    ("GET", "/v1/models", "The served model, as vLLM's card: `root`, `max_model_len`, ..."),
    ("GET", "/v1/models/{model}", "The served model's card; another name is a 404."),
    ("POST", "/tokenize", "Token ids of a prompt or of chat messages (vLLM's shape)."),
    ("POST", "/detokenize", "Text of token ids (vLLM's shape)."),
    ("GET", "/version", "The router's version."),
    ("GET, POST", "/ping", "200 while the process is up (vLLM's / SageMaker's check)."),
    ("GET", "/health", "200 while the process is up."),
    ("GET", "/ready", "200 while a decode-capable worker accepts work, else 503."),
    ("GET", "/metrics", "The router's Prometheus metrics (docs/metrics.md)."),
    ("GET", "/openapi.json", "The OpenAPI description of the request bodies."),
)

TOOLS_SECTION = (
    "## Tool calling",
    "",
    "As vLLM's OpenAI server, on the vLLM engine (the simulated engine refuses `tools`,",
    "`tool_choice` other than `none`, `parallel_tool_calls` and tool-call history: 400",
    "naming the engine):",
    "",
    "- `tools` are rendered by the model's chat template (passed as `tools=`, as vLLM and",
    "  transformers do); a template that never reads `tools` is a 400, since the tools would",
    "  not reach the model. The history's assistant `tool_calls` (their `arguments` parsed",
    "  from JSON, as vLLM passes them) and `tool` messages' `tool_call_id` reach the template",
    "  too. `POST /tokenize` with `messages` takes `tools` as well.",
    "- `tool_choice: auto` (the default when `tools` are given) reads calls out of the answer",
    "  with the router's tool-call parser, chosen like vLLM's `--tool-call-parser`: the router",
    "  setting `edge.tool_call_parser` (`router.yaml`, or `splitserve router serve --edge",
    "  tool_call_parser=hermes`). An unknown name stops the router at start-up. Without a",
    "  parser, `auto` is a 400 (vLLM refuses it without `--enable-auto-tool-choice`).",
    '  Parsers: `hermes` (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`:',
    "  Hermes 2 Pro, Qwen 2 / 2.5 / 3), our own code following vLLM's `Hermes2ProToolParser`",
    "  (tests/contract/vllm/test_tool_parser_parity.py: the same content, calls and streamed",
    "  deltas as vLLM's on the same text); `llama3_json` (Llama 3.x: JSON objects",
    '  `{"name": ..., "arguments": {...}}` (or `"parameters"`) separated by `;`, optionally',
    "  after `<|python_tag|>`; content null when calls are found) and `pythonic` (Llama 3.2 / 4:",
    '  a Python list of calls with literal keyword arguments, `[f(city="Köln"), g()]`, read',
    "  with `ast`, never evaluated), our own code following vLLM's `Llama3JsonToolParser` and",
    "  `PythonicToolParser` (tests/contract/vllm/test_tool_parser_parity_llama.py: the same",
    "  content and calls as vLLM's, whole and streamed, on the same text). With these two, as",
    "  in vLLM, a streamed answer is read for calls only when it begins with `{` (or",
    "  `<|python_tag|>`) or `[`; their streamed arguments are re-serialized JSON (`json.dumps`",
    "  spacing), and `pythonic` sends each call's arguments in one piece when the call closes.",
    "  An answer that begins like calls but holds none is sent as content at its end (vLLM",
    "  sends nothing).",
    "- Calls found come back as `choices[].message.tool_calls` (`id`, `type: function`,",
    "  `function.name`, `function.arguments` as a JSON string) with the text before the first",
    "  call as `content` (null when empty) and finish reason `tool_calls`. Streamed, as vLLM:",
    "  `delta.content` up to the first call, then per call a delta with `index`, `id`, `type`",
    "  and `function.name`, then deltas with pieces of `function.arguments` (the model's raw",
    "  argument text); the last chunk has finish reason `tool_calls`. Markup that does not",
    "  parse leaves the answer as plain content (non-streamed), as vLLM does.",
    "- `tool_choice: none` renders the tools and reads no calls. `parallel_tool_calls: false`",
    "  returns the first call only.",
    '- `tool_choice: required` and a named function (`{"type": "function", "function":',
    "  {\"name\": ...}}`) force calls with guided decoding, as vLLM's server does: the request's",
    "  structured outputs become a JSON schema, a named function's `parameters` (any object",
    '  when it has none) or, for `required`, an array of at least one `{"name", "parameters"}`',
    "  object, any of the tools (at most one with `parallel_tool_calls: false`; the tools'",
    "  `$defs` moved to the array). The engine applies it from the first token (in P/D the",
    "  prefill worker samples token 1 under it; see Structured outputs), and the router reads",
    "  the JSON answer into calls: no tool-call parser is needed (vLLM 0.32 forces only with a",
    "  `--tool-call-parser` set). A named function's whole answer is its call's `arguments`",
    '  (content `""`, finish reason the answer\'s own, `stop`, as vLLM and OpenAI); streamed,',
    "  the first delta carries `index` 0, `id`, `type`, `function.name` and the first argument",
    "  text, later ones more argument text. `required`: each array element is a call,",
    '  `arguments` its `parameters` as JSON (content `""`, finish reason `tool_calls` when the',
    "  answer stopped); streamed, a call is announced with the arguments so far once its name is",
    "  complete and its `parameters` began (vLLM's delta shapes, checked against vLLM's own",
    "  functions in tests/contract/vllm/test_tool_parser_parity.py). An answer cut by",
    "  `max_tokens` is not valid JSON: no calls (`required`) or unparsable `arguments` (named),",
    "  finish reason `length`, as vLLM. Forcing together with `response_format` or",
    "  `structured_outputs` is a 400 naming that field (vLLM refuses a named function with",
    "  them and drops them silently for `required`); a name not among the `tools` is a 400.",
    "- `tools[].function.strict: true` is honoured with `required` and named choices (the",
    "  grammar is the tool's schema); with `auto` the model's own calls are not guided, so it",
    "  is a 400 naming the field.",
    "- Special tokens: the router decodes with special tokens skipped (vLLM's `hermes` parser",
    "  turns skipping off). For a model whose `<tool_call>` is an added token marked special,",
    "  the markup would be lost and no call found; Qwen 2.5's is an added token not marked",
    "  special, so its calls are read.",
    "",
)

_STATUS = {"acts": "acts", "refused": "**400**", "accepted": "accepted, no effect"}


def _type(annotation: Any) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = re.sub(r"\b(typing|splitserve\.router\.openai_models)\.", "", text)
    return text.replace("NoneType", "null").replace("|", "\\|")


def _rows(model: type[pydantic.BaseModel], prefix: str = "") -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for name, info in model.model_fields.items():
        doc = " ".join((info.description or "").split())
        out.append((prefix + name, _type(info.annotation), doc))
        for sub in fields._nested(info.annotation):
            out += _rows(sub, f"{prefix}{name}.")
    unique: dict[str, tuple[str, str, str]] = {}
    for row in out:
        unique.setdefault(row[0], row)
    return list(unique.values())


def render() -> str:
    lines = [
        "<!-- Generated by `splitserve gen openai-doc` from src/splitserve/router/openai_models.py",
        "     and openai_fields.py. Do not edit: `make gen` rewrites it, `make gen-check` fails",
        "     on drift. -->",
        "# The OpenAI-compatible API",
        "",
        "The router serves OpenAI's completions API plus the routes that the tools of",
        "`vllm serve` users call. Every request field either **acts** or is **refused** with a",
        "400 that names the field and the engine; nothing is ignored silently. Fields the API",
        "does not know are a 400 too (`unknown_field`), unless the router setting",
        "`edge.allow_unknown_fields` is on (for clients that send vendor extras): then they are",
        "dropped. A 400's `param` (and the start of its message) is the field's path in the",
        "body as the client wrote it, e.g. `messages[0].content` or `tools[1].function.name`.",
        "",
        "Engines: **vllm** is splitserve's worker over vLLM; **sim** is the simulated engine,",
        "whose synthetic tokens depend only on the prompt, the seed and the position: it honours",
        "`max_tokens`, `seed`, `ignore_eos`, `min_tokens`, stop token ids and stop strings, and",
        "accepts the other sampler fields without effect (so harnesses run against it",
        "unchanged). It has no token distribution and follows no grammar, so it refuses",
        "`logprobs` / `top_logprobs`, `response_format` (other than text) and",
        "`structured_outputs` (400 naming the engine). It ends each answer as a model does,",
        "with the tokenizer's end-of-text token, at a length drawn per prompt and seed (the same",
        "on prefill and decode workers): lognormal around `splitserve up --sim-answer-tokens`",
        "(median 128 tokens, fitted to the bundled Azure conversation trace; 0: answers run to",
        "`max_tokens`). Harnesses that want exact output lengths send `ignore_eos`, as with vLLM.",
        "",
        "Defaults are vLLM's: without `max_tokens` a chat completion runs to end of text or the",
        "context limit (`max_model_len`), and so does a completion with `max_tokens: null`; the",
        "router setting `default_max_tokens` caps such requests (service level). A completion",
        "without `max_tokens` stops at 16 tokens (OpenAI's and vLLM's default). Unknown routes",
        "answer 404 with an OpenAI error body",
        "(`Invalid URL (GET /path)`); a known route asked with another method answers 405",
        "with the same body and an `Allow` header naming its methods. `HEAD` on a `GET` route",
        "answers as `GET` does, without the body. Request bodies are JSON,",
        "uncompressed: a `Content-Encoding` other than `identity` (`gzip`, `br`, ...) is a 415",
        "(`unsupported_content_encoding`) naming it, and so is a `Content-Type` other than",
        "`application/json` (parameters such as `; charset=utf-8` and `application/*+json` are",
        "fine) with `unsupported_media_type`, as vLLM's server refuses it: `curl -d` labels its",
        "body a form unless given `-H 'Content-Type: application/json'`. A request without a",
        "`Content-Type` is read as JSON.",
        "",
        "## Endpoints",
        "",
        "| Method | Path | What |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {m} | `{p}` | {what} |" for m, p, what in ENDPOINTS]
    titles = {
        wire.CompletionRequest: "`POST /v1/completions`",
        wire.ChatCompletionRequest: "`POST /v1/chat/completions`",
        wire.TokenizeCompletionRequest: "`POST /tokenize` (prompt)",
        wire.TokenizeChatRequest: "`POST /tokenize` (chat messages)",
        wire.DetokenizeRequest: "`POST /detokenize`",
    }
    for model, table in fields.TABLES.items():
        lines += [
            "",
            f"## {titles[model]}",
            "",
            "| Field | Type | vllm | sim | Notes |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, type_, doc in _rows(model):
            f = table[name]
            note = " ".join(x for x in (doc, f.note) if x)
            if f.refused_because:
                note = " ".join(x for x in (note, f"Refused: {f.refused_because}.") if x)
            note = note.replace("|", "\\|")
            lines.append(
                f"| `{name}` | `{type_}` | {_STATUS[f.vllm]} | {_STATUS[f.sim]} | {note} |"
            )
    lines += [
        "",
        "## Streaming",
        "",
        "`stream_options.include_usage` adds a last chunk with the usage of the whole request;",
        "with `continuous_usage_stats` too, every chunk carries the usage so far (vLLM's",
        "extension). A failure after the first chunk becomes an error event before",
        "`data: [DONE]`.",
        "",
        *TOOLS_SECTION,
        "## Log probabilities",
        "",
        "With the vLLM engine, `logprobs` (completions: 0-20) and `logprobs: true` with",
        "`top_logprobs` (chat: 0-20) come from vLLM's sampler (`SamplingParams.logprobs`) and",
        "are written exactly as vLLM's OpenAI server writes them: chat",
        "`choices[].logprobs.content[{token, logprob, bytes, top_logprobs}]` (`top_logprobs`",
        "lists the position's first k entries, the sampled token first); completions `tokens`,",
        "`token_logprobs`, `top_logprobs` (up to k + 1 entries) and `text_offset`. Token strings",
        "are the tokenizer's decoding of the one id, special tokens kept; log probabilities",
        "below -9999 are written as -9999.0. Streamed, each chunk carries its tokens' entries",
        "(tokens whose text the router still holds back for a possible stop string come in a",
        "chunk with empty text). In P/D the first token's entry comes from the prefill worker,",
        "which samples it, and the rest from the decode worker.",
        "",
        "## Structured outputs",
        "",
        "With the vLLM engine, `response_format` (`json_object`, `json_schema`) and",
        "`structured_outputs` (vLLM 0.32's constraint kinds `json`, `regex`, `choice`,",
        "`grammar`, `json_object`) become vLLM's `StructuredOutputsParams`: guided decoding by",
        "the backend the workers' vLLM picks (`auto`: xgrammar, falling back to guidance).",
        "`response_format` sets the constraint as in vLLM; exactly one constraint is allowed.",
        "Refused with a 400 naming the field: anything malformed, another kind",
        "(`structural_tag`), and the options `disable_any_whitespace`,",
        "`disable_additional_properties`, `whitespace_pattern` when set: vLLM 0.32 accepts them",
        "per request but its backends only read the engine's configuration, so set them for",
        "the workers with vLLM's engine argument (after `--`):",
        "",
        "```",
        "splitserve worker serve --engine vllm ... -- --structured-outputs-config \\",
        """    '{"backend": "xgrammar", "disable_any_whitespace": true}'""",
        "```",
        "",
        "A regex, schema or grammar that vLLM's backend rejects is a 400 too (the worker runs",
        "vLLM's own check before queueing the request).",
        "",
        "In P/D the constraint holds from the first token: the prefill worker samples it under",
        "the grammar, and the decode worker, which sees that token as the last of its prompt,",
        "advances its grammar past it before it samples token 2 (vLLM's `accept_tokens` on the",
        "request's matcher, before the first token mask is built). P/D answers equal aggregated",
        "ones token for token (greedy): tests/contract/vllm/test_vllm_router_e2e.py. When a",
        "decode worker fails mid-stream and another worker takes over (`Generate` with the",
        "tokens so far), the router tells it how many tokens were generated and its grammar",
        "accepts them before it samples.",
        "",
        "## P/D and the sampler",
        "",
        "With prefill and decode on different workers, the prefill worker samples the first",
        "token with the same sampler fields as the decode worker (tested token by token against",
        "aggregated serving in tests/contract/vllm/test_vllm_sampling.py). `min_tokens` counts",
        "the prefill's token. The decode worker hands vLLM the first token as the last prompt",
        "token (its KV is computed there) and counts it as output in vLLM's sampler, so presence",
        "and frequency penalties and multi-token `bad_words` see it as an aggregated run does",
        "(same test file). After a mid-stream takeover (`Generate` with the tokens so far) those",
        "tokens count as prompt for the penalties and `bad_words`: an approximation.",
        "",
    ]
    return "\n".join(lines)


@click.command("openai-doc")
@click.option("--check", is_flag=True, help="Fail if the committed page differs.")
@click.option("--dest", type=click.Path(path_type=Path), default=DEST, show_default=True)
def openai_doc(check: bool, dest: Path) -> None:
    """docs/openai-api.md from the request models (every endpoint and field, per engine)."""
    text = render()
    if check:
        if not dest.exists() or dest.read_text() != text:
            raise click.ClickException(f"{dest} drifted from the request models (run `make gen`)")
        click.echo(f"{dest} is up to date")
        return
    dest.write_text(text)
    click.echo(f"wrote {dest}")
