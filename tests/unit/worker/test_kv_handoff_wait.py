"""The prefill side of a steady hand-off: after handing a request's KV out, the engine
progresses NIXL closely (`nixl.WarmupWindow.handed_off` / `wait`) until the decode worker's
READ notification is in, instead of stepping only every `SPLITSERVE_KV_HELD_POLL_MS`; idle
otherwise. Fake clock and fake sleep: no timing is measured here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from splitserve.worker.vllm_adapter.engine import (
    HANDOFF_DEFAULT_MS,
    IDLE_WAIT_S,
    WARMUP_POLL_S,
    VllmEngine,
    VllmEngineConfig,
    _hands_off,
    handoff_ms,
)
from splitserve.worker.vllm_adapter.nixl import WARM_NOTIF, WarmupWindow
from tests.fakes.clock import SleepingClock


class _Agent:
    """A nixl_agent's `get_new_notifs`: batches due at a time on the fake clock."""

    def __init__(self, clock: SleepingClock) -> None:
        self.clock = clock
        self.due: list[tuple[float, dict[str, list[bytes]]]] = []
        self.calls = 0

    def get_new_notifs(self, backends: list[str] | None = None) -> dict[str, list[bytes]]:
        self.calls += 1
        ready = [b for t, b in self.due if t <= self.clock.t]
        self.due = [(t, b) for t, b in self.due if t > self.clock.t]
        out: dict[str, list[bytes]] = {}
        for batch in ready:
            for agent, msgs in batch.items():
                out.setdefault(agent, []).extend(msgs)
        return out


def _window() -> tuple[WarmupWindow, _Agent, SleepingClock]:
    clock = SleepingClock()
    agent = _Agent(clock)
    return WarmupWindow(agent, clock), agent, clock


def test_without_a_hand_off_the_held_wait_is_one_sleep_and_no_poll() -> None:
    window, agent, clock = _window()
    assert window.wait(0.005, 0.0005, clock.sleep) is False
    assert clock.slept == [0.005]
    assert agent.calls == 0
    window.handed_off(0)  # SPLITSERVE_KV_HANDOFF_MS=0: the behaviour before
    assert not window.awaiting
    assert window.wait(0.005, 0.0005, clock.sleep) is False
    assert agent.calls == 0


def test_the_wait_ends_when_the_reads_notification_is_in() -> None:
    window, agent, clock = _window()
    window.handed_off(0.2)
    assert window.awaiting
    agent.due.append((clock.t + 0.0012, {"decode": [b"req-1:1"]}))
    start = clock.t
    assert window.wait(0.005, 0.0005, clock.sleep) is True
    # Progressed every 0.5 ms and returned at the first poll after the notification, not
    # at the held-KV poll's 5 ms.
    assert clock.t - start == pytest.approx(0.0015)
    assert agent.calls == 4
    assert not window.awaiting
    assert (window.handoffs, window.handoffs_notified, window.handoffs_expired) == (1, 1, 0)
    # The notification reaches vLLM's own read (it frees the KV there).
    assert agent.get_new_notifs() == {"decode": [b"req-1:1"]}
    # Back to the plain held-KV poll.
    calls = agent.calls
    assert window.wait(0.005, 0.0005, clock.sleep) is False
    assert agent.calls == calls


def test_a_hand_off_whose_read_never_comes_times_out() -> None:
    window, agent, clock = _window()
    window.handed_off(0.01)
    for _ in range(3):
        assert window.wait(0.005, 0.0005, clock.sleep) is False
    assert not window.awaiting
    assert (window.handoffs_notified, window.handoffs_expired) == (0, 1)
    # 0.5 ms polls for the 10 ms it was awaited (one more where float sums fall short), then none
    assert 20 <= agent.calls <= 21
    assert sum(clock.slept) == pytest.approx(0.015)  # the held-KV cadence is kept


def test_heartbeats_and_warm_ups_do_not_end_a_hand_off() -> None:
    window, agent, clock = _window()
    window.handed_off(0.2)
    agent.due.append((clock.t, {"decode": [WARM_NOTIF, b"HB:req-3,req-4"]}))
    assert window.progress() is False
    assert window.awaiting
    assert window.warm_notifs == 1
    assert agent.get_new_notifs() == {"decode": [b"HB:req-3,req-4"]}, "vLLM still gets it"


def test_two_hand_offs_are_ended_by_two_notifications() -> None:
    window, agent, clock = _window()
    window.handed_off(0.2)
    window.handed_off(0.2)
    agent.due.append((clock.t, {"d": [b"req-1:1"]}))
    assert window.progress() is True
    assert window.awaiting, "one READ is still to come"
    agent.due.append((clock.t, {"d": [b"req-2:1", b"req-9:1"]}))  # one more than expected
    assert window.progress() is True
    assert not window.awaiting
    assert window.handoffs_notified == 2


def test_a_notification_vllm_reads_itself_ends_the_hand_off() -> None:
    """vLLM's step may read the READ's notification first (through the wrapped agent): the
    hand-off must end then too, or the engine would poll on for its whole time."""
    window, agent, clock = _window()
    window.handed_off(0.2)
    agent.due.append((clock.t, {"d": [b"HB:req-2", b"req-1:1"]}))
    assert agent.get_new_notifs() == {"d": [b"HB:req-2", b"req-1:1"]}  # vLLM's own read
    assert not window.awaiting
    assert window.handoffs_notified == 1
    calls = agent.calls
    assert window.wait(0.005, 0.0005, clock.sleep) is False
    assert agent.calls == calls


def test_the_engine_thread_polls_closely_while_a_hand_off_is_awaited() -> None:
    window, _agent, clock = _window()
    engine = VllmEngine(VllmEngineConfig(model="m"))
    engine._warmup = window
    assert engine._idle_wait_s() == IDLE_WAIT_S
    window.handed_off(0.2)
    assert engine._idle_wait_s() == WARMUP_POLL_S
    clock.t += 0.2
    assert engine._idle_wait_s() == IDLE_WAIT_S


def _out(finished: bool, kvp: dict[str, Any] | None) -> Any:
    return SimpleNamespace(finished=finished, kv_transfer_params=kvp)


def test_only_a_finished_prefill_holding_blocks_is_a_hand_off() -> None:
    held = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]]}
    assert _hands_off(_out(True, held))
    assert not _hands_off(_out(False, held))
    assert not _hands_off(_out(True, None))
    assert not _hands_off(_out(True, {"do_remote_prefill": True, "remote_block_ids": [[]]}))
    assert not _hands_off(_out(True, {"do_remote_decode": True, "remote_block_ids": [[1]]}))


def test_handoff_ms_is_read_or_refused() -> None:
    assert handoff_ms({}) == HANDOFF_DEFAULT_MS
    assert handoff_ms({"SPLITSERVE_KV_HANDOFF_MS": "0"}) == 0
    assert handoff_ms({"SPLITSERVE_KV_HANDOFF_MS": "50"}) == 50
    for bad in ("-1", "1.5", "x", "10001"):
        with pytest.raises(ValueError, match="SPLITSERVE_KV_HANDOFF_MS"):
            handoff_ms({"SPLITSERVE_KV_HANDOFF_MS": bad})
