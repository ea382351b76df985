"""Text in, text out: validation, detokenization and stop strings around one dispatch.

Shared by the OpenAI HTTP face and the gRPC face, so both count, cut and stream the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from splitserve.api.router_edge import EdgeSettings
from splitserve.core.clock import Clock
from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.request import FinishReason, Request, SamplingSpec, TokenLogprobs
from splitserve.policy.admission import SloOverrides, UnknownSloClass
from splitserve.policy.admission.classes import BadOverride
from splitserve.router.detokenizer import INITIAL_CONTEXT_TOKENS, IncrementalDetokenizer
from splitserve.router.dispatch import Chunk, Dispatcher
from splitserve.router.errors import InvalidRequest, RouterShuttingDown
from splitserve.router.fast_lane import FastLane, enabled_from_env
from splitserve.router.request_log import RequestLog
from splitserve.router.request_stats import outcome_of
from splitserve.router.stops import StopStrings
from splitserve.router.tokenizer import (
    MESSAGE_CHARS,
    MessageLike,
    TextTokenizer,
    Tokenizing,
    chat_chars,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SamplerKnobs:
    """Sampling fields beyond temperature / top_p / seed, as `SamplingSpec` holds them."""

    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    bad_words: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    """Added to the tokenizer's end-of-text tokens (and kept with `ignore_eos`)."""


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """Sampling and stopping as a client asked for them (None: the router's default)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    sampler: SamplerKnobs | None = None
    """The sampler's other fields (top_k, penalties, ...); None: the engine's defaults."""
    slo_class: str = ""
    """The `x-slo-class` header; empty: the service's default class."""
    slo_overrides: tuple[tuple[str, str], ...] = ()
    """(`x-slo-ttft-ms` / `x-slo-tpot-ms`, milliseconds) as the client sent them."""
    logprobs: int | None = None
    """None: no log probabilities; k: each token's and the k most likely (`SamplingSpec`)."""
    structured_outputs: str = ""
    """Guided decoding (vLLM's `StructuredOutputsParams` as JSON); empty: none."""
    prompt_logprobs: int | None = None
    """None: none; k: each prompt token's log probability and the k most likely
    (`SamplingSpec.prompt_logprobs`)."""


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A piece of the completion. The last one has `finish_reason`, `usage` and `path` set."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    path: str = ""
    logprobs: tuple[TokenLogprobs, ...] = ()
    """With `GenerationParams.logprobs`: one per token of `token_ids`."""
    stop_reason: str | int | None = None
    """On the last chunk, as vLLM's `stop_reason`: the stop string that ended the answer, or
    the id of the `stop_token_ids` token that did; None for anything else (a length cut, an
    end-of-text token)."""
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()
    """On the last chunk, with `SamplingSpec.prompt_logprobs`: one per prompt token (None for
    the first), as the engine that ran the prompt gave them."""


class _Running:
    """One stream in progress: the task iterating it (it changes: a streamed HTTP answer's first
    chunk is read by the handler, the rest by Starlette's body task) and whether it was cut."""

    __slots__ = ("cut", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task[object] | None = None
        self.cut = False


def _ms(value: str | None) -> float | None:
    return None if value is None else float(value) / 1000


class Generator:
    """Builds validated requests and streams their text."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        tokenizer: TextTokenizer,
        *,
        clock: Clock,
        max_model_len: int,
        default_max_tokens: int | None,
        request_log: RequestLog | None = None,
        edge: EdgeSettings | None = None,
        fast_lane: bool | None = None,
    ) -> None:
        """`fast_lane`: let plain mid-stream chunks be handled in the worker link's reader
        (`router.fast_lane`); None: `SPLITSERVE_ROUTER_FAST_LANE` (default on)."""
        self.fast_lane = enabled_from_env() if fast_lane is None else fast_lane
        self.request_log = request_log
        """When set, each request is written to it when it ends (`router.request_log`)."""
        self.dispatcher = dispatcher
        self.tokenizer = tokenizer
        self.clock = clock
        self.max_model_len = max_model_len
        self.default_max_tokens = default_max_tokens
        self.edge = edge or EdgeSettings()
        self.max_prompt_chars = self.edge.prompt_chars_limit(max_model_len)
        self.tokenizing = Tokenizing(
            tokenizer,
            inline_max_chars=self.edge.inline_tokenize_max_chars,
            threads=self.edge.tokenizer_threads,
        )
        self._running: set[_Running] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def num_running(self) -> int:
        return len(self._running)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Until no stream is running (True) or `timeout_s` passed (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def cut_all(self) -> int:
        """End every running stream now with `RouterShuttingDown`; returns how many."""
        cut = 0
        for running in list(self._running):
            if running.task is not None and not running.task.done() and not running.cut:
                running.cut = True
                running.task.cancel()
                cut += 1
        return cut

    def check_stops(self, stops: Sequence[str]) -> tuple[str, ...]:
        """`stops` within the edge limits.

        Raises:
            InvalidRequest: too many stop strings, one too long, or an empty one (it would match
                before the first character; vLLM refuses it too).
        """
        edge = self.edge
        if any(not stop for stop in stops):
            raise InvalidRequest("stop cannot contain an empty string", "stop")
        if len(stops) > edge.max_stop_strings:
            raise InvalidRequest(
                f"at most {edge.max_stop_strings} stop strings are allowed, got {len(stops)} "
                "(edge.max_stop_strings)",
                "stop",
            )
        for stop in stops:
            if len(stop) > edge.max_stop_string_chars:
                raise InvalidRequest(
                    f"a stop string may have at most {edge.max_stop_string_chars} characters, "
                    f"got {len(stop)} (edge.max_stop_string_chars)",
                    "stop",
                )
        return tuple(stops)

    def _check_chars(self, num_chars: int, param: str) -> None:
        if num_chars > self.max_prompt_chars:
            what = (
                f"the messages count {num_chars} characters (contents, {MESSAGE_CHARS} a "
                "message for its markup, tool definitions)"
                if param == "messages"
                else f"the prompt has {num_chars} characters"
            )
            raise InvalidRequest(
                f"{what}, more than the {self.max_prompt_chars} "
                "this router tokenizes (edge.max_prompt_chars); it cannot fit the model's "
                f"context of {self.max_model_len} tokens",
                param,
            )

    async def encode(
        self, text: str, param: str = "prompt", *, add_special_tokens: bool = True
    ) -> list[int]:
        """Tokenize a prompt (off the event loop when long), after the character limit
        (`add_special_tokens=False`: without the start token the tokenizer adds)."""
        self._check_chars(len(text), param)
        return await self.tokenizing.encode(text, add_special_tokens=add_special_tokens)

    def count_refused(self, slo_class: str | None) -> None:
        """Count a request refused before dispatch (outcome `rejected`, path `none`), labelled
        with the class it asked for: a declared class, or `other`. HTTP and gRPC alike."""
        table = self.dispatcher.slo.table
        label = table.label(slo_class or table.default.name)
        self.dispatcher.metrics.requests.labels("rejected", "none", label).inc()

    def check_message_count(self, body: Mapping[str, Any]) -> None:
        """A request body's `messages`, counted before it is validated: more than can fit the
        model's context (`MESSAGE_CHARS` each against `edge.max_prompt_chars`) is a 400 at once,
        so a body of many tiny messages does not hold the event loop in validation and the chat
        template.

        Raises:
            InvalidRequest: too many messages.
        """
        messages = body.get("messages")
        if isinstance(messages, list) and len(messages) * MESSAGE_CHARS > self.max_prompt_chars:
            raise InvalidRequest(
                f"{len(messages)} messages cannot fit: each counts at least {MESSAGE_CHARS} "
                f"characters for its markup against the {self.max_prompt_chars} this router "
                f"tokenizes (edge.max_prompt_chars; the model's context is {self.max_model_len} "
                "tokens)",
                "messages",
            )

    async def encode_chat(
        self,
        messages: Sequence[MessageLike],
        tools: Sequence[MessageLike] | None = None,
        **options: Any,
    ) -> list[int]:
        """Render and tokenize chat messages (and tool definitions), after the character limit.
        `options`: `TextTokenizer.apply_chat_template`'s.

        Raises:
            InvalidRequest: too long, or the chat template rejected the messages.
        """
        self._check_chars(chat_chars(messages, tools), "messages")
        try:
            return await self.tokenizing.chat(messages, tools, **options)
        except ValueError as err:
            raise InvalidRequest(str(err), "messages") from err

    def close(self) -> None:
        self.tokenizing.close()

    def build_request(
        self, request_id: str, prompt_token_ids: Sequence[int], params: GenerationParams
    ) -> Request:
        """A `Request` for the dispatcher.

        Raises:
            InvalidRequest: empty prompt, unknown token ids, too long for `max_model_len`, or
                sampling values out of range.
        """
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise InvalidRequest("the prompt must not be empty", "prompt")
        vocab = self.tokenizer.vocab_size
        high = max(prompt_token_ids)  # max / min: C loops, not a genexpr
        bad = high if high >= vocab else min(prompt_token_ids)
        if not 0 <= bad < vocab:  # named, as vLLM names it ("Token id N is out of vocabulary")
            raise InvalidRequest(
                f"prompt: token id {bad} is outside the vocabulary [0, {vocab})", "prompt"
            )
        max_tokens = params.max_tokens
        room = self.max_model_len - num_prompt
        if max_tokens is None:  # like vLLM: until end of text or the context limit
            cap = self.default_max_tokens
            max_tokens = room if cap is None else min(cap, room)
        if max_tokens < 1 or num_prompt + max_tokens > self.max_model_len:
            raise InvalidRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {num_prompt + max(max_tokens, 1)} tokens ({num_prompt} in the "
                f"prompt, {max(max_tokens, 1)} for the completion). Please reduce the length of "
                "the prompt or the completion.",
                "max_tokens" if room > 0 else "prompt",
            )
        knobs = params.sampler or SamplerKnobs()
        self._check_token_ids(knobs, vocab)
        eos = () if params.ignore_eos else self.tokenizer.stop_token_ids
        try:
            sampling = SamplingSpec(
                max_tokens=max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                seed=params.seed,
                stop_token_ids=tuple(dict.fromkeys((*eos, *knobs.stop_token_ids))),
                ignore_eos=params.ignore_eos,
                top_k=knobs.top_k,
                min_p=knobs.min_p,
                presence_penalty=knobs.presence_penalty,
                frequency_penalty=knobs.frequency_penalty,
                repetition_penalty=knobs.repetition_penalty,
                logit_bias=knobs.logit_bias,
                min_tokens=knobs.min_tokens,
                bad_words=knobs.bad_words,
                allowed_token_ids=knobs.allowed_token_ids,
                logprobs=params.logprobs,
                structured_outputs=params.structured_outputs,
                prompt_logprobs=params.prompt_logprobs,
            )
        except ValueError as err:
            raise InvalidRequest(str(err)) from err
        slo_class = self._slo_class(params)
        return Request(
            id=RequestId(request_id),
            prompt_token_ids=tuple(prompt_token_ids),
            sampling=sampling,
            arrival_s=self.clock.now_s(),
            slo_class=SloClassName(slo_class),
            tags=params.slo_overrides,
        )

    @staticmethod
    def _check_token_ids(knobs: SamplerKnobs, vocab: int) -> None:
        """Token ids the sampler gets must be the model's (else a 400 naming the field)."""
        named = (
            ("logit_bias", [t for t, _ in knobs.logit_bias]),
            ("allowed_token_ids", knobs.allowed_token_ids),
            ("stop_token_ids", knobs.stop_token_ids),
        )
        for field, ids in named:
            if any(not 0 <= t < vocab for t in ids):
                raise InvalidRequest(f"{field}: token ids must be in [0, {vocab})", field)

    def _slo_class(self, params: GenerationParams) -> str:
        """The request's SLO class (the default when unnamed), its overrides checked."""
        slo = self.dispatcher.slo
        overrides = dict(params.slo_overrides)
        try:
            cls = slo.check(
                params.slo_class,
                SloOverrides(
                    ttft_s=_ms(overrides.get("x-slo-ttft-ms")),
                    tpot_s=_ms(overrides.get("x-slo-tpot-ms")),
                ),
            )
        except BadOverride as err:
            raise InvalidRequest(str(err), err.param) from err
        except UnknownSloClass as err:
            raise InvalidRequest(f"x-slo-class: {err}", "x-slo-class") from err
        return cls.name

    def lane(self) -> FastLane | None:
        """A fast lane for one streamed request (None when the lane is off)."""
        return FastLane() if self.fast_lane else None

    async def stream(
        self,
        request: Request,
        stop: Sequence[str] = (),
        lane: FastLane | None = None,
        *,
        include_stop: bool = False,
        skip_special: bool = True,
    ) -> AsyncGenerator[TextChunk, None]:
        """Run `request`; yield text as it becomes final. Close early to cancel the request.

        `lane`: mid-stream chunks may be handled in the worker link's reader (`fast_lane`);
        not with stop strings, which are matched here. `include_stop`: the text ends with the
        stop string or stop token that ended it (vLLM's `include_stop_str_in_output`);
        `skip_special`: special tokens' text is left out (vLLM's `skip_special_tokens`).

        Raises whatever `Dispatch.chunks()` raises (placement, rejection, worker failures).
        """
        dispatch = self.dispatcher.open(request)
        detok = IncrementalDetokenizer(
            self.tokenizer,
            request.prompt_token_ids[-INITIAL_CONTEXT_TOKENS:],
            skip_special_tokens=skip_special,
        )
        stops = StopStrings(stop, include=include_stop) if stop else None
        stop_ids = frozenset(request.sampling.stop_token_ids)
        # The client's stop_token_ids (vLLM's `stop_reason` names them; end of text it does not)
        ended_by_id = stop_ids
        if not request.sampling.ignore_eos:
            ended_by_id = stop_ids - frozenset(self.tokenizer.stop_token_ids)
        # Output tokens whose text cannot end a stop string yet (`min_tokens`, as vLLM).
        guard_left = request.sampling.min_tokens if stops is not None else 0
        if lane is not None and stops is None:
            # Stop strings need this task (the cut, `dispatch.stop()`): no lane with them.
            lane.detok = detok
            dispatch.lane = lane
        final: TextChunk | None = None
        first_token_s: float | None = None
        prompt_lp: tuple[TokenLogprobs | None, ...] = ()
        running = _Running()
        self._running.add(running)
        self._idle.clear()
        try:
            # `dispatch.chunks()` read here directly (no generator in between: one layer fewer
            # per chunk); a cut (`cut_all`) turns into `RouterShuttingDown`.
            async with contextlib.aclosing(dispatch.chunks()) as chunks:
                while True:
                    running.task = asyncio.current_task()
                    try:
                        chunk = await anext(chunks, None)
                    except asyncio.CancelledError:
                        task = running.task
                        if not running.cut or task is None:
                            raise
                        task.uncancel()
                        raise RouterShuttingDown(
                            "the router is shutting down and its drain grace period is over"
                        ) from None
                    if chunk is None:
                        break
                    if first_token_s is None and chunk.token_ids:
                        first_token_s = self.clock.now_s()
                        # the prompt's log probabilities come with the first token (a later
                        # run over a longer prompt, a takeover, is not the client's prompt)
                        prompt_lp = chunk.prompt_logprobs
                    reason = chunk.finish_reason
                    ids = chunk.token_ids
                    by_token = reason is FinishReason.STOP and bool(ids) and ids[-1] in stop_ids
                    if by_token and not include_stop:
                        # As vLLM's detokenizer (stop-terminated, `include_stop_str_in_output`
                        # off): the stop token's text is left out; it counts in the usage.
                        ids = ids[:-1]
                    if stops is None:
                        text = detok.push(ids)
                        if reason is not None:
                            text += detok.flush()
                    else:
                        # token by token, so that the answer ends at the token that completed
                        # a stop string even when several came in one chunk
                        text = ""
                        used = len(ids)
                        for k in range(len(ids)):
                            piece = detok.push(ids[k : k + 1])
                            # the first `min_tokens` tokens' text cannot end a match
                            text += stops.feed(piece, len(piece) if guard_left > k else 0)
                            if stops.hit is not None:
                                used = k + 1
                                break
                        guard_left = max(0, guard_left - used)
                        if stops.hit is None and reason is not None:
                            text += stops.feed(detok.flush())
                            text += stops.flush()  # may still find a stop string in the tail
                        if stops.hit is not None:
                            # Ends here; leaving the `async with` closes the dispatch,
                            # cancelling workers.
                            unused = len(chunk.token_ids) - used
                            dispatch.stop(unused)
                            if unused:
                                ids = ids[:used]
                                chunk = Chunk(
                                    chunk.token_ids[:used],
                                    chunk.finish_reason,
                                    chunk.logprobs[:used],
                                )
                            reason = FinishReason.STOP
                            log.debug("request %s hit stop string %r", request.id, stops.hit)
                    if reason is None:
                        if text or chunk.token_ids:
                            yield TextChunk(text, chunk.token_ids, logprobs=chunk.logprobs)
                        continue
                    usage = Usage(request.num_prompt_tokens, dispatch.num_output_tokens)
                    path = dispatch.path.value if dispatch.path is not None else ""
                    why: str | int | None = None
                    if stops is not None and stops.hit is not None:
                        why = stops.hit
                    elif by_token and reason is FinishReason.STOP:
                        last = chunk.token_ids[-1]  # a stop token (its text left out or not)
                        why = last if last in ended_by_id else None
                    final = TextChunk(
                        text, chunk.token_ids, reason, usage, path, chunk.logprobs, why, prompt_lp
                    )
                    break
        except BaseException as err:
            if self.request_log is not None:  # its load until now is in a replay too
                self.request_log.record(
                    request.id, request.arrival_s, request.num_prompt_tokens,
                    dispatch.num_output_tokens, first_token_s, self.clock.now_s(),
                    dispatch.path.value if dispatch.path is not None else "",
                    outcome_of(err, ended_on_purpose=False),
                )  # fmt: skip
            raise
        finally:
            self._running.discard(running)
            if not self._running:
                self._idle.set()
        if final is not None:
            if self.request_log is not None:
                self.request_log.record(
                    request.id, request.arrival_s, request.num_prompt_tokens,
                    dispatch.num_output_tokens, first_token_s, self.clock.now_s(), final.path, "ok",
                )  # fmt: skip
            yield final
