"""`kvbench --mux` (`Client(mux=True)`): its calls as Multiplex sub-requests, on real sim workers.

The bench's timings need vLLM; the way it sends requests does not.
"""

from __future__ import annotations

import pytest

from splitserve.core.roles import Role
from splitserve.worker.vllm_adapter.kvbench import Client
from tests.unit.worker.conftest import WorkerFactory

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13]


async def test_mux_client_gives_the_per_call_tokens_over_one_stream_per_worker(
    make_worker: WorkerFactory,
) -> None:
    p = await make_worker(Role.PREFILL)
    d = await make_worker(Role.DECODE)
    plain, mux = Client(), Client(mux=True)
    try:
        want = await plain.pd(p.address, d.address, "a", PROMPT, 6)
        got = await mux.pd(p.address, d.address, "b", PROMPT, 6)
        assert got.tokens == want.tokens
        assert len(got.tokens) == 6
        assert got.handle_bytes == want.handle_bytes > 0
        # Both workers were reached over a Multiplex stream (the per-call stubs never were).
        assert sorted(mux._muxes) == sorted([p.address, d.address])
        assert not plain._muxes
        m = await make_worker(Role.MIXED)
        agg = await mux.generate(m.address, "c", PROMPT, 6)
        assert agg.tokens == (await plain.generate(m.address, "d", PROMPT, 6)).tokens
    finally:
        await plain.close()
        await mux.close()


async def test_mux_client_raises_a_sub_requests_error_status(make_worker: WorkerFactory) -> None:
    p = await make_worker(Role.PREFILL)
    mux = Client(mux=True)
    try:
        with pytest.raises(RuntimeError, match="generate sub-request"):
            await mux.generate(p.address, "x", PROMPT, 4)  # a prefill worker cannot generate
    finally:
        await mux.close()
