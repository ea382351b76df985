"""NIXL settings vLLM's NixlConnector does not expose (vLLM 0.32, nixl 1.5).

vLLM builds its NIXL agent with `nixl_agent_config(num_threads=..., capture_telemetry=True)`:
NIXL's progress thread on, and nixl's Python API starts it with `pthrDelay = 0` (no pause between
polls). That thread spins a whole core from start to exit, transfers or not.
`progress_thread(False)` has vLLM build the agent without it while the engine is built; every
transfer is then progressed by the connector's own polls (`check_xfer_state` on the reading side
every engine step, `get_new_notifs` on the serving side every step while KV is held).
"""

from __future__ import annotations

import bisect
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

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


class PullInStep:
    """Pull a continued decode's KV inside the engine step that computes its first position.

    For every prompt length; opt-in (`VllmEngineConfig.kv_pull_in_step=True` or
    `SPLITSERVE_KV_PULL_IN_STEP=1`) until a `make bench-kv` failure is explained
    (docs/engines.md, "KV transfer").

    vLLM 0.32's NixlConnector loads remote KV asynchronously: the scheduler parks the request in
    WAITING_FOR_REMOTE_KVS, the step posts the READ (after that step's forward, if any), the
    step's `get_finished` reports the read done, and only the *next* step schedules the request.
    So the first token of a decode came two engine steps after the request: one that only
    moved KV (or ran other requests' forward while it waited), and the one that computed token 2.

    Installed on an in-process engine, this makes those loads synchronous (vLLM's own contract
    for connectors that load before the forward):

    * scheduler side: for a request whose `kv_transfer_params` carry `key` (a decode continued
      from a prefill's first token) and whose prefill engine this engine has already shaken
      hands with, `get_num_new_matched_tokens` says "not async": vLLM schedules the request at
      once (the first token's position, one token over the pulled prompt) and marks the step as
      having a sync load, so the model runner calls `start_load_kv` before the forward;
    * block caching: for such a request the KV cache manager's `allocate_slots` is told to
      delay caching (vLLM's `delay_cache_blocks`, what it does for async loads), and the blocks
      are cached right after the connector's `update_state_after_alloc`. vLLM's sync path would
      hash the newly allocated blocks at allocation, before the connector sees them, and
      NixlConnector reads only into unhashed blocks: the connector would be handed only the last
      (partial) block of a prompt longer than one KV block. Delayed, the connector is handed
      every block covering the external tokens, exactly the list the async path hands it;
    * worker side: `start_load_kv` posts the READs as before, then polls them until done (on one
      host the READ is a copy inside the post) and collects the results before the forward
      (notification to the prefill engine, any post-processing); a sync-loaded request is left
      out of `finished_recving`, which the scheduler expects only for parked requests. A failed
      read is reported as vLLM's sync loads report it (invalid blocks: the request fails or is
      recomputed by `kv_load_failure_policy`).

    The cost: the READ now runs inside the step, so the other requests of that step wait for it
    (on one host: the copy, ~0.2 ms per MiB here); on RDMA a long transfer would hold the step for
    its whole duration, which the async path avoids. A pair not yet shaken hands with (or a
    model needing vLLM's hybrid allocator) keeps vLLM's async path."""

    def __init__(self, connector: Any, worker: Any, key: str) -> None:
        self._connector = connector
        self._requests: Any = {}
        """The scheduler's requests by id."""
        self.on_received: Callable[[Any, bool, int], None] | None = None
        """Called on the engine thread for each in-step load once its READ is over, with the
        request, whether it succeeded and its computed tokens with the KV in (local prefix hit
        and pulled; the scheduler has already counted the step's token too). The scheduler
        never sees these in `finished_recving`, where vLLM's async loads are observed."""
        self._loaded: dict[str, int] = {}
        """Allocated in-step loads: tokens computed once their KV is in."""
        self._worker = worker
        self._key = key
        self._chosen: set[str] = set()
        """Requests the scheduler was told to load in-step, not yet posted."""
        self._hidden: set[str] = set()
        """Posted in-step loads whose completion the scheduler must not see."""
        self._early: Any = None
        self._results = worker.get_transfer_results
        self._check = worker.nixl_wrapper.check_xfer_state
        self._cache_after: dict[str, int] = {}
        """Allocated in-step loads: how many tokens to cache once the connector has the blocks."""
        self.count = 0
        """In-step loads done."""

    @classmethod
    def install(cls, scheduler: Any, worker: Any, key: str) -> PullInStep | None:
        """Wrap the scheduler's connector and the NIXL worker of this process; None when the
        scheduler has no connector or the worker is not vLLM's NIXL pull worker."""
        connector = getattr(scheduler, "connector", None)
        kv: Any = getattr(scheduler, "kv_cache_manager", None)
        needed = ("get_transfer_results", "start_load_kv", "_recving_transfers", "_remote_agents")
        if (
            connector is None
            or not all(hasattr(worker, n) for n in needed)
            or not all(hasattr(kv, n) for n in ("allocate_slots", "cache_blocks"))
        ):
            return None
        hook = cls(connector, worker, key)
        hook._requests = getattr(scheduler, "requests", {})
        matched = connector.get_num_new_matched_tokens
        after_alloc = connector.update_state_after_alloc
        allocate = kv.allocate_slots
        signature = inspect.signature(allocate)
        post = worker.start_load_kv

        def get_num_new_matched_tokens(request: Any, num_computed: int) -> tuple[int | None, bool]:
            count, is_async = matched(request, num_computed)
            if is_async and count and hook.in_step(request.kv_transfer_params):
                hook._chosen.add(request.request_id)
                return count, False
            hook._chosen.discard(request.request_id)
            return count, is_async

        def allocate_slots(request: Any, *args: Any, **kwargs: Any) -> Any:
            if request.request_id not in hook._chosen:
                return allocate(request, *args, **kwargs)
            bound = signature.bind(request, *args, **kwargs)
            given = bound.arguments
            external = int(given.get("num_external_computed_tokens", 0))
            if not external or given.get("delay_cache_blocks"):
                return allocate(request, *args, **kwargs)
            # Cache after the connector has seen the blocks (the class docstring).
            given["delay_cache_blocks"] = True
            blocks = allocate(*bound.args, **bound.kwargs)
            if blocks is not None:
                # What vLLM's allocate_slots would have cached at allocation.
                computed = (
                    int(request.num_computed_tokens)
                    + int(given.get("num_new_computed_tokens", 0))
                    + external
                )
                limit = getattr(kv, "max_model_len", None)
                if limit is not None:
                    computed = min(computed, int(limit))
                hook._loaded[request.request_id] = computed
                hook._cache_after[request.request_id] = min(
                    computed + int(given["num_new_tokens"]), int(request.num_tokens)
                )
            return blocks

        block_size = int(getattr(getattr(connector, "connector_scheduler", None), "block_size", 0))

        def update_state_after_alloc(request: Any, blocks: Any, num_external: int) -> Any:
            loaded = hook._loaded.get(request.request_id)
            if loaded is not None and block_size > 0:
                # Only the blocks the pulled KV covers: a prompt ending on a block boundary has
                # one more block (token 1's) that the prefill never had (the async path
                # allocates it after the load; NixlConnector asserts it has no more blocks
                # than the prefill).
                blocks = _first_blocks(blocks, -(-loaded // block_size))
            out = after_alloc(request, blocks, num_external)
            cache_upto = hook._cache_after.pop(request.request_id, None)
            if cache_upto is not None:
                kv.cache_blocks(request, cache_upto)
            if request.request_id in hook._chosen:
                # No heartbeats keeping the prefill's lease alive: the read is in this step.
                stop = getattr(
                    getattr(connector, "connector_scheduler", None), "_stop_heartbeat", None
                )
                if stop is not None:
                    stop(request.request_id)
            return out

        def start_load_kv(metadata: Any) -> Any:
            out = post(metadata)
            hook.finish_reads(set(getattr(metadata, "reqs_to_recv", {})))
            return out

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        connector.update_state_after_alloc = update_state_after_alloc
        kv.allocate_slots = allocate_slots
        worker.start_load_kv = start_load_kv
        worker.get_transfer_results = hook.transfer_results
        return hook

    def in_step(self, params: Any) -> bool:
        """Load this request's KV in the step that schedules it?"""
        if not params or self._key not in params:
            return False
        worker = self._worker
        engine = params.get("remote_engine_id")
        return bool(
            engine in worker._remote_agents
            and engine not in getattr(worker, "_invalid_remote_engines", ())
            and not getattr(worker, "_is_hma_required", True)
        )

    def finish_reads(self, posted: set[str]) -> None:
        """After vLLM posted this step's reads: wait for the in-step ones, collect results."""
        ids = self._chosen & posted
        if not ids:
            return
        self._chosen -= ids
        self._hidden |= ids
        transfers = self._worker._recving_transfers
        warn_at = time.perf_counter() + 5.0
        while True:
            handles = [h for rid in ids for h in transfers.get(rid, ())]
            if all(self._check(h) != "PROC" for h in handles):
                break
            if time.perf_counter() > warn_at:  # a dead peer ends in an error state, not here
                log.warning("in-step KV read of %s still running after 5 s", sorted(ids))
                warn_at += 5.0
        early = self._hide(self._results())
        failed = set(early.failed_recving)
        for rid in sorted(ids):
            request = self._requests.get(rid)
            loaded = self._loaded.pop(rid, None)
            if self.on_received is not None and request is not None and loaded is not None:
                self.on_received(request, rid not in failed, loaded)
        if self._early is None:
            self._early = early
        else:
            _merge(self._early, early)
        # What vLLM will never report (nothing was left to read) needs no hiding.
        self._hidden &= set(getattr(self._worker, "_recving_metadata", self._hidden))
        self.count += len(ids)

    def transfer_results(self) -> Any:
        """The worker's `get_transfer_results`, plus what the in-step loads collected early,
        without the in-step loads' completions."""
        results = self._hide(self._results())
        early, self._early = self._early, None
        if early is not None:
            _merge(results, early)
        return results

    def _hide(self, results: Any) -> Any:
        done = results.finished_recving & self._hidden
        if done:
            results.finished_recving -= done
            self._hidden -= done
        return results


def _first_blocks(blocks: Any, n: int) -> Any:
    """vLLM's `KVCacheBlocks` (or a plain list) cut to its first `n` blocks in every group."""
    groups = getattr(blocks, "blocks", None)
    if groups is None:
        return blocks[:n]
    return type(blocks)(tuple(group[:n] for group in groups))


def _merge(into: Any, other: Any) -> None:
    into.finished_sending |= other.finished_sending
    into.finished_recving |= other.finished_recving
    into.failed_recving |= other.failed_recving


WARM_NOTIF = b"HB:"
"""The notification the warm-up READ ends with, as a request's READ ends with one: vLLM's
prefill side reads `HB:<request ids>` as a heartbeat extending those requests' leases, and this
one names none. Without it the first request's READ still posted 13-14 ms against 2.6-3.5 ms
later (docs/benchmarks.md, fresh pairs); with it, shorter in 3 of 7 fresh pairs only: the
notification round completes only when the prefill engine progresses NIXL, which it does not
while idle."""


class WarmReads:
    """The pair's first NIXL READ, made when the pair is warmed (`VllmEngine.warm_kv`)
    instead of by a user's first request.

    `start` posts a READ of block 0 of every KV region of a peer engine (handshake done) into
    this engine's block 0: vLLM's null block on both sides, never a request's KV, so nothing a
    request reads changes; it ends with an empty heartbeat notification (`WARM_NOTIF`). The
    READ does not wait for its end: measured, a waiting version was still in progress after
    5 s with the peer engine idle (likely, not verified: without NIXL's progress thread the
    pair's first READ needs the *peer* to poll NIXL too, which an idle engine does not do). The
    engine thread calls `poll` between iterations; the handle is released once the READ is
    over."""

    def __init__(self) -> None:
        self._pending: list[tuple[Any, Any, str]] = []
        self.failed: list[str] = []
        """Peers whose warm-up READ ended in an error (the pair works without it)."""

    @property
    def pending(self) -> int:
        return len(self._pending)

    def start(self, worker: Any, engine_id: str) -> int:
        """Post the READ; returns the descriptors read.

        Raises:
            ValueError: this worker's layout is not the plain one this supports (one
                descriptor per block and region, region-major, equal block sizes, one memory
                type, no SSM state, one remote rank); the first request then pays as before.
        """
        local_ids, remote_ids, local, remote = _null_block_descriptors(worker, engine_id)
        wrapper = worker.nixl_wrapper
        handle = wrapper.make_prepped_xfer(
            "READ", local, local_ids, remote, remote_ids, notif_msg=WARM_NOTIF
        )
        state = wrapper.transfer(handle)
        self._pending.append((wrapper, handle, engine_id))
        if state != "PROC":
            self.poll()
        return len(local_ids)

    def poll(self) -> None:
        """Release the READs that are over."""
        left = []
        for wrapper, handle, engine_id in self._pending:
            state = wrapper.check_xfer_state(handle)
            if state == "PROC":
                left.append((wrapper, handle, engine_id))
                continue
            if state != "DONE":
                self.failed.append(engine_id)
                log.warning("warm-up READ from engine %s ended %r", engine_id, state)
            wrapper.release_xfer_handle(handle)
        self._pending = left


def _null_block_descriptors(worker: Any, engine_id: str) -> tuple[list[int], list[int], Any, Any]:
    """Descriptor ids of block 0 of every region, here and at `engine_id`, and the two
    prepared descriptor lists (vLLM 0.32's NixlConnector worker fields)."""
    regions: Any = getattr(worker, "dst_region_num_blocks", {})
    local_blocks = list(regions.get(getattr(worker, "engine_id", None)) or ())
    remote_blocks = list(regions.get(engine_id) or ())
    remote_handles = getattr(worker, "dst_xfer_side_handles", {}).get(engine_id, {})
    local_handle = getattr(worker, "src_xfer_handles_by_block_size", {}).get(
        getattr(worker, "block_size", None)
    )
    problems = {
        "no local regions": not local_blocks,
        f"{len(remote_blocks)} remote regions, {len(local_blocks)} local": len(remote_blocks)
        != len(local_blocks),
        "no local descriptor list": local_handle is None,
        f"{len(remote_handles)} remote ranks": len(remote_handles) != 1,
        "mixed memory types": bool(getattr(worker, "_mixed_mem_types", True)),
        "SSM state": bool(getattr(worker, "_has_mamba", True)),
        "descriptors are not one per block and region": len(getattr(worker, "src_blocks_data", ()))
        != sum(local_blocks),
    }
    found = [k for k, bad in problems.items() if bad]
    if found:
        raise ValueError("KV layout not supported: " + ", ".join(found))
    local_ids = [sum(local_blocks[:i]) for i in range(len(local_blocks))]
    remote_ids = [sum(remote_blocks[:i]) for i in range(len(remote_blocks))]
    (remote_handle,) = remote_handles.values()
    return local_ids, remote_ids, local_handle, remote_handle


class WarmupWindow:
    """The serving (prefill) side's part of warming a pair: progress NIXL while a peer warms up;
    and, in the steady state, while a hand-off's READ is awaited (`handed_off`, `wait`).

    Without NIXL's progress thread an engine progresses NIXL only from vLLM's own polls: the
    prefill engine reads its notifications every step while it holds KV, never while idle. A
    peer's first READ from an idle engine then stayed in progress (its UCX connection's set-up
    and the READ's notification both need this side to progress), and the pair's first real
    READ paid for it (docs/benchmarks.md, "KV handoff", fresh pairs). So when a peer says it is
    about to warm up with this engine (`KvEndpoint` with `warm_up_ms`, `open`), the engine
    thread calls `progress` about every millisecond until each announced peer's warm-up READ
    notification (`WARM_NOTIF`) has arrived or the window's time is up; then it is idle again.

    `progress` reads notifications with the agent's `get_new_notifs` (which progresses the
    backends); any that are not a warm-up's are kept and handed to vLLM's next own call of
    `get_new_notifs` (wrapped on the agent), so vLLM sees every request's notification as
    before. Warm-up notifications are consumed here (vLLM would read them as heartbeats naming
    no request: a no-op)."""

    def __init__(self, wrapper: Any, now: Callable[[], float] = time.monotonic) -> None:
        self._get = wrapper.get_new_notifs
        self._now = now
        self._kept: dict[str, list[bytes]] = {}
        self._until = 0.0
        self._expected = 0
        self._handoffs: list[float] = []
        """Deadlines of this engine's hand-offs whose READ has not notified yet (sorted)."""
        self.opened = 0
        """Windows opened."""
        self.polls = 0
        """`progress` calls that read notifications (inside a window or a hand-off)."""
        self.warm_notifs = 0
        """Peers' warm-up notifications consumed."""
        self.handoffs = 0
        """Hand-offs announced (`handed_off`)."""
        self.handoffs_notified = 0
        """Of those, ended by a request's READ notification read here."""
        self.handoffs_expired = 0
        """Of those, ended by their time running out."""
        wrapper.get_new_notifs = self.get_new_notifs

    def open(self, seconds: float) -> None:
        """A peer is about to warm up with this engine: progress for up to `seconds` more (or
        until its warm-up notification arrives)."""
        if seconds <= 0:
            return
        self._until = max(self._until, self._now() + seconds)
        self._expected += 1
        self.opened += 1

    @property
    def active(self) -> bool:
        if self._until and self._now() >= self._until:
            self._close()
        return self._until > 0.0

    def handed_off(self, seconds: float) -> None:
        """This engine just handed a request's KV out (its prefill finished holding KV for a
        decode worker, which READs it within milliseconds): progress NIXL promptly until a
        request's READ notification arrives or `seconds` pass (`wait`).

        Why: the decode worker's READ is reported done only once its completion notification
        has reached this engine, which needs this side to progress NIXL; the engine stepped
        only every `SPLITSERVE_KV_HELD_POLL_MS` (5 ms) while holding KV, and the READ waited
        0.1-5.8 ms for it (docs/benchmarks.md, "KV handoff"). Notifications are matched to
        hand-offs by count, oldest first, not by request id: each request notification read
        ends the oldest open hand-off (an approximation; a READ that never comes leaves its
        hand-off to time out)."""
        if seconds <= 0:
            return
        bisect.insort(self._handoffs, self._now() + seconds)
        self.handoffs += 1

    @property
    def awaiting(self) -> bool:
        """Whether a hand-off's READ notification is still expected (within its time)."""
        now = self._now()
        while self._handoffs and self._handoffs[0] <= now:
            self._handoffs.pop(0)
            self.handoffs_expired += 1
        return bool(self._handoffs)

    def progress(self, always: bool = False) -> bool:
        """Inside a window or while a hand-off is awaited (or `always`: the held-KV back-off's
        pause, `held_backoff.held_pause`): progress NIXL, consume warm-up notifications, keep
        the rest for vLLM. True when a request's notification was read (vLLM's next step can
        free its KV)."""
        window, awaiting = self.active, self.awaiting
        if not (window or awaiting or always):
            return False
        self.polls += 1
        requests = 0
        for agent, msgs in self._get().items():
            for msg in msgs:
                if msg == WARM_NOTIF:
                    self.warm_notifs += 1
                    self._expected -= 1
                    continue
                self._kept.setdefault(agent, []).append(msg)
                requests += _is_request(msg)
        self._notified(requests)
        if window and self._expected <= 0:
            self._close()
        return requests > 0

    def wait(self, seconds: float, poll_s: float, sleep: Callable[[float], None]) -> bool:
        """The engine's pause between steps while it only holds KV: `seconds` in all, but while
        a hand-off is awaited, progress NIXL every `poll_s` and return as soon as a request's
        notification is read (True), so the peer's READ completes without waiting for the
        next step. Without an awaited hand-off: one `sleep(seconds)`, as before."""
        if not self.awaiting:
            sleep(seconds)
            return False
        deadline = self._now() + seconds
        while True:
            remaining = deadline - self._now()
            if remaining <= 0:
                return False
            if not self.awaiting:
                sleep(remaining)
                return False
            if self.progress():
                return True
            sleep(min(poll_s, remaining))

    def get_new_notifs(self, *args: Any, **kwargs: Any) -> dict[str, list[bytes]]:
        """The agent's `get_new_notifs` as vLLM calls it, plus what `progress` kept."""
        new: dict[str, list[bytes]] = self._get(*args, **kwargs)
        if self._handoffs:  # a READ's notification vLLM reads itself ends a hand-off too
            self._notified(sum(_is_request(m) for msgs in new.values() for m in msgs))
        if not self._kept:
            return new
        out, self._kept = self._kept, {}
        for agent, msgs in new.items():
            out.setdefault(agent, []).extend(msgs)
        return out

    def _notified(self, requests: int) -> None:
        """`requests` READ notifications arrived: end as many open hand-offs, oldest first."""
        for _ in range(min(requests, len(self._handoffs))):
            self._handoffs.pop(0)
            self.handoffs_notified += 1

    def _close(self) -> None:
        self._until = 0.0
        self._expected = 0


def _is_request(msg: bytes) -> bool:
    """A request's READ notification (`<request id>:<consumers>`), not a heartbeat (`HB:...`,
    vLLM's own naming requests, or the warm-up READ's naming none)."""
    return not msg.startswith(WARM_NOTIF)


def expire_send(scheduler: Any, worker: Any, request_id: str, now: float | None = None) -> bool:
    """End the send lease of a finished prefill whose KV no one will pull (it was cancelled):
    vLLM's NIXL connector then frees its blocks in the next engine step, as when a lease runs
    out (`_reap_expired_send_leases` reports it in `finished_sending`; the scheduler frees the
    blocks and forgets the request), instead of holding them for `kv_lease_duration`.

    vLLM 0.32 has no call for this: `abort_request` skips a finished request, and its
    connector's own expiry path is the lease. The lease is set in two places, depending on
    whether the step that ships it to the worker has run: the scheduler side's
    `_reqs_need_send` (deadline in the scheduler's `perf_counter`, rebased by the worker) and
    the worker's `_reqs_to_send`. Both deadlines become `now`. True if the request held a lease.
    """
    now = time.perf_counter() if now is None else now
    found = False
    connector = getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)
    pending = getattr(connector, "_reqs_need_send", None)
    if isinstance(pending, dict) and request_id in pending:
        pending[request_id] = now
        found = True
    leases = getattr(worker, "_reqs_to_send", None)
    if isinstance(leases, dict) and request_id in leases:
        leases[request_id] = now
        found = True
    if found:
        _quiet_expiry(request_id)
    return found


class _ExpiredOnPurpose(logging.Filter):
    """Drops vLLM's "Releasing expired KV blocks" warning for leases `expire_send` ended on
    purpose (a cancel is not a lost decode); every other expiry is still logged."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if not self.ids or not isinstance(msg, str) or not msg.startswith("Releasing expired"):
            return True
        rid = record.args[0] if isinstance(record.args, tuple) and record.args else None
        if rid in self.ids:
            self.ids.discard(str(rid))
            return False
        return True


_EXPIRY_FILTER = _ExpiredOnPurpose()


def _quiet_expiry(request_id: str) -> None:
    logger = logging.getLogger(_WORKER_MODULE)
    if _EXPIRY_FILTER not in logger.filters:
        logger.addFilter(_EXPIRY_FILTER)
    if len(_EXPIRY_FILTER.ids) > 10_000:  # never reaped (the engine stopped): do not grow
        _EXPIRY_FILTER.ids.clear()
    _EXPIRY_FILTER.ids.add(request_id)


def kv_state(scheduler: Any, worker: Any | None) -> dict[str, Any]:
    """What vLLM holds for KV right now (read on the engine thread): requests its scheduler
    knows, those finished but keeping their blocks, the block pool's free count, the connector's
    send leases (scheduler side, not yet shipped, and worker side) and `has_requests()`."""
    requests = getattr(scheduler, "requests", {})
    finished = sorted(str(r) for r, req in requests.items() if req.is_finished())
    connector = getattr(getattr(scheduler, "connector", None), "connector_scheduler", None)
    return {
        "requests": sorted(str(r) for r in requests),
        "finished_holding": finished,
        "free_blocks": int(scheduler.kv_cache_manager.block_pool.get_num_free_blocks()),
        "need_send": sorted(getattr(connector, "_reqs_need_send", {}) or {}),
        "to_send": sorted(getattr(worker, "_reqs_to_send", {}) or {}),
        "to_process": sorted(getattr(worker, "_reqs_to_process", set()) or set()),
        "has_requests": bool(scheduler.has_requests()),
    }
