"""Per-call cost of router hot-path pieces, to compare a mypyc build of them with pure Python
(docs/benchmarks.md "Seventeenth pass"). In-process `timeit`, best of 5; run it once per build:

    PYTHONPATH=src python -m tests.bench_router.compiled_micro
    PYTHONPATH=build/mypyc-router python -m tests.bench_router.compiled_micro

Each row names the module it timed and whether that module was imported from an extension
module (compiled) or a `.py` file. The tokenizer is the router's default one (downloaded into the
cache on first use, as `tests.bench_router.ab` does).
"""

from __future__ import annotations

import os
import tempfile
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core import frames
from splitserve.core.ids import EndpointId
from splitserve.router import detokenizer, ledger
from splitserve.router.tokenizer import TextTokenizer, default_tokenizer_dir

TOKENS = 16
"""Streamed tokens per request, as in `ab.py`'s default."""


def _kind(module: ModuleType) -> str:
    origin = getattr(module, "__file__", "") or ""
    return "py" if origin.endswith(".py") else "compiled"


def _best_us(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    cache = Path(os.environ.get("SPLITSERVE_CACHE_DIR", tempfile.gettempdir()))
    tok = TextTokenizer.from_dir(default_tokenizer_dir(cache / "tokenizer"))
    out_ids = tok.encode(" the quick brown fox jumps over the lazy dog again and again ok")[:TOKENS]

    def detok_stream() -> None:  # one request's 16 tokens, one per push (the lane's flush)
        d = detokenizer.IncrementalDetokenizer(tok, out_ids[:5])
        for t in out_ids:
            d.push((t,))

    event = worker_pb2.MuxEvent(stream_id=7, chunk=common_pb2.TokenChunk(token_ids=[11]))
    chunk = worker_pb2.MuxResponse(events=[event])
    data = b"".join(frames.frame(chunk.SerializeToString()) for _ in range(8))

    def split() -> None:  # one read holding 8 frames, cut in two pieces
        s = frames.FrameSplitter()
        s.feed(data[:37])
        s.feed(data[37:])

    eid = EndpointId("decode-0")

    def book() -> None:  # one request's ledger life on its decode worker
        led = ledger.Ledger()
        led.reserve(eid, "r", prefill=False, num_prompt_tokens=200, predicted_output_tokens=16,
                    block_size=16, pulls=True)  # fmt: skip
        led.start(eid, "r")
        for n in range(1, TOKENS + 1):
            led.progress(eid, "r", n)
        led.drop(eid, "r")

    rows = [
        ("IncrementalDetokenizer.push x16 (real tokenizer)", detokenizer, detok_stream, 2000),
        ("FrameSplitter.feed, 8 frames in 2 reads", frames, split, 20000),
        ("Ledger reserve/start/progress x16/drop", ledger, book, 20000),
    ]
    print("| call | module | µs per call |")
    print("|---|---|---|")
    for name, module, fn, number in rows:
        print(f"| {name} | {module.__name__} ({_kind(module)}) | {_best_us(fn, number):.2f} |")


if __name__ == "__main__":
    main()
