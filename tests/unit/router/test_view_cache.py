"""The pool view's per-worker snapshot cache (issue 17): a cached view is returned only while
nothing it is built from changed; every change the placement can see rebuilds it."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable

import pytest

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.core.clock import ManualClock
from splitserve.core.ids import EndpointId
from splitserve.router import pool_view as pv

P, D = EndpointId("p:1"), EndpointId("d:1")


class _NoChannel:
    async def close(self) -> None:
        pass


def _report(role: common_pb2.Role.ValueType, seq: int, **fields: int) -> common_pb2.LoadReport:
    report = common_pb2.LoadReport(
        role=role, seq=seq, engine="sim", kv_blocks_free=900, kv_blocks_total=1000,
        kv_block_size=16,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(report, name, value)
    return report


def _decode_step(ctx: int, batch: int) -> worker_pb2.StepSample:
    """A decode step priced linearly (base, per context token, per sequence): a fit that is
    ready and whose per-sequence cost moves with the mean context."""
    seconds = 0.002 + 1e-6 * ctx * batch + 1e-4 * batch
    return worker_pb2.StepSample(duration_s=seconds, decode_context_tokens=[ctx] * batch)


def _prefill_step(tokens: int, seconds: float) -> worker_pb2.StepSample:
    chunk = worker_pb2.PrefillChunk(new_tokens=tokens, context_tokens=0)
    return worker_pb2.StepSample(duration_s=seconds, prefill_chunks=[chunk])


@pytest.fixture
async def pool() -> AsyncIterator[pv.PoolView]:
    clock = ManualClock(100.0)
    view = pv.PoolView([], clock=clock)
    await view.start()
    view.latency.watch = lambda eid, stub: None  # type: ignore[method-assign]  # no feeds here
    for eid, role in ((P, common_pb2.ROLE_PREFILL), (D, common_pb2.ROLE_DECODE)):
        ep = pv._Endpoint(eid, _NoChannel(), None)  # type: ignore[arg-type]
        view._endpoints[eid] = ep
        view._take(ep, _report(role, 1))
    yield view
    await view.close()


def _uncached(pool: pv.PoolView) -> list[object]:
    """The views built afresh (every cache entry dropped first: the snapshots and the latency
    book's estimates)."""
    for ep in pool._endpoints.values():
        ep.view_key, ep.view = None, None
        pool.latency._get(ep.id).est_key = None
    return list(pool.views())


def _clock(pool: pv.PoolView) -> ManualClock:
    clock = pool._clock
    assert isinstance(clock, ManualClock)
    return clock


async def test_an_unchanged_worker_gives_the_same_snapshot(pool: pv.PoolView) -> None:
    first = pool.views()
    again = pool.views()
    assert all(a is b for a, b in zip(first, again, strict=True))


def _changes(pool: pv.PoolView) -> list[tuple[str, Callable[[], None]]]:
    seq = iter(range(2, 10_000))

    def report(**fields: int) -> Callable[[], None]:
        def take() -> None:
            pool._take(pool._endpoints[D], _report(common_pb2.ROLE_DECODE, next(seq), **fields))

        return take

    def reserve(rid: str, prefill: bool) -> Callable[[], None]:
        eid = P if prefill else D
        return lambda: pool.ledger.reserve(
            eid, rid, prefill=prefill, num_prompt_tokens=300, predicted_output_tokens=20,
            block_size=16, movable=not prefill, pulls=not prefill,
        )  # fmt: skip

    return [
        ("a load report", report(num_waiting=3, num_running=5)),
        ("a report with the same fields", report(num_waiting=3, num_running=5)),
        ("a report of free KV", report(num_waiting=3, num_running=5, kv_blocks_free=10)),
        ("a prefill reserved", reserve("a", True)),
        ("a decode reserved", reserve("a", False)),
        ("the prefill started", lambda: pool.ledger.start(P, "a")),
        ("the decode started", lambda: pool.ledger.start(D, "a")),
        ("the first token (pull done)", lambda: pool.ledger.progress(D, "a", 2)),
        ("a second decode reserved", reserve("b", False)),
        ("its prefill failed (no pull)", lambda: pool.ledger.no_pull(D, "b")),
        ("a request sent", lambda: pool.acquire(D)),
        ("the request finished", lambda: pool.release(D)),
        ("fenced", lambda: pool.fence(D)),
        ("unfenced", lambda: pool.unfence(D)),
        *(
            (f"request timing {i}", lambda i=i: pool.latency.observe_prefill(P, 4000 + i, 0.5))
            for i in range(4)
        ),
        *(
            (f"decode timing {i}", lambda i=i: pool.latency.observe_decode(D, 1 + i, 0.02 + i))
            for i in range(4)
        ),
        (
            "prefill steps",
            lambda: pool.latency._observe_steps(
                P,
                pool.latency._get(P),
                [_prefill_step(100 + i, 0.01 + 1e-4 * i) for i in range(40)],
            ),
        ),
        (
            "decode steps",
            lambda: pool.latency._observe_steps(
                D,
                pool.latency._get(D),
                [_decode_step(200 + i, 1 + i % 5) for i in range(40)],
            ),
        ),
        (
            "one more decode step",
            lambda: pool.latency._observe_steps(D, pool.latency._get(D), [_decode_step(900, 3)]),
        ),
        ("pull totals", lambda: pool.latency.observe_pull_totals(D, 1000, 0.1)),
        ("more pull totals", lambda: pool.latency.observe_pull_totals(D, 3000, 0.2)),
        ("the report went stale", lambda: _clock(pool).advance(60.0)),
        ("a fresh report", report(num_waiting=1)),
        ("the decode dropped", lambda: pool.ledger.drop(D, "a")),
        ("the other dropped", lambda: pool.ledger.drop(D, "b")),
        ("the worker forgotten by the ledger", lambda: pool.ledger.forget(P)),
    ]


async def test_every_change_is_seen(pool: pv.PoolView) -> None:
    """After each change the (cached) snapshot equals one built afresh; fails if the cache
    keeps a view that no longer matches the worker's state."""
    changed = 0
    for what, change in _changes(pool):
        before = pool.views()
        change()
        cached = pool.views()
        assert cached == _uncached(pool), what
        changed += cached != before
    assert changed >= 20  # the changes above do change the views


async def test_random_changes_match_a_fresh_build(pool: pv.PoolView) -> None:
    rng = random.Random(7)
    changes = _changes(pool)
    for _ in range(300):
        what, change = rng.choice(changes)
        change()
        assert pool.views() == _uncached(pool), what
        if rng.random() < 0.3:
            _clock(pool).advance(rng.choice((0.1, 1.0, 5.0)))
