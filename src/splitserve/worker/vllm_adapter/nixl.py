"""NIXL settings vLLM's NixlConnector does not expose (vLLM 0.32, nixl 1.5).

vLLM builds its NIXL agent with `nixl_agent_config(num_threads=..., capture_telemetry=True)`:
NIXL's progress thread on, and nixl's Python API starts it with `pthrDelay = 0` (no pause between
polls). That thread spins a whole core from start to exit, transfers or not.
`progress_thread(False)` has vLLM build the agent without it while the engine is built; every
transfer is then progressed by the connector's own polls (`check_xfer_state` on the reading side
every engine step, `get_new_notifs` on the serving side every step while KV is held).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"


@contextlib.contextmanager
def progress_thread(enabled: bool) -> Iterator[None]:
    """While the engine is built inside this block, vLLM's NIXL agents get NIXL's progress
    thread only if `enabled`. Without nixl (or with another connector) it does nothing."""
    if enabled:
        yield
        return
    import importlib

    try:
        worker = importlib.import_module(_WORKER_MODULE)
    except ImportError:  # no nixl, or a vLLM without this module: nothing to configure
        yield
        return
    namespace = vars(worker)  # the module's globals, where vLLM's worker looks the name up
    original = namespace.get("nixl_agent_config")
    if original is None:
        yield
        return

    def without_progress_thread(*args: Any, **kwargs: Any) -> Any:
        kwargs["enable_prog_thread"] = False
        return original(*args, **kwargs)

    namespace["nixl_agent_config"] = without_progress_thread
    try:
        yield
    finally:
        namespace["nixl_agent_config"] = original


def clip_pulls(scheduler: Any, key: str) -> bool:
    """Make vLLM's scheduler pull, for a request whose `kv_transfer_params[key]` says how many
    of its prompt tokens the prefill computed, that many and no more.

    The decode engine continues a request from the prefill's first token: its prompt is the
    original prompt plus that token, whose KV nobody has computed yet. vLLM's NixlConnector
    would count every prompt token as remote (then recompute the last one), so it would ask for
    one block too many whenever the prompt fills its last block exactly; clipped, the first step
    computes the first token's position and samples the second. Returns False when the
    scheduler has no connector (nothing to clip)."""
    connector = getattr(scheduler, "connector", None)
    if connector is None:
        return False
    matched = connector.get_num_new_matched_tokens

    def clipped(request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        count, is_async = matched(request, num_computed_tokens)
        params = request.kv_transfer_params
        if not params or key not in params or not count:
            return count, is_async
        count = min(count, int(params[key]) - num_computed_tokens)
        return (count, is_async) if count > 0 else (0, False)

    connector.get_num_new_matched_tokens = clipped
    return True


class PullDriver:
    """Progresses the decode side's NIXL reads while they are in flight.

    Without NIXL's progress thread, UCX moves a read only while someone polls it; vLLM polls once
    per engine step (`get_finished`), so a read still in progress after its post waited a step
    per poll (measured: a fifth of the raw NIXL bandwidth before this driver). The engine thread
    calls `drive` between steps while reads are in flight: it polls their state in a tight loop
    until they are done or the budget is spent. CPU is used only while KV is moving.

    Host memory on one host (UCX's `cma` transport) needs no polling for the data: the READ is a
    `process_vm_readv` copy done inside the post (`transfer()` returns DONE), so vLLM's transfer
    time is that copy on the decode engine's thread (docs/benchmarks.md, KV handoff). The driver
    matters where the post returns PROC: RDMA and TCP transports, and a read whose completion
    notification to the prefill side is still pending."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self._transfers: dict[str, list[Any]] = worker._recving_transfers
        self._check = worker.nixl_wrapper.check_xfer_state

    @classmethod
    def of(cls, find_worker: Any) -> PullDriver | None:
        """The driver for vLLM's NIXL connector worker in this process; None without one (or
        with a vLLM whose connector keeps its reads elsewhere)."""
        try:
            worker = find_worker()
            return cls(worker)
        except Exception:
            return None

    def in_flight(self) -> bool:
        return any(self._transfers.values())

    def drive_after_posting(self, budget_s: float) -> None:
        """Also drive right after vLLM posts reads (its worker's `start_load_kv`, inside an
        engine step), for at most `budget_s`, instead of only after the step returns."""
        post = self._worker.start_load_kv

        def start_load_kv(*args: Any, **kwargs: Any) -> Any:
            out = post(*args, **kwargs)
            if self.in_flight():
                self.drive(budget_s)
            return out

        self._worker.start_load_kv = start_load_kv

    def drive(self, budget_s: float) -> None:
        deadline = time.perf_counter() + budget_s
        while time.perf_counter() < deadline:
            pending = False
            for handles in list(self._transfers.values()):
                for handle in handles:
                    if self._check(handle) == "PROC":
                        pending = True
            if not pending:
                return
