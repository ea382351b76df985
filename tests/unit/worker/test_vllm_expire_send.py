"""A cancelled finished prefill ends its NIXL send lease (`nixl.expire_send`): the lease lives
on the scheduler side (`_reqs_need_send`, until the next step ships it) or on the worker side
(`_reqs_to_send`); both deadlines become now, so vLLM's `_reap_expired_send_leases` frees the
blocks on its next step. Its "Releasing expired KV blocks" warning is dropped for those ids
only. Fake scheduler / worker objects shaped like vLLM 0.32's; no engine runs here."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from splitserve.worker.vllm_adapter import nixl
from splitserve.worker.vllm_adapter.engine import VllmEngine, VllmEngineConfig
from splitserve.worker.vllm_adapter.nixl import _EXPIRY_FILTER, expire_send, kv_state

_WARNING = (
    "Releasing expired KV blocks for request %s which were "
    "retrieved by %d remote worker(s) before lease expired."
)


def _scheduler(need_send: dict[str, float] | None = None) -> Any:
    connector = SimpleNamespace(connector_scheduler=SimpleNamespace(_reqs_need_send=need_send))
    return SimpleNamespace(connector=connector)


def _worker(to_send: dict[str, float] | None = None) -> Any:
    return SimpleNamespace(_reqs_to_send=to_send, _reqs_to_process=set(to_send or {}))


@pytest.fixture(autouse=True)
def _clean_filter() -> Any:
    _EXPIRY_FILTER.ids.clear()
    yield
    _EXPIRY_FILTER.ids.clear()


def test_a_lease_not_yet_shipped_expires_on_the_scheduler_side() -> None:
    need = {"r1": 130.0, "other": 130.0}
    assert expire_send(_scheduler(need), _worker({}), "r1", now=100.0) is True
    assert need == {"r1": 100.0, "other": 130.0}  # only this request's deadline moves


def test_a_shipped_lease_expires_on_the_worker_side() -> None:
    to_send = {"r1": 5030.0, "other": 5030.0}
    assert expire_send(_scheduler({}), _worker(to_send), "r1", now=5000.0) is True
    assert to_send == {"r1": 5000.0, "other": 5030.0}


def test_both_places_expire_when_both_hold_the_id() -> None:
    need, to_send = {"r1": 130.0}, {"r1": 130.0}
    assert expire_send(_scheduler(need), _worker(to_send), "r1", now=7.0) is True
    assert need == to_send == {"r1": 7.0}


def test_an_absent_id_changes_nothing_and_says_false() -> None:
    need, to_send = {"x": 130.0}, {"y": 130.0}
    assert expire_send(_scheduler(need), _worker(to_send), "r1", now=7.0) is False
    assert need == {"x": 130.0}
    assert to_send == {"y": 130.0}
    assert "r1" not in _EXPIRY_FILTER.ids  # nothing to quiet


def test_no_connector_or_worker_is_not_an_error() -> None:
    assert expire_send(SimpleNamespace(connector=None), None, "r1", now=7.0) is False
    assert expire_send(_scheduler(None), SimpleNamespace(), "r1", now=7.0) is False


def _record(rid: object, msg: str = _WARNING) -> logging.LogRecord:
    return logging.LogRecord(nixl._WORKER_MODULE, logging.WARNING, "f", 1, msg, (rid, 0), None)


def test_the_filter_drops_the_expiry_warning_of_an_expired_on_purpose_lease_once() -> None:
    logger = logging.getLogger(nixl._WORKER_MODULE)
    expire_send(_scheduler({"r1": 130.0}), _worker({}), "r1", now=7.0)
    assert _EXPIRY_FILTER in logger.filters
    assert _EXPIRY_FILTER.filter(_record("r1")) is False  # ours: a cancel, not a lost decode
    assert _EXPIRY_FILTER.filter(_record("r1")) is True  # once only: a later one is logged


def test_the_filter_keeps_every_other_record() -> None:
    expire_send(_scheduler({"r1": 130.0}), _worker({}), "r1", now=7.0)
    assert _EXPIRY_FILTER.filter(_record("r2")) is True  # a real expiry (decode never came)
    assert _EXPIRY_FILTER.filter(_record("r1", msg="Heartbeat extended lease for %s %d")) is True
    odd = _record("r1")
    odd.msg = 42  # a non-string message is not ours to judge
    assert _EXPIRY_FILTER.filter(odd) is True
    assert _EXPIRY_FILTER.ids == {"r1"}


def test_the_filter_ids_stay_bounded_when_never_reaped() -> None:
    _EXPIRY_FILTER.ids.update(str(i) for i in range(10_001))
    expire_send(_scheduler({"r1": 130.0}), _worker({}), "r1", now=7.0)
    assert _EXPIRY_FILTER.ids == {"r1"}


def test_kv_state_reads_scheduler_pool_and_leases() -> None:
    finished = SimpleNamespace(is_finished=lambda: True)
    running = SimpleNamespace(is_finished=lambda: False)
    sched = _scheduler({"b": 1.0})
    sched.requests = {"a": finished, "c": running}
    sched.kv_cache_manager = SimpleNamespace(
        block_pool=SimpleNamespace(get_num_free_blocks=lambda: 12)
    )
    sched.has_requests = lambda: True
    state = kv_state(sched, _worker({"a": 3.0}))
    assert state == {
        "requests": ["a", "c"],
        "finished_holding": ["a"],
        "free_blocks": 12,
        "need_send": ["b"],
        "to_send": ["a"],
        "to_process": ["a"],
        "has_requests": True,
    }


class _Commands:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def put(self, item: Any) -> None:
        self.items.append(item)


def test_cancel_of_a_held_prefill_queues_the_expiry_on_the_engine_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from splitserve.worker.vllm_adapter import engine as engine_mod

    calls: list[tuple[Any, Any, str]] = []
    worker = object()
    monkeypatch.setattr(engine_mod, "_nixl_worker", lambda: worker)
    monkeypatch.setattr(engine_mod, "expire_send", lambda s, w, rid: calls.append((s, w, rid)))
    engine = VllmEngine(VllmEngineConfig(model="m"))
    engine._engine = object()  # as if started; the command is only queued here
    commands = _Commands()
    engine._commands = commands  # type: ignore[assignment]
    engine._held["p1"] = (1e18, "p1-internal")  # type: ignore[index]
    assert asyncio.run(engine.cancel("p1")) is True  # type: ignore[arg-type]
    assert engine._held == {}
    assert len(commands.items) == 1
    assert calls == []
    scheduler = object()
    vllm = SimpleNamespace(
        engine_core=SimpleNamespace(engine_core=SimpleNamespace(scheduler=scheduler))
    )
    commands.items[0](vllm)  # what the engine thread does with it
    assert calls == [(scheduler, worker, "p1-internal")]  # vLLM's id, not ours
    assert asyncio.run(engine.cancel("p1")) is False  # type: ignore[arg-type]
    assert len(commands.items) == 1


def test_cancel_without_a_connector_queues_nothing() -> None:
    engine = VllmEngine(VllmEngineConfig(model="m", kv_connector=None))
    engine._engine = object()
    commands = _Commands()
    engine._commands = commands  # type: ignore[assignment]
    engine._held["p1"] = (1e18, "p1")  # type: ignore[index]
    assert asyncio.run(engine.cancel("p1")) is True  # type: ignore[arg-type]
    assert commands.items == []
