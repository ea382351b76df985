"""Per-phase CPU of one streamed chat request, in-process, no network (`timeit`, best of 5).

    python -m tests.bench_router.phases [--prompt-tokens 200]

The pieces of the router's request path that run without a worker, on the bench's own request
(`run.chat_body`, the default tokenizer): body JSON + validation, chat template + tokenize, the
SSE event and the detokenizer step per chunk, the pool snapshot and the decider's placement on
two workers with 32 requests reserved. What needs workers and sockets (the `Multiplex` ops, the
event loop, the writes) is only in the whole-router figures (`ab.py`) and the profile
(`spy_phases.py`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path

import orjson

from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import EndpointView, RequestView
from splitserve.router import openai_models as wire
from splitserve.router.detokenizer import IncrementalDetokenizer
from splitserve.router.dispatch import default_decider
from splitserve.router.ledger import Ledger
from splitserve.router.openai_parse import parse_body, template_messages
from splitserve.router.tokenizer import TextTokenizer, default_tokenizer_dir
from tests.bench_router.run import TOKENS, chat_body, prompt_of


def best_us(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt-tokens", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-router-phases-"))
    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", work / "cache"))
    tok = TextTokenizer.from_dir(default_tokenizer_dir(cache / "tokenizer"))
    body = chat_body("bench", prompt_of(tok, args.prompt_tokens))

    def parse() -> object:
        return parse_body(wire.ChatCompletionRequest, orjson.loads(body), allow_unknown=False)

    req = parse()
    assert isinstance(req, wire.ChatCompletionRequest)
    messages = template_messages(req.messages)
    ids = tok.apply_chat_template(messages)
    fmt = wire.Formatter(chat=True, response_id="chatcmpl-x", created=0, model="bench")
    out_ids = tok.encode(" the router places each request on a worker")[:TOKENS]

    def detok_request() -> object:
        d = IncrementalDetokenizer(tok, ids[-8:])
        return [d.push((t,)) for t in out_ids]

    def delta() -> bytes:
        return fmt.delta_event("the", with_usage=False)

    ledger = Ledger()
    decider = default_decider(ledger=ledger)
    views = [
        EndpointView(EndpointId("p"), Role.PREFILL, prefill_tokens_per_s=50_000.0),
        EndpointView(EndpointId("d"), Role.DECODE, kv_free_blocks=4096, kv_total_blocks=4096),
    ]
    for i in range(32):
        ledger.reserve(EndpointId("d"), f"r{i}", prefill=False, num_prompt_tokens=len(ids),
                       predicted_output_tokens=TOKENS, block_size=16)  # fmt: skip
    view = RequestView(RequestId("x"), len(ids), TOKENS)
    rows = [
        ("body JSON + validation (orjson + pydantic)", best_us(parse, 2000)),
        ("chat messages for the template", best_us(lambda: template_messages(req.messages), 5000)),
        ("chat template + tokenize", best_us(lambda: tok.apply_chat_template(messages), 500)),
        ("placement (decider, 2 workers)", best_us(lambda: decider.place(view, views), 5000)),
        ("SSE delta event (per chunk)", best_us(delta, 20000)),
        (f"detokenize {TOKENS} one-token chunks (per request)", best_us(detok_request, 1000)),
    ]
    print(f"prompt: {len(ids)} tokens, {len(body)} body bytes")
    for name, us in rows:
        print(f"{us:9.1f} us  {name}")


if __name__ == "__main__":
    main()
