"""Per-call CPU of the router's per-worker work, in-process (`timeit`, best of 5; issue 17).

    python -m tests.bench_router.feed_micro [--workers 10] [--src DIR]

With `--workers` endpoints whose step models are fitted (4 prefill-only steps and decode steps
of 32 sequences each, as a zero-delay sim worker's feed carries at c=32) and 32 requests
reserved on them: `PoolView.views()` (the snapshot every placement takes), one step-feed
message of 16 samples through `LatencyBook._observe_steps`, and one load report through
`PoolView._take`. What the event loop, the sockets and the protobuf parsing cost is only in the
whole-router figures (`run.py`, `ab.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import timeit
from collections.abc import Callable

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.clock import ManualClock
from splitserve.core.ids import EndpointId
from splitserve.router import pool_view as pv


class _NoChannel:
    async def close(self) -> None:
        pass


def best_us(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def prefill_samples(n: int) -> list[worker_pb2.StepSample]:
    return [
        worker_pb2.StepSample(
            index=i,
            duration_s=0.001 + 0.00001 * (200 + i % 7),
            prefill_chunks=[worker_pb2.PrefillChunk(new_tokens=200 + i % 7, context_tokens=0)],
        )
        for i in range(n)
    ]


def decode_samples(n: int, batch: int = 32) -> list[worker_pb2.StepSample]:
    return [
        worker_pb2.StepSample(
            index=i,
            duration_s=0.002
            + 0.0000001 * sum(200 + (i + j) % 16 for j in range(batch))
            + 1e-5 * batch,
            decode_context_tokens=[200 + (i + j) % 16 for j in range(batch)],
        )
        for i in range(n)
    ]


async def build(workers: int) -> pv.PoolView:
    clock = ManualClock(100.0)
    pool = pv.PoolView([], clock=clock)
    await pool.start()
    pool.latency.watch = lambda eid, stub: None  # type: ignore[method-assign]  # no feeds here
    n_prefill = max(1, workers * 2 // 5)
    for i in range(workers):
        eid = EndpointId(f"w{i}:1")
        ep = pv._Endpoint(eid, _NoChannel(), None)  # type: ignore[arg-type]
        prefill = i < n_prefill
        pool._endpoints[eid] = ep
        pool._take(
            ep,
            common_pb2.LoadReport(
                role=common_pb2.ROLE_PREFILL if prefill else common_pb2.ROLE_DECODE,
                num_waiting=1, num_running=8, kv_blocks_free=900, kv_blocks_total=1000,
                kv_block_size=16, seq=1, engine="sim",
            ),
        )  # fmt: skip
        m = pool.latency._get(eid)
        samples = prefill_samples(64) if prefill else decode_samples(64)
        pool.latency._observe_steps(eid, m, samples)
    for r in range(32):
        p = EndpointId(f"w{r % n_prefill}:1")
        d = EndpointId(f"w{n_prefill + r % (workers - n_prefill)}:1")
        pool.ledger.reserve(
            p, f"r{r}", prefill=True, num_prompt_tokens=200, predicted_output_tokens=16,
            block_size=16,
        )  # fmt: skip
        pool.ledger.reserve(
            d, f"r{r}", prefill=False, num_prompt_tokens=200, predicted_output_tokens=16,
            block_size=16, movable=True, pulls=True,
        )  # fmt: skip
    return pool


async def amain(workers: int) -> None:
    pool = await build(workers)
    eid = EndpointId(f"w{workers - 1}:1")
    m = pool.latency._get(eid)
    dec = decode_samples(16)
    pre = prefill_samples(16)
    ep = pool._endpoints[eid]
    seq = [10]

    def take() -> None:
        seq[0] += 1
        pool._take(
            ep,
            common_pb2.LoadReport(
                role=common_pb2.ROLE_DECODE, num_running=8, kv_blocks_free=900,
                kv_blocks_total=1000, kv_block_size=16, seq=seq[0], engine="sim",
            ),
        )  # fmt: skip

    print(f"views() with {workers} workers: {best_us(pool.views, 2000):.1f} us")

    def step_then_views() -> None:
        pool.latency._observe_steps(eid, m, dec)
        pool.views()

    print(f"views() after a step message: {best_us(step_then_views, 500):.1f} us")
    print(
        "_observe_steps, 16 decode samples of 32 sequences: "
        f"{best_us(lambda: pool.latency._observe_steps(eid, m, dec), 500):.1f} us"
    )
    print(
        "_observe_steps, 16 prefill samples: "
        f"{best_us(lambda: pool.latency._observe_steps(eid, m, pre), 500):.1f} us"
    )
    print(f"_take (one load report): {best_us(take, 2000):.1f} us")
    await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(amain(args.workers))


if __name__ == "__main__":
    main()
