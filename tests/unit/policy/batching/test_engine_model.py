"""The shared engine model.

Invariants checked with hypothesis:
1. blocks are conserved: free + held == total after every operation;
2. liveness: stepping until idle finishes every request that was not aborted;
3. determinism: a request's tokens do not depend on batching, preemption or the P/D split;
4. an invalid decision raises before anything changes.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.errors import CapacityError
from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager
from splitserve.core.request import FinishReason, Request, SamplingSpec
from splitserve.policy.batching import (
    EngineModel,
    FcfsParams,
    FcfsPolicy,
    SeqPhase,
    StepDecision,
    StepView,
)
from splitserve.policy.batching.engine import RequestMode
from splitserve.policy.batching.tokens import SyntheticTokens

TOKENS = SyntheticTokens(vocab_size=1000, first_id=10)


def make_engine(
    blocks: int = 64, block_size: int = 16, budget: int = 256, hold_s: float = 30.0
) -> EngineModel:
    return EngineModel(
        FcfsPolicy(FcfsParams(max_num_batched_tokens=budget)),
        BlockManager(blocks, block_size),
        TOKENS,
        kv_hold_timeout_s=hold_s,
    )


def make_request(
    rid: str,
    prompt_len: int = 20,
    max_tokens: int = 5,
    arrival_s: float = 0.0,
    stop: tuple[int, ...] = (),
) -> Request:
    return Request(
        RequestId(rid),
        tuple(range(100, 100 + prompt_len)),
        SamplingSpec(max_tokens=max_tokens, stop_token_ids=stop),
        arrival_s,
    )


def run_until_idle(
    engine: EngineModel, now_s: float = 0.0, max_steps: int = 10_000
) -> dict[RequestId, list[int]]:
    out: dict[RequestId, list[int]] = {}
    for _ in range(max_steps):
        step = engine.schedule(now_s)
        if step is None:
            return out
        for rid in step.transfers:
            engine.finish_transfer(rid)
        now_s += 0.01
        for ev in engine.complete(step, now_s).tokens:
            out.setdefault(ev.request_id, []).append(ev.token_id)
    raise AssertionError("engine did not go idle")


def expected_tokens(req: Request) -> list[int]:
    key = TOKENS.key(req.prompt_token_ids, req.sampling.seed)
    return [TOKENS.token(key, i) for i in range(req.sampling.max_tokens)]


def test_generate_runs_prefill_then_decodes_to_max_tokens() -> None:
    engine = make_engine()
    req = make_request("a", prompt_len=20, max_tokens=5)
    engine.add(req, RequestMode.GENERATE)
    out = run_until_idle(engine)
    assert out[req.id] == expected_tokens(req)
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_long_prompt_is_chunked_under_the_budget() -> None:
    engine = make_engine(blocks=64, budget=256)
    engine.add(make_request("a", prompt_len=600, max_tokens=2), RequestMode.GENERATE)
    sizes = []
    while (step := engine.schedule(0.0)) is not None:
        sizes.append(step.batch.num_new_tokens)
        engine.complete(step, 0.0)
    assert sizes == [256, 256, 88, 1]


def test_prefill_then_remote_decode_equals_aggregated() -> None:
    req = make_request("a", prompt_len=40, max_tokens=6)
    p, d = make_engine(), make_engine()
    p.add(req, RequestMode.PREFILL)
    step = p.schedule(0.0)
    assert step is not None
    result = p.complete(step, 0.1)
    assert result.prefilled == (req.id,)
    assert p.phase(req.id) is SeqPhase.HOLDING
    first = result.tokens[0].token_id
    d.add(req, RequestMode.DECODE, first_token_id=first)
    decoded = run_until_idle(d)[req.id]
    assert [first, *decoded] == expected_tokens(req)
    assert p.release(req.id)
    assert p.blocks.num_free == p.blocks.num_blocks


def test_prefill_that_finishes_at_first_token_holds_nothing() -> None:
    p = make_engine()
    req = make_request("a", max_tokens=1)
    p.add(req, RequestMode.PREFILL)
    step = p.schedule(0.0)
    assert step is not None
    result = p.complete(step, 0.0)
    assert result.prefilled == ()
    assert result.tokens[0].finish_reason is FinishReason.LENGTH
    assert p.blocks.num_free == p.blocks.num_blocks


def test_held_kv_expires() -> None:
    p = make_engine(hold_s=5.0)
    p.add(make_request("a"), RequestMode.PREFILL)
    step = p.schedule(0.0)
    assert step is not None
    p.complete(step, 1.0)
    assert p.expire_holds(5.9) == []
    assert p.expire_holds(6.0) == [RequestId("a")]
    assert p.blocks.num_free == p.blocks.num_blocks


def test_request_that_can_never_fit_is_rejected_cleanly() -> None:
    engine = make_engine(blocks=4, block_size=16)  # 64 tokens
    with pytest.raises(CapacityError, match="at most 64"):
        engine.add(make_request("big", prompt_len=60, max_tokens=10), RequestMode.GENERATE)
    assert list(engine.request_ids) == []
    with pytest.raises(ValueError, match="at least one token"):
        engine.add(
            Request(RequestId("e"), (), SamplingSpec(max_tokens=1), 0.0), RequestMode.GENERATE
        )


def test_request_waits_for_blocks_then_runs() -> None:
    engine = make_engine(blocks=4, block_size=16)
    a = make_request("a", prompt_len=40, max_tokens=8, arrival_s=0.0)  # peak 48 tokens = 3 blocks
    b = make_request("b", prompt_len=40, max_tokens=8, arrival_s=1.0)
    engine.add(a, RequestMode.GENERATE)
    engine.add(b, RequestMode.GENERATE)
    out = run_until_idle(engine)
    assert out[a.id] == expected_tokens(a)
    assert out[b.id] == expected_tokens(b)


def test_preemption_recomputes_and_keeps_tokens_identical() -> None:
    engine = make_engine(blocks=6, block_size=4, budget=64)  # 24 token slots
    reqs = [make_request(f"r{i}", prompt_len=6, max_tokens=12, arrival_s=i) for i in range(3)]
    for r in reqs:
        engine.add(r, RequestMode.GENERATE)
    out = run_until_idle(engine)
    assert engine.num_preemptions > 0
    for r in reqs:
        assert out[r.id] == expected_tokens(r)


def test_stop_token_finishes_early() -> None:
    req = make_request("a", max_tokens=10)
    stop_at = expected_tokens(req)[3]
    engine = make_engine()
    engine.add(make_request("a", max_tokens=10, stop=(stop_at,)), RequestMode.GENERATE)
    out = run_until_idle(engine)
    assert out[req.id][-1] == stop_at
    assert len(out[req.id]) == expected_tokens(req).index(stop_at) + 1


def test_decode_of_a_finished_request_is_rejected() -> None:
    with pytest.raises(ValueError, match="nothing to decode"):
        make_engine().add(make_request("a", max_tokens=1), RequestMode.DECODE, first_token_id=11)


def test_abort_frees_blocks_even_mid_step() -> None:
    engine = make_engine()
    engine.add(make_request("a", prompt_len=40), RequestMode.GENERATE)
    step = engine.schedule(0.0)
    assert step is not None
    assert engine.abort(RequestId("a"))
    assert engine.blocks.num_free == engine.blocks.num_blocks
    assert engine.complete(step, 0.1).tokens == ()
    assert not engine.abort(RequestId("a"))


class _GreedyBadPolicy:
    name = "bad"

    def decide(self, view: StepView) -> StepDecision:
        return StepDecision(chunks=tuple((s.id, s.num_uncomputed_tokens) for s in view.waiting))


def test_invalid_decision_raises_and_changes_nothing() -> None:
    engine = EngineModel(_GreedyBadPolicy(), BlockManager(4, 16), TOKENS)
    engine.add(make_request("a", prompt_len=40, max_tokens=2), RequestMode.GENERATE)  # 3 blocks
    engine.add(make_request("b", prompt_len=40, max_tokens=2, arrival_s=1), RequestMode.GENERATE)
    with pytest.raises(ValueError, match="more KV blocks than are free"):
        engine.schedule(0.0)
    assert engine.blocks.num_free == 4
    assert engine.phase(RequestId("a")) is SeqPhase.WAITING


request_specs = st.lists(
    st.tuples(st.integers(1, 80), st.integers(1, 20), st.sampled_from(list(RequestMode))),
    min_size=1,
    max_size=12,
)


@given(request_specs, st.integers(6, 40), st.sampled_from([4, 16]), st.integers(8, 300), st.data())
def test_random_workloads_conserve_blocks_and_finish(
    specs: list[tuple[int, int, RequestMode]],
    blocks: int,
    block_size: int,
    budget: int,
    data: st.DataObject,
) -> None:
    engine = make_engine(blocks=blocks, block_size=block_size, budget=budget)
    accepted: dict[RequestId, tuple[Request, RequestMode]] = {}
    for i, (plen, mtok, mode) in enumerate(specs):
        req = make_request(f"r{i}", prompt_len=plen, max_tokens=mtok, arrival_s=float(i))
        first = expected_tokens(req)[0] if mode is RequestMode.DECODE else None
        try:
            engine.add(req, mode, first_token_id=first)
        except CapacityError:
            continue
        except ValueError:
            assert mode is RequestMode.DECODE
            assert mtok == 1
            continue
        accepted[req.id] = (req, mode)
    aborted = (
        set(data.draw(st.sets(st.sampled_from(sorted(accepted))), label="aborted"))
        if accepted
        else set()
    )
    out: dict[RequestId, list[int]] = {}
    now = 0.0
    for n in range(5000):
        if n == 3:
            for rid in aborted:
                engine.abort(rid)
        step = engine.schedule(now)
        assert engine.blocks.num_free + sum(engine.blocks.held.values()) == engine.blocks.num_blocks
        if step is None:
            break
        for rid in step.transfers:
            engine.finish_transfer(rid)
        now += 0.01
        result = engine.complete(step, now)
        for ev in result.tokens:
            out.setdefault(ev.request_id, []).append(ev.token_id)
        for rid in result.prefilled:
            assert engine.release(rid)
    else:
        raise AssertionError("no progress")
    assert engine.blocks.num_free == engine.blocks.num_blocks
    for rid, (req, mode) in accepted.items():
        if rid in aborted and rid not in out:
            continue
        exp = expected_tokens(req)
        got = out.get(rid, [])
        if rid in aborted:
            assert (
                got == exp[len(exp) - len(got) :]
                or got == exp[: len(got)]
                or got == exp[1 : 1 + len(got)]
            )
        elif mode is RequestMode.PREFILL:
            assert got == exp[:1]
        elif mode is RequestMode.DECODE:
            assert got == exp[1:]
        else:
            assert got == exp
