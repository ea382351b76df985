"""Per-token work in the worker link's read callback (issue 17, the eighth pass).

On the slow path a token travels: the `Multiplex` reader pushes the worker's `TokenChunk` on the
sub-request's queue and wakes the request's task, which resumes its chain (`MuxStream.read` ->
`StallTimer.read` -> `Dispatch._decode_any` -> `Dispatch.chunks` -> `Generator.stream` ->
`stream_body` -> `EdgeSseResponse`) to detokenize the chunk, build its SSE event and write it: a
task wake and a resumption of every level per token.

A `FastLane` lets the reader do that work itself, for a chunk that needs nothing else: the
request's task does not wake. Each level of the chain fills in its part of the lane while it is
waiting for the next chunk, and takes it back when it stops waiting:

- `Dispatch._decode_any` (`attach`): the sub-request it reads, and `on_tokens`, its own per-chunk
  bookkeeping (the tokens kept for a take-over, the stall timer restarted, `Dispatch._account`:
  metrics, the per-token SLO / TPOT times, the ledger's progress);
- `Generator.stream`: the detokenizer, when the request has no stop strings (stop strings are
  matched, and the stream cut, in the request's task: such a request never takes the lane);
- `stream_body`: the formatter, when a mid-stream chunk is a plain text delta (no log
  probabilities, no tool-call parsing, no continuous usage: those requests never take the lane);
- `EdgeSseResponse` (`out`): the connection, only while nothing it holds is pending (so bytes
  leave in order) and only for the router's own HTTP connection.

The reader offers a chunk only when the request's task is parked in `MuxStream.read` with
nothing queued (so every level is at the same point as for the slow path's next chunk, and
chunks stay in order). `offer` takes it when the lane is complete, the chunk is a mid-stream one
(no finish reason, no log probabilities, at least one token) and the transport is writable (not
paused by flow control, client not gone); else the chunk is queued and the task woken as
before. So the task still wakes for the first token (it is read before the response exists),
the last chunk (usage, `[DONE]`, request stats / log / ledger), errors, cancellation, a paused
transport (today's queued path with its drain) and every chunk of a request the lane does not
serve. The bytes written are those the slow path writes for the same chunk
(`tests/unit/router/test_fast_lane.py` compares them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final

from splitserve._gen.v1 import common_pb2
from splitserve.router.switches import env_switch

if TYPE_CHECKING:
    from splitserve.router.detokenizer import IncrementalDetokenizer
    from splitserve.router.http_sse import EdgeStream
    from splitserve.router.openai_models import Formatter

ENV: Final = "SPLITSERVE_ROUTER_FAST_LANE"
"""`0` turns the lane off (every chunk through the request's task), `1` (default) on."""
_UNFINISHED: Final = common_pb2.FINISH_REASON_UNSPECIFIED


def enabled_from_env(environ: dict[str, str] | None = None) -> bool:
    """The lane's switch from `SPLITSERVE_ROUTER_FAST_LANE` (unset: on).

    Raises:
        ValueError: a value other than 0 or 1, naming the variable.
    """
    return env_switch(ENV, environ)


class FastLane:
    """One streamed request's lane (see the module's docstring)."""

    __slots__ = ("detok", "fmt", "held", "on_tokens", "out", "sub", "taken", "with_usage")

    taken_total: ClassVar[int] = 0
    """Chunks that took a lane in this process (for tests and the benchmark's counts)."""

    def __init__(self) -> None:
        self.sub: Any = None
        """The `MuxStream` whose chunks may take the lane (None: none now)."""
        self.on_tokens: Callable[[tuple[int, ...]], None] | None = None
        self.detok: IncrementalDetokenizer | None = None
        self.fmt: Formatter | None = None
        self.with_usage = False
        self.out: EdgeStream | None = None
        self.held: list[int] = []
        """Tokens taken from the worker message being read, handled at its end (`flush`)."""
        self.taken = 0

    def attach(self, sub: Any, on_tokens: Callable[[tuple[int, ...]], None]) -> None:
        """`sub`'s chunks may take the lane, with `on_tokens` as the dispatch's bookkeeping."""
        self.sub = sub
        self.on_tokens = on_tokens
        sub.lane = self

    def detach(self, sub: Any) -> None:
        if self.sub is sub:
            self.sub = None
            self.on_tokens = None
        sub.lane = None

    def offer(self, sub: Any, chunk: common_pb2.TokenChunk) -> bool:
        """Take `chunk` (True: the reader calls `flush` at the end of the worker message it is
        reading) or leave it to the request's task (False). Called by the link's reader only
        while the task is parked in `sub.read()` with nothing queued."""
        out = self.out
        if (
            out is None
            or self.fmt is None
            or self.detok is None
            or self.on_tokens is None
            or sub is not self.sub
            or chunk.finish_reason != _UNFINISHED
            or chunk.logprobs
            or chunk.prompt_logprobs
            or not chunk.token_ids
            or not out.writable
        ):
            return False
        # Chunks of one worker message are handled as one, as the request's task handles the
        # chunks queued together (`mux._merge`): one detokenize step, one event, one write.
        self.held.extend(chunk.token_ids)
        self.taken += 1
        FastLane.taken_total += 1
        return True

    def flush(self) -> None:
        """What the request's task does with a mid-stream chunk, for the tokens taken."""
        tokens = tuple(self.held)
        self.held.clear()
        out, fmt, detok, on_tokens = self.out, self.fmt, self.detok, self.on_tokens
        if not tokens or out is None or fmt is None or detok is None or on_tokens is None:
            return
        on_tokens(tokens)  # `Dispatch._decode_any`'s and `Dispatch.chunks`' work
        text = detok.push(tokens)  # `Generator.stream`'s (no stop strings)
        if text:  # `stream_body`'s plain delta, then `EdgeSseResponse`'s write
            out.write_chunk_now(fmt.delta_event(text, with_usage=self.with_usage))
