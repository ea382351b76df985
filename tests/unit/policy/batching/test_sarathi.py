"""Sarathi-Serve stall-free batching.

Invariants:
1. a step never runs more tokens than the chunk budget;
2. running decodes are scheduled before any prefill chunk (no decode stalls behind a prompt
   while the budget lasts);
3. it is registered as "sarathi" and builds with its paper defaults;
4. it drives the engine model to completion (every request finishes, blocks conserved).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager
from splitserve.core.request import Request, SamplingSpec
from splitserve.policy.batching import EngineModel, SeqView, StepView, make_batching_policy
from splitserve.policy.batching.engine import RequestMode
from splitserve.policy.batching.sarathi import SarathiParams, SarathiPolicy


def seq(rid: str, prompt: int, outputs: int = 0, computed: int = 0) -> SeqView:
    return SeqView(RequestId(rid), 0.0, prompt, outputs, computed, 1000, -(-computed // 16))


def test_decodes_go_first() -> None:
    prefilling = seq("p", 2000, computed=512)
    decodes = [seq(f"d{i}", 10, outputs=2, computed=11) for i in range(3)]
    view = StepView(0.0, (seq("w", 100),), (prefilling, *decodes), 1000, 1000, 16)
    decision = SarathiPolicy(SarathiParams(chunk_tokens=256)).decide(view)
    assert [rid for rid, _ in decision.chunks][:3] == ["d0", "d1", "d2"]
    assert decision.chunks[3] == (RequestId("p"), 253)
    assert sum(n for _, n in decision.chunks) == 256


@given(
    st.lists(st.integers(1, 3000), min_size=1, max_size=8),
    st.lists(st.integers(2, 500), max_size=20),
    st.integers(16, 1024),
)
def test_budget_respected(prompts: list[int], decode_ctx: list[int], budget: int) -> None:
    waiting = tuple(seq(f"w{i}", p) for i, p in enumerate(prompts))
    running = tuple(
        seq(f"d{i}", c - 1, outputs=1, computed=c - 1) for i, c in enumerate(decode_ctx)
    )
    view = StepView(0.0, waiting, running, 10_000, 10_000, 16)
    decision = SarathiPolicy(SarathiParams(chunk_tokens=budget)).decide(view)
    assert sum(n for _, n in decision.chunks) <= budget


def test_registered_and_drives_the_engine() -> None:
    policy = make_batching_policy("sarathi", chunk_tokens=64)
    assert isinstance(policy, SarathiPolicy)
    engine = EngineModel(policy, BlockManager(128, 16), None)
    for i in range(6):
        req = Request(RequestId(f"r{i}"), (0,) * (50 + 40 * i), SamplingSpec(max_tokens=5), 0.0)
        engine.add(req, RequestMode.GENERATE)
    finished = 0
    while engine.has_runnable_work:
        step = engine.schedule(0.0)
        assert step is not None
        assert step.batch.num_new_tokens <= 64
        finished += len(engine.complete(step, 0.0).finished)
    assert finished == 6
    assert engine.blocks.num_free == 128
