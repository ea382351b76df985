"""The held-KV back-off (`vllm_adapter.held_backoff`): while a prefill engine only holds KV and
nothing changes (a decode worker lost after the prefill), its steps back off from
`SPLITSERVE_KV_HELD_POLL_MS` to `SPLITSERVE_KV_HELD_POLL_MAX_MS`; any change starts again at the
base, and a pause ends at once for a command or a READ notification. Fake clock, no timing."""

from __future__ import annotations

import pytest

from splitserve.worker.vllm_adapter.held_backoff import (
    HELD_POLL_MAX_ENV,
    HeldBackoff,
    held_pause,
    held_poll_max_s,
)
from tests.fakes.clock import SleepingClock


def test_pauses_double_up_to_the_cap_while_nothing_changes() -> None:
    backoff = HeldBackoff(0.005, 0.1)
    pauses = [backoff.next((1, 1000)) for _ in range(8)]
    assert pauses == pytest.approx([0.005, 0.01, 0.02, 0.04, 0.08, 0.1, 0.1, 0.1])


def test_a_change_of_the_held_state_starts_again_at_the_base() -> None:
    backoff = HeldBackoff(0.005, 0.1)
    for _ in range(6):
        backoff.next((1, 1000))
    # a READ completed: the request left vLLM and its blocks came back
    assert backoff.next((0, 1023)) == 0.005
    assert backoff.next((0, 1023)) == 0.01
    # a new request held (another hand-off)
    assert backoff.next((1, 1020)) == 0.005


def test_reset_starts_again_at_the_base_even_with_the_same_state() -> None:
    backoff = HeldBackoff(0.005, 0.1)
    for _ in range(6):
        backoff.next((1, 1000))
    backoff.reset()
    assert backoff.next((1, 1000)) == 0.005
    assert backoff.next((1, 1000)) == 0.01


def test_cap_equal_to_base_is_the_behaviour_before() -> None:
    backoff = HeldBackoff(0.005, 0.005)
    assert [backoff.next("same") for _ in range(5)] == [0.005] * 5


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="base_s <= cap_s"):
        HeldBackoff(0.01, 0.005)
    with pytest.raises(ValueError, match="base_s <= cap_s"):
        HeldBackoff(0.0, 0.005)


def test_a_pause_is_spent_in_base_slices() -> None:
    clock = SleepingClock(10.0)
    woke = held_pause(0.02, 0.005, lambda: False, clock.sleep, clock)
    assert woke is False
    assert clock.slept == pytest.approx([0.005] * 4)


def test_a_pause_ends_at_once_when_woken() -> None:
    clock = SleepingClock(10.0)
    calls = iter([False, False, True])
    woke = held_pause(0.2, 0.005, lambda: next(calls), clock.sleep, clock)
    assert woke is True
    # a command / READ notification waited at most one base slice, as before the back-off
    assert clock.slept == pytest.approx([0.005, 0.005])


def test_woken_before_any_sleep_does_not_sleep() -> None:
    clock = SleepingClock(10.0)
    assert held_pause(0.2, 0.005, lambda: True, clock.sleep, clock) is True
    assert clock.slept == []


def test_the_last_slice_is_cut_to_the_pause() -> None:
    clock = SleepingClock(10.0)
    held_pause(0.012, 0.005, lambda: False, clock.sleep, clock)
    assert clock.slept == pytest.approx([0.005, 0.005, 0.002])


def test_cap_setting() -> None:
    assert held_poll_max_s(0.005, {}) == 0.2
    assert held_poll_max_s(0.3, {}) == 0.3  # a base above the default cap: no back-off
    assert held_poll_max_s(0.005, {HELD_POLL_MAX_ENV: "100"}) == 0.1
    assert held_poll_max_s(0.005, {HELD_POLL_MAX_ENV: "5"}) == 0.005


@pytest.mark.parametrize("bad", ["x", "0", "-5", "nan", "inf", "60001"])
def test_bad_cap_values_are_refused_naming_the_variable(bad: str) -> None:
    with pytest.raises(ValueError, match="SPLITSERVE_KV_HELD_POLL_MAX_MS must be a number of ms"):
        held_poll_max_s(0.005, {HELD_POLL_MAX_ENV: bad})


def test_a_cap_below_the_base_poll_is_refused_naming_both() -> None:
    with pytest.raises(
        ValueError, match=r"SPLITSERVE_KV_HELD_POLL_MAX_MS.*SPLITSERVE_KV_HELD_POLL_MS"
    ):
        held_poll_max_s(0.01, {HELD_POLL_MAX_ENV: "5"})
