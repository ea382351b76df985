"""`nixl.PullInStep` against fakes of vLLM 0.32's NIXL connector (scheduler and worker sides).

The real connector is exercised by `tests/contract/vllm/test_vllm_engine_pd.py`
(`test_decode_starts_from_the_first_token`); here: which requests are loaded in-step, that
their reads are finished before the forward, and what the scheduler is (not) told.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

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


class FakeConnector:
    """vLLM's scheduler-side NixlConnector: every remote prefill loads async."""

    def __init__(self) -> None:
        self.heartbeats: set[str] = set()
        self.connector_scheduler = SimpleNamespace(
            _stop_heartbeat=self.heartbeats.discard, block_size=16
        )
        self.allocated: list[str] = []

    def get_num_new_matched_tokens(self, request: Any, num_computed: int) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        if params.get("do_remote_prefill"):
            return len(request.prompt_token_ids) - 1 - num_computed, True
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external: int) -> None:
        self.allocated.append(request.request_id)


def _request(rid: str, engine: str = "P", handoff: bool = True, prompt: int = 11) -> Any:
    params: dict[str, Any] = {"do_remote_prefill": True, "remote_engine_id": engine}
    if handoff:
        params[KEY] = prompt - 1
    return SimpleNamespace(
        request_id=rid, prompt_token_ids=list(range(prompt)), kv_transfer_params=params
    )


def _setup() -> tuple[PullInStep, FakeConnector, FakeWorker]:
    connector, worker = FakeConnector(), FakeWorker()
    hook = PullInStep.install(SimpleNamespace(connector=connector), worker, KEY)
    assert hook is not None
    return hook, connector, worker


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


def test_a_prompt_longer_than_one_block_keeps_the_async_path() -> None:
    # The sync load pulls only the last block of a longer prompt (vLLM caches the newly
    # allocated blocks at allocation), so those stay on vLLM's own async load.
    hook, connector, _worker = _setup()
    req = _request("long", prompt=40)
    assert connector.get_num_new_matched_tokens(req, 0) == (39, True)
    assert hook.count == 0
