"""Core lists for a vLLM worker process (`vllm_adapter.host`): no vLLM needed."""

from __future__ import annotations

import os
import threading

import pytest

from splitserve.core.errors import ConfigError
from splitserve.worker.vllm_adapter.host import parse_cpus, pin_process, thread_affinities


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("0", (0,)),
        ("1", (1,)),
        ("0-3", (0, 1, 2, 3)),
        ("0,2,4-5", (0, 2, 4, 5)),
        (" 3 ", (3,)),
        ("0-1|2-3", (0, 1)),  # vLLM's per-rank lists: an in-process engine is rank 0
        ("", None),
        ("auto", None),
        ("nobind", None),
        ("all", None),
    ],
)
def test_parse_cpus(text: str, cpus: tuple[int, ...] | None) -> None:
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize("text", ["x", "0-", "1,,2", "-1", "a-b"])
def test_parse_cpus_refuses_what_is_not_a_core_list(text: str) -> None:
    with pytest.raises(ConfigError, match="VLLM_CPU_OMP_THREADS_BIND"):
        parse_cpus(text)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_pin_process_pins_every_thread_and_refuses_missing_cores() -> None:
    original = os.sched_getaffinity(0)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        target = {min(original)}
        assert pin_process(target) >= 2
        affinities = thread_affinities()
        assert other.native_id in affinities
        assert set(affinities.values()) == {frozenset(target)}
        with pytest.raises(ConfigError, match="cannot pin"):
            pin_process({(os.cpu_count() or 1) + 7})
    finally:
        pin_process(original)
        stop.set()
        other.join()
