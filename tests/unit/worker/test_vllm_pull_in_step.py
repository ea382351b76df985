"""`nixl.PullInStep` against fakes of vLLM 0.32's NIXL connector (scheduler and worker sides).

The real connector is exercised by `tests/contract/vllm/test_vllm_engine_pd.py`
(`test_a_multi_block_prompt_is_pulled_in_the_step_that_yields_token_2`); here: which requests
are loaded in-step, that their reads are finished before the forward, that the connector is
handed every block, and what the scheduler is (not) told.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from splitserve.worker.vllm_adapter.engine import PULL_IN_STEP_ENV, VllmEngineConfig, pull_in_step
from splitserve.worker.vllm_adapter.nixl import PullInStep

KEY = "splitserve_prefilled_tokens"


@dataclass
class Results:
    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)


class FakeNixl:
    """A READ is PROC for `polls` checks, then DONE (or ERR)."""

    def __init__(self) -> None:
        self.left: dict[int, int] = {}
        self.final: dict[int, str] = {}
        self.checks = 0

    def check_xfer_state(self, handle: int) -> str:
        self.checks += 1
        if self.left.get(handle, 0) > 0:
            self.left[handle] -= 1
            return "PROC"
        return self.final.get(handle, "DONE")


class FakeWorker:
    """vLLM's NixlPullConnectorWorker, as far as PullInStep touches it."""

    def __init__(self) -> None:
        self.nixl_wrapper = FakeNixl()
        self._remote_agents: dict[str, dict[Any, str]] = {"P": {(0, 0): "agent-p"}}
        self._invalid_remote_engines: set[str] = set()
        self._is_hma_required = False
        self._recving_transfers: dict[str, list[int]] = {}
        self._recving_metadata: dict[str, Any] = {}
        self.sending: set[str] = set()
        self.posted: list[str] = []
        self.forward_saw: list[str] = []
        self.retain: set[int] = set()
        """Handles kept for one more collection (a failed read vLLM could not release yet)."""

    def start_load_kv(self, metadata: Any) -> None:
        for rid, polls in metadata.reqs_to_recv.items():
            handle = len(self.posted) + 1
            self.posted.append(rid)
            self._recving_metadata[rid] = object()
            self._recving_transfers[rid] = [handle]
            self.nixl_wrapper.left[handle] = polls

    def get_transfer_results(self) -> Results:
        done = set()
        for rid, handles in list(self._recving_transfers.items()):
            if any(h in self.retain for h in handles):
                self.retain -= set(handles)
                continue
            if all(self.nixl_wrapper.check_xfer_state(h) != "PROC" for h in handles):
                done.add(rid)
                del self._recving_transfers[rid]
                del self._recving_metadata[rid]
        sending, self.sending = self.sending, set()
        return Results(finished_sending=sending, finished_recving=done)


BLOCK = 16


@dataclass
class Block:
    block_id: int
    block_hash: int | None = None


class FakeKvCacheManager:
    """vLLM's KVCacheManager: allocation hashes the full blocks of what is computed after the
    step, unless told to delay (as vLLM does for async loads); `cache_blocks` hashes later."""

    max_model_len = 1000

    def __init__(self) -> None:
        self.blocks: dict[str, list[Block]] = {}
        self.cached: dict[str, int] = {}

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        **_: Any,
    ) -> list[Block]:
        total = (
            request.num_computed_tokens
            + num_new_computed_tokens
            + num_external_computed_tokens
            + num_new_tokens
        )
        first = sum(len(b) for b in self.blocks.values())
        self.blocks[request.request_id] = [Block(first + i) for i in range(-(-total // BLOCK))]
        if not delay_cache_blocks:
            self.cache_blocks(request, min(total, request.num_tokens))
        return self.blocks[request.request_id]

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        self.cached[request.request_id] = num_computed_tokens
        for block in self.blocks[request.request_id][: num_computed_tokens // BLOCK]:
            block.block_hash = block.block_id


class FakeConnector:
    """vLLM's scheduler-side NixlConnector: every remote prefill loads async; after allocation
    it reads into the unhashed blocks only."""

    def __init__(self) -> None:
        self.heartbeats: set[str] = set()
        self.connector_scheduler = SimpleNamespace(
            _stop_heartbeat=self.heartbeats.discard, block_size=BLOCK
        )
        self.allocated: list[str] = []
        self.to_read: dict[str, list[int]] = {}

    def get_num_new_matched_tokens(self, request: Any, num_computed: int) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill"):
            return len(request.prompt_token_ids) - 1 - num_computed, True
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external: int) -> None:
        self.allocated.append(request.request_id)
        if blocks is not None:
            self.to_read[request.request_id] = [b.block_id for b in blocks if b.block_hash is None]


def _request(rid: str, engine: str = "P", handoff: bool = True, prompt: int = 11) -> Any:
    params: dict[str, Any] = {"do_remote_prefill": True, "remote_engine_id": engine}
    if handoff:
        params[KEY] = prompt - 1
    return SimpleNamespace(
        request_id=rid,
        prompt_token_ids=list(range(prompt)),
        kv_transfer_params=params,
        num_tokens=prompt,
        num_computed_tokens=0,
    )


def _setup() -> tuple[PullInStep, FakeConnector, FakeWorker]:
    hook, connector, worker, _ = _setup_with_kv()
    return hook, connector, worker


def _setup_with_kv() -> tuple[PullInStep, FakeConnector, FakeWorker, FakeKvCacheManager]:
    connector, worker, kv = FakeConnector(), FakeWorker(), FakeKvCacheManager()
    scheduler = SimpleNamespace(connector=connector, kv_cache_manager=kv)
    hook = PullInStep.install(scheduler, worker, KEY)
    assert hook is not None
    return hook, connector, worker, kv


def _admit(connector: FakeConnector, kv: FakeKvCacheManager, req: Any) -> list[Block]:
    """What vLLM's scheduler does for a waiting request: match, allocate, tell the connector."""
    count, is_async = connector.get_num_new_matched_tokens(req, 0)
    new_tokens = 0 if is_async else req.num_tokens - count
    blocks = kv.allocate_slots(
        req,
        new_tokens,
        num_new_computed_tokens=0,
        new_computed_blocks=None,
        num_external_computed_tokens=count,
        delay_cache_blocks=is_async,
    )
    connector.update_state_after_alloc(req, blocks, count)
    return blocks


def _step(connector: FakeConnector, worker: FakeWorker, reqs: dict[str, int]) -> Results:
    """One engine step as vLLM runs it: load (before the forward for sync loads), results."""
    worker.start_load_kv(SimpleNamespace(reqs_to_recv=reqs))
    left = worker.nixl_wrapper.left  # reads still in progress when the forward runs
    worker.forward_saw = [
        r for r in reqs if any(left[h] for h in worker._recving_transfers.get(r, ()))
    ]
    return worker.get_transfer_results()


def test_a_handoff_from_a_known_engine_is_loaded_in_the_step_that_schedules_it() -> None:
    hook, connector, worker = _setup()
    req = _request("d1")
    connector.heartbeats.add("d1")
    assert connector.get_num_new_matched_tokens(req, 0) == (10, False)
    connector.update_state_after_alloc(req, None, 10)
    assert "d1" not in connector.heartbeats, "no lease to keep alive: the read is in this step"
    worker.sending.add("p9")
    results = _step(connector, worker, {"d1": 3})  # the READ is PROC for three polls
    assert worker.forward_saw == [], "the read was finished before the forward"
    assert worker.nixl_wrapper.checks >= 4
    # The scheduler expects completions only for parked requests: d1 is running, so not
    # reported; what the early collection found for others is.
    assert results.finished_recving == set()
    assert results.finished_sending == {"p9"}
    assert hook.count == 1


def test_an_in_step_load_is_reported_to_the_pull_timer_once_read() -> None:
    connector, worker, kv = FakeConnector(), FakeWorker(), FakeKvCacheManager()
    ok, failed = _request("ok"), _request("bad")
    requests = {"ok": ok, "bad": failed}
    scheduler = SimpleNamespace(connector=connector, kv_cache_manager=kv, requests=requests)
    hook = PullInStep.install(scheduler, worker, KEY)
    assert hook is not None
    seen: list[tuple[str, bool, int, int]] = []
    hook.on_received = lambda r, good, tokens: seen.append(
        (r.request_id, good, tokens, worker.nixl_wrapper.left[1])
    )
    _admit(connector, kv, ok)
    _admit(connector, kv, failed)
    ok.num_computed_tokens = failed.num_computed_tokens = 11  # vLLM counts the step's token
    worker.nixl_wrapper.final[2] = "ERR"
    original = hook._results  # the worker's own (its attribute is the hook's now)

    def results() -> Results:
        out: Results = original()
        out.failed_recving |= out.finished_recving & {"bad"}
        return out

    hook._results = results
    _step(connector, worker, {"ok": 2, "bad": 0})
    # After the READ, before the forward; the tokens with the KV in, not the step's one.
    assert seen == [("bad", False, 10, 0), ("ok", True, 10, 0)]


def test_async_loads_keep_vllms_path() -> None:
    hook, connector, worker = _setup()
    cold = _request("cold", engine="Q")  # no handshake with Q yet: vLLM handshakes on demand
    plain = _request("plain", handoff=False)  # not a decode continued from a first token
    assert connector.get_num_new_matched_tokens(cold, 0) == (10, True)
    assert connector.get_num_new_matched_tokens(plain, 0) == (10, True)
    worker._invalid_remote_engines.add("P")
    assert connector.get_num_new_matched_tokens(_request("bad"), 0) == (10, True)
    results = _step(connector, worker, {"cold": 1, "plain": 0})
    assert worker.forward_saw == ["cold"], "async reads are not waited for"
    assert results.finished_recving == {"plain"}
    assert _step(connector, worker, {}).finished_recving == {"cold"}
    assert hook.count == 0


def test_a_model_on_vllms_hybrid_allocator_keeps_the_async_path() -> None:
    _, connector, worker = _setup()
    worker._is_hma_required = True
    assert connector.get_num_new_matched_tokens(_request("d1"), 0) == (10, True)


def test_a_request_not_scheduled_this_step_is_chosen_again_next_time() -> None:
    hook, connector, worker = _setup()
    req = _request("d1")
    assert connector.get_num_new_matched_tokens(req, 0) == (10, False)
    _step(connector, worker, {})  # not allocated: nothing posted, nothing waited for
    assert hook.count == 0
    assert connector.get_num_new_matched_tokens(req, 0) == (10, False)
    assert _step(connector, worker, {"d1": 1}).finished_recving == set()
    assert hook.count == 1


def test_an_in_step_load_reported_late_stays_hidden() -> None:
    """A failed read whose handle vLLM could not release yet is over for the wait (ERR is not
    PROC) but is reported a step later: never as a finished receive of a running request."""
    hook, connector, worker = _setup()
    assert connector.get_num_new_matched_tokens(_request("d1"), 0) == (10, False)
    worker.retain.add(1)
    worker.nixl_wrapper.final[1] = "ERR"
    assert _step(connector, worker, {"d1": 0}).finished_recving == set()
    assert hook._hidden == set(), "reported (and hidden) at the end of the step"
    assert hook.count == 1


def test_a_prompt_over_several_blocks_hands_the_connector_every_block() -> None:
    """vLLM's sync path hashes the new blocks at allocation and NixlConnector reads only into
    unhashed ones: undelayed, a 3-block prompt would read its last block alone. In-step, the
    connector sees every block (as on the async path), and the blocks are cached after it."""
    _, connector, _worker, kv = _setup_with_kv()
    for prompt in (40, 48, 49):  # prompt + first token: 2.5 blocks, exactly 3, just over 3
        rid = f"long-{prompt}"
        blocks = _admit(connector, kv, _request(rid, prompt=prompt))
        assert len(blocks) == -(-prompt // BLOCK)
        # The blocks the prefill's KV covers (prompt - 1 tokens), not token 1's own new block.
        covered = -(-(prompt - 1) // BLOCK)
        assert connector.to_read[rid] == [b.block_id for b in blocks[:covered]], prompt
        assert kv.cached[rid] == prompt, "cached up to the first token's position, as vLLM does"
        assert all(b.block_hash is not None for b in blocks[: prompt // BLOCK])


def test_without_the_hook_the_sync_load_would_read_the_last_block_only() -> None:
    """The fake reproduces the problem the hook exists for (so the test above can fail)."""
    connector, kv = FakeConnector(), FakeKvCacheManager()
    req = _request("plain-sync", prompt=40)
    blocks = kv.allocate_slots(req, 1, num_external_computed_tokens=39)
    connector.update_state_after_alloc(req, blocks, 39)
    assert connector.to_read["plain-sync"] == [blocks[-1].block_id]


def test_async_admissions_and_running_requests_allocate_as_vllm_does() -> None:
    _, connector, _worker, kv = _setup_with_kv()
    cold = _request("cold", engine="Q", prompt=40)  # no handshake with Q: async, delayed by vLLM
    _admit(connector, kv, cold)
    assert connector.to_read["cold"] == [b.block_id for b in kv.blocks["cold"]]
    assert "cold" not in kv.cached, "cached when vLLM sees the async load finish"
    local = SimpleNamespace(
        request_id="local", kv_transfer_params=None, num_tokens=20, num_computed_tokens=0
    )
    kv.allocate_slots(local, 20)
    assert kv.cached["local"] == 20


def test_a_setup_without_a_kv_cache_manager_is_not_hooked() -> None:
    scheduler = SimpleNamespace(connector=FakeConnector())
    assert PullInStep.install(scheduler, FakeWorker(), KEY) is None


def test_the_in_step_pull_is_opt_in_by_config_or_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PULL_IN_STEP_ENV, raising=False)
    assert pull_in_step(VllmEngineConfig(model="m")) is False
    assert pull_in_step(VllmEngineConfig(model="m", kv_pull_in_step=True)) is True
    monkeypatch.setenv(PULL_IN_STEP_ENV, "0")
    assert pull_in_step(VllmEngineConfig(model="m", kv_pull_in_step=True)) is False
    monkeypatch.setenv(PULL_IN_STEP_ENV, "1")
    assert pull_in_step(VllmEngineConfig(model="m", kv_pull_in_step=False)) is True
    monkeypatch.setenv(PULL_IN_STEP_ENV, "yes")
    with pytest.raises(ValueError, match="SPLITSERVE_KV_PULL_IN_STEP must be 0 or 1"):
        pull_in_step(VllmEngineConfig(model="m"))
