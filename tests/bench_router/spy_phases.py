"""A py-spy raw profile of the router (`--format raw`) split into the phases of a request.

    python -m tests.bench_router.spy_phases out/ab-spy-b.txt [--cpu-ms 3.5] [--functions 25]

Each sample goes to the first phase (in the order of `PHASES`) with a frame matching one of its
patterns anywhere in the sample's stack; samples matching none are "other". With `--cpu-ms`
(the router's measured CPU per request) the shares are also given as milliseconds per request.
An approximation: py-spy without `--native` puts the event loop's C code (uvloop, grpc's
callbacks) on the innermost Python frame that called it, and a coroutine resumed by the loop
shows only its own chain, so "event loop" is what sits on `asyncio.run` itself.

`--functions N` also prints the N functions with the most samples, self (the innermost frame)
and cumulative (anywhere in the stack, counted once per sample), as shares and, with `--cpu-ms`,
milliseconds per request; a function is its name and file (line numbers dropped).
"""

from __future__ import annotations

import argparse
import collections
import re

PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("per-chunk: detokenize", ("router/detokenizer.py",)),
    ("chat template + tokenize", ("router/tokenizer.py", "router/fast_bpe.py", "jinja2/")),
    (
        "end of request (stats, log, ledger drop, SLO, trace)",
        (
            "finish (splitserve/router/request_stats.py",
            "log_finished (",
            "_observe_finish (",
            "drop (splitserve/router/ledger.py",
            "moved_to (splitserve/router/ledger.py",
            "record (splitserve/router/request_log.py",
            "cancel_later (",
            "finish (splitserve/obs/tracing.py",
        ),
    ),
    (
        "HTTP parse + body JSON + validation",
        (
            "read_body (",
            "read_json_object (",
            "read_limited (",
            "parse_body (",
            "pydantic/",
            "check_common (",
            "params (splitserve/router/openai_api.py",
            "tool_plan (",
            "template_messages (",
            "build_request (",
            "client_request_id (",
            "formatter (splitserve/router/openai_api.py",
            "with_logprobs (",
            "starlette/requests.py",
        ),
    ),
    (
        "admission / SLO / placement / ledger",
        (
            "router/admission.py",
            "_place (",
            "policy/",
            "router/ledger.py",
            "router/slo.py",
            "router/pool_view.py",
            "__init__ (splitserve/router/dispatch.py",
            "__init__ (splitserve/router/request_stats.py",
            "start (splitserve/obs/tracing.py",
        ),
    ),
    (
        "Prefill op",
        ("_prefill_any (", "_prefill_first (", "prefill (splitserve/router/mux.py"),
    ),
    ("Decode op set-up", ("_decode_call (", "_decode_order (")),
    ("step reports (latency watch)", ("router/latency.py",)),
    (
        "worker link (mux reader / writer tasks, grpc.aio)",
        ("_read (splitserve/router/mux.py", "_write (splitserve/router/mux.py", "grpc/"),
    ),
    (
        "per-chunk: worker stream -> generator -> SSE -> write",
        (
            "_decode_any (",
            "read (splitserve/router/dispatch.py",
            "read (splitserve/router/mux.py",
            "_merge (",
            "_account (",
            "chunks (splitserve/router/dispatch.py",
            "stream (splitserve/router/generation.py",
            "stream_body (",
            "router/openai_models.py",
            "router/openai_stream.py",
            "router/http_sse.py",
            "router/request_stats.py",
        ),
    ),
    (
        "HTTP server (uvicorn, edge protocol, ASGI entry)",
        (
            "uvicorn/",
            "httptools",
            "router/http_edge.py",
            "router/http_front.py",
            "router/openai_api.py",
            "starlette/",
        ),
    ),
    ("threads (tokenizer pool, grpc poller)", ("threading.py",)),
    ("event loop (uvloop C code, scheduling)", ("run (asyncio/runners.py",)),
)


def _stacks(path: str) -> list[tuple[str, int]]:
    """The (stack, samples) lines of a py-spy `--format raw` file."""
    out: list[tuple[str, int]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if n.isdigit():
                out.append((stack, int(n)))
    return out


def phases(path: str) -> tuple[collections.Counter[str], int]:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for stack, n in _stacks(path):
        total += n
        frames = re.sub(r":\d+\)", ")", stack)
        for name, patterns in PHASES:
            if any(p in frames for p in patterns):
                counts[name] += n
                break
        else:
            counts["other"] += n
    return counts, total


def functions(path: str) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Samples per function: (self, cumulative, total)."""
    own: collections.Counter[str] = collections.Counter()
    cumulative: collections.Counter[str] = collections.Counter()
    total = 0
    for stack, n in _stacks(path):
        total += n
        frames = [_frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        own[frames[-1]] += n
        for name in set(frames):
            cumulative[name] += n
    return own, cumulative, total


def _frame_name(frame: str) -> str:
    """`func (path/to/site-packages/pkg/file.py:12)` -> `func (pkg/file.py)`."""
    frame = re.sub(r":\d+\)$", ")", frame)
    name, _, where = frame.partition(" (")
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in where:
            where = where.rsplit(marker, 1)[1]
            break
    return f"{name} ({where}" if where else name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile")
    parser.add_argument("--cpu-ms", type=float, default=None, help="CPU per request, ms")
    parser.add_argument("--functions", type=int, default=0, help="also the N top functions")
    args = parser.parse_args()
    counts, total = phases(args.profile)
    print(f"{total} samples")
    for name, n in counts.most_common():
        share = n / max(total, 1)
        ms = f"  {share * args.cpu_ms:.2f} ms" if args.cpu_ms else ""
        print(f"{100 * share:5.1f} %{ms}  {name}")
    if args.functions:
        own, cumulative, total = functions(args.profile)
        for title, counter in (("self", own), ("cumulative", cumulative)):
            print(f"-- top {args.functions} functions, {title}")
            for name, n in counter.most_common(args.functions):
                share = n / max(total, 1)
                ms = f"  {share * args.cpu_ms * 1e3:6.0f} us" if args.cpu_ms else ""
                print(f"{100 * share:5.1f} %{ms}  {name}")


if __name__ == "__main__":
    main()
