"""BROS step policy (research/seed-accelgen-bros.md B11, adapted to our engine).

Invariants:
1. residual ordering: RT requests run most urgent first; a batch that would outlast τ_min stops
   the RT pass (early return), skips the BE phase and resets Bsz (B11-2);
2. adaptive batch size: +Δ per step without an early return, back to Bsz_init on one, never above
   Bsz_max (B11-3);
3. BE fill and replacement: a full batch swaps its least urgent RT for a BE only when that RT can
   skip the step and still meet its deadline; intact BE go before BE that must recompute (B11-4);
4. KV sharing: with no free blocks an RT request takes an idle BE's blocks. With host space it
   checkpoints only the blocks it lacks off the tails of idle BE (most blocks first), falls back
   to swapping a whole BE out, then to recompute when the host is full; without host space the
   BE is preempted (recomputed), fewest blocks first; an idle RT victim is recomputed (swapped
   with `swap_rt`); with `kv_sharing=False` the RT that cannot grow is itself
   recomputed (the paper's "No Bi-cache"); nothing is evicted when eviction cannot make room;
   RT requests whose deadline is out of reach run after reachable ones and before BE (research
   B10-4), most overdue first; a BE prompt leaves free the blocks RT requests need next;
5. the RR baseline alternates RT and BE iterations;
6. the cost model fits its profile (the paper's linear prefill / decode models);
7. every decision passes `EngineModel` validation, the engine runs every workload to completion
   (hypothesis), and decisions never depend on `max_tokens` (a cap, not the true length);
8. params validate and `make()` builds the paper's defaults through the registry.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.core.ids import RequestId, SloClassName
from splitserve.core.kv import BlockManager
from splitserve.core.perf import BatchShape
from splitserve.core.request import Request, SamplingSpec
from splitserve.policy.batching import (
    EngineModel,
    SeqView,
    StepDecision,
    StepView,
    make_batching_policy,
)
from splitserve.policy.batching.bros import (
    BEST_EFFORT,
    REALTIME,
    BrosParams,
    BrosPolicy,
    CostModel,
    Scheduler,
    Stop,
    default_latency,
)
from splitserve.policy.batching.engine import RequestMode

# Decode 20 ms + 2.5 ms per sequence; prefill 10 ms + 50 µs per token (no context terms).
SIMPLE = CostModel(prefill=(0.01, 5e-5, 0.0), decode=(0.02, 0.0025, 0.0))


def policy(**params: object) -> BrosPolicy:
    p = BrosPolicy(BrosParams(**params))  # type: ignore[arg-type]
    p.cost = SIMPLE
    return p


def seq(
    rid: str,
    prompt: int = 100,
    outputs: int = 0,
    computed: int | None = None,
    arrival_s: float = 0.0,
    blocks: int | None = None,
    rt: bool = True,
    max_tokens: int = 1000,
) -> SeqView:
    """A sequence: waiting when `computed` is 0 and no outputs, decoding otherwise."""
    known = prompt + outputs
    if computed is None:
        computed = known - 1 if outputs else 0
    held = blocks if blocks is not None else -(-computed // 16)
    cls = REALTIME if rt else BEST_EFFORT
    return SeqView(
        RequestId(rid), arrival_s, prompt, outputs, computed, max_tokens, held, slo_class=cls
    )


def view(
    now: float,
    running: tuple[SeqView, ...] = (),
    waiting: tuple[SeqView, ...] = (),
    free: int = 1000,
    host: int = 0,
) -> StepView:
    return StepView(now, waiting, running, free, 10_000, 16, host_free_tokens=host)


def ids(decision_chunks: tuple[tuple[RequestId, int], ...]) -> list[str]:
    return [str(r) for r, _ in decision_chunks]


def test_residual_order_early_return_and_backoff() -> None:
    p = policy(bsz_init=8)
    p.bsz = 20
    a0, c0 = seq("a", outputs=3), seq("c", outputs=3)
    p.decide(view(0.0, running=(a0, c0)))  # learns both last tokens at t = 0
    p.bsz = 20
    # At 0.15 s: c's token just came out (τ 0.2); a still waits (τ 0.05); b arrived at 0.05
    # (TTFT τ 0.35) with an 800-token prompt, which would make the batch outlast τ_min = 0.05.
    a, c = seq("a", outputs=3), seq("c", outputs=4)
    b = seq("b", prompt=800, arrival_s=0.05)
    be = seq("j", outputs=2, rt=False)
    d = p.decide(view(0.15, running=(a, c, be), waiting=(b,)))
    assert ids(d.chunks) == ["a", "c"]  # most urgent first, b stops the pass, BE phase skipped
    assert p.last_stop is Stop.DEADLINE
    assert p.bsz == 8
    assert p.num_early_returns == 1


def test_batch_size_grows_additively_and_caps() -> None:
    p = policy(bsz_init=8, bsz_step=1, max_num_seqs=20)
    r = seq("r", outputs=1)
    for i in range(10):
        r = seq("r", outputs=1 + i)
        p.decide(view(0.01 * i, running=(r,)))
    assert p.bsz == 18
    for i in range(10, 20):
        p.decide(view(0.01 * i, running=(seq("r", outputs=1 + i),)))
    assert p.bsz == 20
    fixed = policy(adaptive_batch=False, max_num_seqs=32)
    fixed.decide(view(0.0, running=(r,)))
    assert fixed.bsz == 32


def _two_rt_one_full_batch(e_a: float, e_c: float) -> list[str]:
    """Bsz 2, RT a and c with their last tokens `e_a` / `e_c` ago, one intact BE decode j."""
    p = policy(bsz_init=2, max_num_seqs=2, bsz_step=0)
    p.decide(view(0.0, running=(seq("a", outputs=2), seq("c", outputs=2))))
    now = 0.2
    a, c = seq("a", outputs=2), seq("c", outputs=2)
    p._tokens[a.id] = (2, now - e_a)  # their last tokens came out e ago
    p._tokens[c.id] = (2, now - e_c)
    j = seq("j", outputs=5, rt=False)
    return ids(p.decide(view(now, running=(a, c, j))).chunks)


def test_be_replaces_a_deferrable_rt_only() -> None:
    # a waited 0.15 s (τ 0.05), c just got its token (τ 0.2): c can skip a step, j takes its seat.
    assert _two_rt_one_full_batch(0.15, 0.0) == ["a", "j"]
    # Both close to their deadlines (τ 0.04 and 0.03): neither can skip, nothing is replaced.
    assert _two_rt_one_full_batch(0.16, 0.17) == ["c", "a"]


def test_be_without_replacement_switch() -> None:
    p = policy(bsz_init=2, max_num_seqs=2, bsz_step=0, be_replace=False)
    p.decide(view(0.0, running=(seq("a", outputs=2), seq("c", outputs=2))))
    d = p.decide(
        view(0.2, running=(seq("a", outputs=3), seq("c", outputs=3), seq("j", 9, 5, rt=False)))
    )
    assert sorted(ids(d.chunks)) == ["a", "c"]


def test_intact_be_go_before_be_that_recompute() -> None:
    p = policy(bsz_init=3, max_num_seqs=3, bsz_step=0)
    rt = seq("a", outputs=2)
    lost = seq("lost", prompt=200, outputs=10, computed=0, rt=False, arrival_s=-5.0)
    intact = seq("intact", prompt=200, outputs=10, rt=False, arrival_s=0.0)
    fresh = seq("fresh", prompt=300, rt=False, arrival_s=1.0)
    d = p.decide(view(2.0, running=(rt, intact), waiting=(lost, fresh)))
    assert ids(d.chunks) == ["a", "intact", "fresh"]


def test_rt_takes_be_blocks_when_memory_is_full() -> None:
    p = policy()
    big = seq("big", prompt=320, outputs=5, rt=False)  # 21 blocks
    small = seq("small", prompt=150, outputs=5, rt=False)  # 10 blocks
    new_rt = seq("rt", prompt=100, arrival_s=0.0)  # needs 7 blocks
    d = p.decide(view(0.01, running=(big, small), waiting=(new_rt,), free=0))
    assert d.preempt == (RequestId("small"),)  # fewest blocks first: the least BE work lost
    assert ids(d.chunks)[0] == "rt"
    assert p.last_stop is Stop.EXHAUSTED


def test_rt_checkpoints_only_the_blocks_it_lacks() -> None:
    p = policy()
    big = seq("big", prompt=320, outputs=5, rt=False)  # 324 computed, 21 blocks
    small = seq("small", prompt=150, outputs=5, rt=False)  # 10 blocks
    new_rt = seq("rt", prompt=100, arrival_s=0.0)  # needs 7 blocks
    d = p.decide(view(0.01, running=(big, small), waiting=(new_rt,), free=0, host=1000))
    assert d.checkpoint == ((RequestId("big"), 7),)  # the BE with the most blocks, its tail
    assert d.preempt == ()
    assert d.swap_out == ()
    assert ids(d.chunks)[0] == "rt"
    assert "big" not in ids(d.chunks)  # it sits this step out; "small" still runs
    assert "small" in ids(d.chunks)


def test_checkpoint_falls_back_to_swap_then_recompute() -> None:
    p = policy()
    a = seq("a", prompt=150, outputs=5, rt=False)  # 154 computed, 10 blocks
    b = seq("b", prompt=36, outputs=5, rt=False)  # 40 computed, 3 blocks
    new_rt = seq("rt", prompt=100)  # needs 7 blocks
    # a's last 7 blocks hold 106 tokens: too many for 60; b's 3 blocks (40 tokens, all of it:
    # the engine swaps it out) fit; a must then go whole, which the host cannot hold: recompute.
    d = p.decide(view(0.01, running=(a, b), waiting=(new_rt,), free=0, host=60))
    assert d.checkpoint == ((RequestId("b"), 3),)
    assert d.preempt == (RequestId("a"),)
    assert ids(d.chunks) == ["rt"]
    # With room for a's tail, only a's last 7 blocks go (most blocks first).
    d = policy().decide(view(0.01, running=(a, b), waiting=(new_rt,), free=0, host=200))
    assert d.checkpoint == ((RequestId("a"), 7),)
    assert d.preempt == ()
    assert d.swap_out == ()


def test_a_checkpointed_be_reports_its_swap_in_and_regrows() -> None:
    p = policy()
    be = SeqView(
        RequestId("be"), 0.0, 320, 5, 324, 1000, 14, slo_class=BEST_EFFORT, checkpointed_tokens=100
    )
    fresh = seq("fresh", prompt=40, rt=False, arrival_s=0.5)
    d = p.decide(view(1.0, running=(be,), waiting=(fresh,), free=100, host=0))
    assert ids(d.chunks) == ["fresh", "be"]  # intact (fresh) BE first: by checkpointed tokens
    d = policy().decide(view(1.0, running=(be,), free=6))  # 7 blocks to regrow: no room
    assert d.chunks == ()


@pytest.mark.parametrize("swap_rt", [False, True])
def test_idle_rt_victims_recompute_unless_swap_rt(swap_rt: bool) -> None:
    p = policy(swap_rt=swap_rt)
    p.decide(view(0.0, running=(seq("slack", outputs=2),)))
    idle_rt = seq("slack", prompt=150, outputs=3)  # 10 blocks, its token not due for a while
    urgent = seq("rt", prompt=100, arrival_s=-0.3)  # TTFT due in 0.1 s, needs 7 blocks
    p.bsz = 1  # room for one sequence: the urgent one
    d = p.decide(view(0.01, running=(idle_rt,), waiting=(urgent,), free=0, host=10_000))
    assert ids(d.chunks) == ["rt"]
    if swap_rt:
        assert d.swap_out == (RequestId("slack"),)
        assert d.preempt == ()
    else:
        assert d.preempt == (RequestId("slack"),)
        assert d.swap_out == ()


def test_no_eviction_that_cannot_make_room() -> None:
    p = policy()
    be = seq("be", prompt=20, outputs=5, rt=False)  # 2 blocks, decoding within its last block
    new_rt = seq("rt", prompt=100)  # needs 7 blocks
    d = p.decide(view(0.01, running=(be,), waiting=(new_rt,), free=0))
    assert d.preempt == ()
    assert p.last_stop is Stop.BLOCKS
    assert ids(d.chunks) == ["be"]  # the step still runs what fits


@pytest.mark.parametrize("reserve", [True, False])
def test_be_prompts_leave_the_blocks_rt_needs_next(reserve: bool) -> None:
    p = policy(reserve_for_rt=reserve)
    rt = seq("a", outputs=2)
    big_rt = seq("b", prompt=320)  # needs 20 blocks: more than free + every idle BE holds
    be_decode = seq("d", prompt=20, outputs=5, rt=False)  # 2 blocks, needs none this step
    be_prompt = seq("p", prompt=40, rt=False, arrival_s=1.0)  # needs 3 blocks
    d = p.decide(view(1.5, running=(rt, be_decode), waiting=(big_rt, be_prompt), free=10))
    assert p.last_stop is Stop.BLOCKS
    assert ids(d.chunks) == (["a", "d"] if reserve else ["a", "d", "p"])


def test_late_rt_run_after_reachable_and_before_be() -> None:
    p = policy()
    p.decide(view(0.0, running=(seq("y", outputs=2),)))
    late = seq("x", prompt=100, arrival_s=-1.0)  # its TTFT deadline passed 0.6 s ago
    d = p.decide(
        view(0.01, running=(seq("y", outputs=3), seq("z", outputs=4, rt=False)), waiting=(late,))
    )
    assert ids(d.chunks) == ["y", "x", "z"]
    only_late = policy()
    d = only_late.decide(view(0.01, waiting=(late, seq("w", 900, arrival_s=-2.0))))
    assert ids(d.chunks)[0] == "w"  # most overdue first; never an empty step


def test_no_bicache_recomputes_the_rt_that_cannot_grow() -> None:
    p = policy(kv_sharing=False)
    be = seq("be", prompt=320, outputs=5, rt=False)
    rt = seq("rt", prompt=32, outputs=1, computed=32, blocks=2)  # its next token needs block 3
    d = p.decide(view(0.01, running=(rt, be), free=0))
    assert d.preempt == (RequestId("rt"),)
    assert "rt" not in ids(d.chunks)


def test_round_robin_alternates_classes() -> None:
    p = policy(scheduler="rr")
    rt = seq("rt", outputs=2)
    be = seq("be", outputs=2, rt=False)
    served = [ids(p.decide(view(0.01 * i, running=(rt, be))).chunks) for i in range(4)]
    assert served == [["rt"], ["be"], ["rt"], ["be"]]
    only_be = ids(p.decide(view(0.1, running=(be,))).chunks)
    assert only_be == ["be"]  # an empty turn goes to the other class


def test_cost_model_fits_the_profile() -> None:
    latency = default_latency()
    cm = CostModel.profile(latency)
    rng = random.Random(0)
    errors = []
    for _ in range(200):
        if rng.random() < 0.5:
            shape = BatchShape(tuple((rng.randint(1, 1024), 0) for _ in range(rng.randint(1, 8))))
        else:
            shape = BatchShape((), tuple(rng.randint(16, 1500) for _ in range(rng.randint(1, 200))))
        y = latency.step_s(shape)
        errors.append(abs(cm.estimate_shape(shape) - y) / y)
    assert sum(errors) / len(errors) < 0.10  # the paper's linear fit, MAPE under 10 %
    mixed = BatchShape(((512, 0),), (300,) * 32)
    joint = CostModel(cm.prefill, cm.decode, sum_intercepts=False)
    assert joint.estimate_shape(mixed) < cm.estimate_shape(mixed)  # one fixed cost, not two


# -- validity and liveness (hypothesis) -----------------------------------------------------------


@st.composite
def views(draw: st.DrawFn) -> StepView:
    n = draw(st.integers(0, 12))
    running: list[SeqView] = []
    waiting: list[SeqView] = []
    for i in range(n):
        prompt = draw(st.integers(1, 600))
        rt = draw(st.booleans())
        kind = draw(st.sampled_from(["waiting", "decoding", "preempted", "remote"]))
        arrival = draw(st.floats(0.0, 5.0))
        if kind == "decoding":
            outputs = draw(st.integers(1, 50))
            s = seq(f"s{i}", prompt, outputs, arrival_s=arrival, rt=rt)
            lost = draw(st.integers(0, s.blocks_held - 1))  # blocks checkpointed away
            if lost:
                computed = s.num_computed_tokens
                held = s.blocks_held - lost
                s = SeqView(
                    s.id,
                    arrival,
                    prompt,
                    outputs,
                    computed,
                    1000,
                    held,
                    slo_class=s.slo_class,
                    checkpointed_tokens=computed - held * 16,
                )
            running.append(s)
        elif kind == "preempted":
            outputs = draw(st.integers(1, 50))
            waiting.append(seq(f"s{i}", prompt, outputs, computed=0, arrival_s=arrival, rt=rt))
        elif kind == "remote":
            cls = REALTIME if rt else BEST_EFFORT
            waiting.append(
                SeqView(RequestId(f"s{i}"), arrival, prompt, 1, 0, 100, 0, True, 0, None, cls)
            )
        else:
            waiting.append(seq(f"s{i}", prompt, arrival_s=arrival, rt=rt))
    waiting.sort(key=lambda s: s.arrival_s)
    free = draw(st.integers(0, 120))
    host = draw(st.sampled_from([0, 100, 1 << 20]))
    now = draw(st.floats(5.0, 10.0))
    return StepView(now, tuple(waiting), tuple(running), free, 10_000, 16, (), host)


def assert_valid(v: StepView, d: StepDecision) -> None:
    """`EngineModel._validate`'s rules, over a view."""
    by_id = {s.id: s for s in (*v.running, *v.waiting)}
    running = {s.id for s in v.running}
    free = v.free_blocks
    host = v.host_free_tokens
    seen: set[RequestId] = set()
    chunks = d.chunks
    for rid in d.preempt:
        assert rid in running
        assert rid not in seen
        free += by_id[rid].blocks_held
        seen.add(rid)
    for rid in d.swap_out:
        assert rid in running
        assert rid not in seen
        s = by_id[rid]
        host -= s.num_computed_tokens - s.checkpointed_tokens
        free += s.blocks_held
        seen.add(rid)
    for rid, k in d.checkpoint:
        assert rid in running
        assert rid not in seen
        s = by_id[rid]
        assert 0 < k <= s.blocks_held
        on_gpu = s.num_computed_tokens - s.checkpointed_tokens
        host -= max(0, on_gpu - (s.blocks_held - k) * v.block_size)
        free += k
        seen.add(rid)
    assert host >= 0
    for rid, n in chunks:
        s = by_id[rid]
        assert rid not in seen
        seen.add(rid)
        if s.remote_kv:
            tokens = s.num_prompt_tokens
        else:
            assert 1 <= n <= s.num_uncomputed_tokens
            tokens = s.num_computed_tokens + n
        free -= max(0, -(-tokens // v.block_size) - s.blocks_held)
        assert free >= 0


@settings(max_examples=150, deadline=None)
@given(views(), st.sampled_from(["bros", "rr"]), st.booleans(), st.integers(1, 16))
def test_decisions_are_valid_and_never_empty(
    v: StepView, scheduler: str, kv_sharing: bool, bsz: int
) -> None:
    p = policy(scheduler=scheduler, kv_sharing=kv_sharing, bsz_init=bsz)
    d = p.decide(v)
    assert_valid(v, d)
    runnable = [s for s in (*v.running, *v.waiting) if s.remote_kv or s.num_uncomputed_tokens > 0]
    evictable = sum(r.blocks_held for r in v.running)
    fits = any(
        -(-(s.num_prompt_tokens if s.remote_kv else s.num_known_tokens) // 16) - s.blocks_held
        <= v.free_blocks + evictable - (s.blocks_held if s in v.running else 0)
        for s in runnable
    )
    if runnable and fits:
        assert not d.is_empty
    assert p.params.bsz_init <= p.bsz <= p.params.max_num_seqs


@settings(max_examples=100, deadline=None)
@given(views(), st.integers(1, 5000))
def test_decisions_never_read_max_tokens(v: StepView, cap: int) -> None:
    def capped(s: SeqView) -> SeqView:
        return SeqView(
            s.id,
            s.arrival_s,
            s.num_prompt_tokens,
            s.num_output_tokens,
            s.num_computed_tokens,
            cap,
            s.blocks_held,
            s.remote_kv,
            s.priority,
            s.deadline_s,
            s.slo_class,
            s.predicted_output_tokens,
            s.checkpointed_tokens,
        )

    other = StepView(
        v.now_s,
        tuple(map(capped, v.waiting)),
        tuple(map(capped, v.running)),
        v.free_blocks,
        v.total_blocks,
        v.block_size,
        v.finished,
        v.host_free_tokens,
    )
    assert policy().decide(v) == policy().decide(other)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 300), st.integers(1, 40), st.booleans(), st.floats(0.0, 2.0)),
        min_size=1,
        max_size=14,
    ),
    st.integers(30, 80),
    st.sampled_from(["bros", "rr"]),
    st.booleans(),
    st.sampled_from([0, 64, 1 << 20]),
    st.booleans(),
)
def test_engine_runs_every_workload_to_completion(
    jobs: list[tuple[int, int, bool, float]],
    num_blocks: int,
    scheduler: str,
    kv_sharing: bool,
    host: int,
    swap_rt: bool,
) -> None:
    p = policy(scheduler=scheduler, kv_sharing=kv_sharing, swap_rt=swap_rt)
    engine = EngineModel(p, BlockManager(num_blocks, 16), tokens=None, host_swap_tokens=host)
    for i, (prompt, out, rt, at) in enumerate(sorted(jobs, key=lambda j: j[3])):
        if -(-(prompt + out) // 16) > num_blocks:
            continue
        cls = REALTIME if rt else BEST_EFFORT
        req = Request(
            RequestId(f"q{i}"), (1,) * prompt, SamplingSpec(out, ignore_eos=True), at, slo_class=cls
        )
        engine.add(req, RequestMode.GENERATE)
    now = 2.0
    for _ in range(5000):
        step = engine.schedule(now)  # raises on an invalid decision
        if step is None:
            break
        now += 0.02
        engine.complete(step, now)
    assert not engine.has_runnable_work
    assert engine.host_used_tokens == 0


# -- params and registry --------------------------------------------------------------------------


def test_make_through_the_registry_builds_paper_defaults() -> None:
    p = make_batching_policy("bros")
    assert isinstance(p, BrosPolicy)
    assert p.name == "bros"
    assert p.steady_decode is False
    assert p.params.bsz_init == 8
    assert p.params.bsz_step == 1
    assert p.params.max_num_seqs == 256
    slo = p.slos[REALTIME]
    assert (slo.ttft_ms, slo.tpot_ms) == (400.0, 200.0)
    assert p.params.scheduler is Scheduler.BROS
    rr = make_batching_policy("bros", scheduler="rr", realtime=())
    assert isinstance(rr, BrosPolicy)
    assert rr.params.scheduler is Scheduler.ROUND_ROBIN
    assert SloClassName("realtime") not in rr.slos


@pytest.mark.parametrize(
    "bad",
    [
        {"bsz_init": 0},
        {"bsz_init": 300},
        {"bsz_step": -1},
        {"group_size": 0},
        {"ewma_alpha": 0.0},
        {"scheduler": "lifo"},
    ],
)
def test_params_validate(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"bsz|group_size|ewma_alpha|Scheduler"):
        BrosParams(**bad)  # type: ignore[arg-type]


def test_token_groups_share_one_budget() -> None:
    p = policy(group_size=4)
    p.decide(view(0.0, running=(seq("a", outputs=1),)))  # first token out at 0: group starts
    p.decide(view(0.05, running=(seq("a", outputs=2),)))  # mid-group: the start stays at 0
    assert p._tokens[RequestId("a")] == (2, 0.0)
    p.decide(view(0.3, running=(seq("a", outputs=5),)))  # group of 4 done: a new one starts
    assert p._tokens[RequestId("a")] == (5, 0.3)
