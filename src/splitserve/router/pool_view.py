"""The router's view of its workers: channels, load streams, readiness, fencing, in-flight counts.

Each endpoint (id = its gRPC address) keeps one `grpc.aio` channel and one `WatchLoad` stream; the
worker pushes a `LoadReport` about every 100 ms. When the stream breaks the endpoint is marked not
ready and the stream is re-opened with exponential back-off; the re-opened call waits for the
channel to connect, and channels retry every <= 0.5 s, so a restarted worker is re-admitted within
about a second of listening. A report older than `stale_after_s` is not trusted: while its stream
stays up the endpoint stays ready, but its load is the router's own view (its in-flight and
reserved work, `Ledger`) instead of the stale report, and placement ranks it after every worker
whose reports are fresh (a frozen worker gets new work only when no other can take it); that is
logged at WARNING and counted (`splitserve_router_stale_load_fallbacks_total`), never silently
turned into a 503. Each view
carries the reservations placed on the worker and not yet started (so simultaneous placements see
each other) and the latency model fitted for it (`LatencyBook`, from the worker's `WatchSteps`
step stream, and its KV pull rate from the pull totals in its load reports), with the prompt
tokens of the split requests placed on it whose KV pull has not finished (`Ledger.pull_tokens`:
`pending_pull_tokens`). Placement reads frozen
`EndpointView`s from `views()`; nothing here decides where a request goes.

With `pool.link: stream` the pool owns the workers' stream links (`links`, shared with the
dispatcher): once a worker's first report (over gRPC) names its link port, both feeds move onto
that link as sub-requests (`MuxLink.watch`), so the router's steady state is one socket per
worker and no `grpc.aio` stream (issue 17, docs/benchmarks.md "Thirteenth pass"). The feeds
fail as over gRPC: the link lost ends the load feed, the endpoint is not ready until a report
comes again (re-opened with the same back-off, through `WatchLoad`, which re-learns the port);
a report that stops while the link stays up goes stale as above. A worker that predates the
feed ops (INVALID_ARGUMENT) keeps its gRPC feeds. Approximation: a worker whose gRPC port
answers but whose link port does not (a firewall on the link port only) turns ready at each
gRPC report and not ready when the link then fails, with the growing back-off; its requests
fail over the link either way.

A worker whose channel cannot connect (refused, or a plaintext router against a mutual-TLS
worker, whose handshake fails) is not silent: while the `WatchLoad` call waits for the channel,
a watcher of the channel's connectivity logs at WARNING the worker, the channel state and the
connection error (from a call that does not wait: gRPC's last error), at the first failure and
then at most once per `UNREACHABLE_LOG_EVERY_S` while it persists; the reason is
kept (`unreachable()`) for the 503 and `/ready` to name, and cleared by the next report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from grpc import aio

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.aio import stop_task
from splitserve.api.router import PoolSettings
from splitserve.core.clock import Clock
from splitserve.core.ids import EndpointId
from splitserve.core.roles import Role
from splitserve.obs.metrics import RouterMetrics
from splitserve.policy.placement import EndpointView
from splitserve.router.latency import LatencyBook
from splitserve.router.ledger import Ledger
from splitserve.router.mux import MuxLink, MuxLinks, worker_channel_options
from splitserve.security import tls

log = logging.getLogger(__name__)

_ROLES = {
    common_pb2.ROLE_PREFILL: Role.PREFILL,
    common_pb2.ROLE_DECODE: Role.DECODE,
    common_pb2.ROLE_MIXED: Role.MIXED,
}


class _Closeable(Protocol):
    async def close(self) -> None: ...


@dataclass
class _Endpoint:
    id: EndpointId
    channel: _Closeable
    stub: worker_pb2_grpc.WorkerAsyncStub
    report: common_pb2.LoadReport | None = None
    report_at_s: float = float("-inf")
    connected: bool = False
    fenced: bool = False
    inflight: int = 0
    stale: bool = False
    """The report went stale while the stream stayed up (logged once per episode)."""
    link_feeds: bool = True
    """With `pool.link: stream`: the worker serves the feeds on its link (False once it
    answered INVALID_ARGUMENT: a worker that predates them)."""
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    unreachable: str | None = None
    """Why its channel does not connect (the last failure seen), until a report comes."""
    unreachable_since_s: float = 0.0
    unreachable_logged_s: float = float("-inf")
    unreachable_checks: int = 0
    """Times its channel was seen failing to connect (each at most one WARNING)."""
    idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set once it is removed and no request runs on it any more (its channel may close)."""
    revived: bool = False
    """Added back while leaving: its channel stays open (a new `_Endpoint` holds it)."""
    view_key: tuple[object, ...] | None = field(default=None, repr=False)
    view: EndpointView | None = field(default=None, repr=False)
    """Its last snapshot (`PoolView._view`) and everything that snapshot was built from."""


LEAVE_GRACE_S = 30.0
"""A worker removed while requests run on it keeps its channel open until they finish, at most
this long (a deleted pod lives through its termination grace period, 30 s by default); then the
channel closes and what still runs on it ends with an error."""
UNREACHABLE_LOG_EVERY_S = 60.0
"""An unreachable worker is logged at its first failure, then at most this often (pool clock)."""
UNREACHABLE_RECHECK_S = 5.0
"""How often a channel that stays in TRANSIENT_FAILURE is looked at again."""


class UnknownEndpoint(KeyError):  # noqa: N818 - a lookup miss, like KeyError
    """The endpoint is not (or no longer) part of the pool."""


class PoolView:
    """Live state of a set of worker endpoints.

    Use as `async with PoolView(...) as pool:` or call `start()` / `close()`. Endpoints can be
    added and removed at any time (static list now, Kubernetes discovery later).
    """

    def __init__(
        self,
        addresses: Iterable[str],
        *,
        clock: Clock,
        settings: PoolSettings | None = None,
        metrics: RouterMetrics | None = None,
        leave_grace_s: float = LEAVE_GRACE_S,
    ) -> None:
        self._clock = clock
        self._leave_grace_s = leave_grace_s
        self._leaving: dict[EndpointId, _Endpoint] = {}
        """Removed endpoints whose requests still run (their channel closes when they end)."""
        self._closers: set[asyncio.Task[None]] = set()
        self._settings = settings or PoolSettings()
        self._metrics = metrics
        self._endpoints: dict[EndpointId, _Endpoint] = {}
        self._initial = list(dict.fromkeys(addresses))
        self._started = False
        self._changed = asyncio.Event()
        self.ledger = Ledger()
        """The router's own record of the work placed on each worker."""
        self.links: MuxLinks | None = (
            MuxLinks("stream") if self._settings.link == "stream" else None
        )
        """With `pool.link: stream`: the workers' stream links, for the feeds and the
        dispatcher's requests alike (one socket per worker); None with gRPC."""
        self.latency = LatencyBook(link_for=self.feed_link if self.links is not None else None)
        """Latency models fitted online per worker."""
        self._listeners: list[Callable[[], None]] = []

    async def __aenter__(self) -> PoolView:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open channels and load streams for the initial addresses."""
        self._started = True
        for address in self._initial:
            self.add(address)

    async def close(self) -> None:
        """Stop every load stream and close every channel."""
        for eid in list(self._endpoints):
            await self.remove(eid)
        for ep in self._leaving.values():
            ep.idle.set()  # shutting down: the router's own drain already ran
        for task in list(self._closers):
            await task
        if self.links is not None:
            await self.links.close()
        self._started = False

    # -- membership -------------------------------------------------------------------------

    def add(self, address: str) -> EndpointId:
        """Start watching `address` (idempotent). Returns its endpoint id."""
        if not self._started:
            raise RuntimeError("PoolView.add before start()")
        eid = EndpointId(address)
        if eid in self._endpoints:
            return eid
        leaving = self._leaving.pop(eid, None)
        if leaving is not None:
            # Back before its requests ended (a resync, a label flipped back): the same channel,
            # so that the streams on it go on and new work shares its link.
            leaving.revived = True
            leaving.idle.set()
            eid = self._add(eid, leaving.channel, leaving.stub, address)
            self._endpoints[eid].inflight = leaving.inflight
            return eid
        options = worker_channel_options(self._settings.link_window_bytes)
        channel = tls.aio_channel(address, options=options)
        stub: worker_pb2_grpc.WorkerAsyncStub = worker_pb2_grpc.WorkerStub(channel)  # type: ignore[assignment]
        return self._add(eid, channel, stub, address)

    def add_stub(self, eid: str, stub: object, channel: _Closeable) -> EndpointId:
        """Start watching an endpoint reached through `stub` rather than a gRPC channel (a stock
        vLLM server, `router.http_backend.HttpWorker`): the same load watching, placement and
        dispatch. `channel.close()` runs when it is removed. Idempotent."""
        if not self._started:
            raise RuntimeError("PoolView.add_stub before start()")
        if EndpointId(eid) in self._endpoints:
            return EndpointId(eid)
        return self._add(EndpointId(eid), channel, stub, eid)  # type: ignore[arg-type]

    def _add(
        self,
        eid: EndpointId,
        channel: _Closeable,
        stub: worker_pb2_grpc.WorkerAsyncStub,
        address: str,
    ) -> EndpointId:
        ep = _Endpoint(eid, channel, stub)
        self._endpoints[eid] = ep
        ep.task = asyncio.create_task(self._watch(ep), name=f"watch-load {address}")
        if self.links is None:
            self.latency.watch(eid, stub)
        # else: once the first report came, so that the step feed can take the link at once
        log.info("watching worker %s", address)
        self._notify()
        return eid

    async def remove(self, eid: str) -> None:
        """Stop watching an endpoint and close its channel. Unknown ids are ignored.

        No new request goes to it from now on. Requests already running on it keep the channel
        until they finish, at most `leave_grace_s`; then it closes (and they end with an error).
        """
        ep = self._endpoints.pop(EndpointId(eid), None)
        if ep is None:
            return
        ep.fenced = True
        if ep.task is not None:
            await stop_task(ep.task)
        self.ledger.forget(ep.id)
        await self.latency.forget(ep.id)
        if ep.inflight == 0:
            await ep.channel.close()
            log.info("stopped watching worker %s", eid)
        else:
            log.info(
                "stopped watching worker %s; its channel closes when its %d requests end "
                "(at most %g s)", eid, ep.inflight, self._leave_grace_s,
            )  # fmt: skip
            self._leaving[ep.id] = ep
            closer = asyncio.create_task(self._close_when_idle(ep), name=f"leave {eid}")
            self._closers.add(closer)
            closer.add_done_callback(self._closers.discard)
        self._notify()

    async def _close_when_idle(self, ep: _Endpoint) -> None:
        try:
            async with asyncio.timeout(self._leave_grace_s):
                await ep.idle.wait()
        except TimeoutError:
            log.warning(
                "worker %s left the pool %g s ago with %d requests still running: closing its "
                "channel", ep.id, self._leave_grace_s, ep.inflight,
            )  # fmt: skip
        finally:
            if self._leaving.get(ep.id) is ep:
                del self._leaving[ep.id]
            if not ep.revived:
                await ep.channel.close()

    def fence(self, eid: str) -> None:
        """Send no new work to `eid` (an operator is about to flip or drain it)."""
        self._get(eid).fenced = True
        self._notify()

    def unfence(self, eid: str) -> None:
        self._get(eid).fenced = False
        self._notify()

    # -- what dispatch uses ----------------------------------------------------------------

    def ids(self) -> list[EndpointId]:
        return sorted(self._endpoints)

    def stub(self, eid: str) -> worker_pb2_grpc.WorkerAsyncStub:
        return self._get(eid).stub

    @property
    def settings(self) -> PoolSettings:
        return self._settings

    def link_port(self, eid: str) -> int:
        """The stream-link port `eid` advertised in its last load report (0: none, or no report
        yet)."""
        ep = self._endpoints.get(EndpointId(eid))
        return 0 if ep is None or ep.report is None else int(ep.report.link_port)

    def feed_link(self, eid: str) -> MuxLink | None:
        """The stream link `eid`'s feeds go over (`pool.link: stream`, a port advertised, the
        worker serving the feed ops); None: its gRPC feeds."""
        ep = self._endpoints.get(EndpointId(eid))
        port = self.link_port(eid)
        if self.links is None or ep is None or not port or not ep.link_feeds:
            return None
        return self.links.get(ep.id, ep.stub, port)

    def acquire(self, eid: str) -> None:
        """Count a request sent to `eid` (call `release` when it finishes, however it ends)."""
        ep = self._endpoints.get(EndpointId(eid))
        if ep is not None:
            ep.inflight += 1

    def release(self, eid: str) -> None:
        leaving = self._leaving.get(EndpointId(eid))
        if leaving is not None and leaving.inflight > 0:
            leaving.inflight -= 1
            if leaving.inflight == 0:
                leaving.idle.set()
            return
        ep = self._endpoints.get(EndpointId(eid))
        if ep is not None and ep.inflight > 0:
            ep.inflight -= 1

    def unreachable(self) -> dict[EndpointId, str]:
        """The workers whose channel fails to connect, with the last connection error."""
        return {
            eid: ep.unreachable
            for eid, ep in sorted(self._endpoints.items())
            if ep.unreachable is not None and not ep.connected
        }

    def unreachable_text(self) -> str:
        """`unreachable()` for the router's log ("" if none): each worker and its error."""
        down = self.unreachable()
        return (
            "unreachable: " + "; ".join(f"{e} ({why})" for e, why in down.items()) if down else ""
        )

    def unreachable_summary(self) -> str:
        """`unreachable()` for a client (a 503, the open `/ready`; "" if none): how many, not
        which. Worker addresses and connection errors are the cluster's, not a client's: the
        router's log names them (a WARNING per worker)."""
        n = len(self.unreachable())
        if not n:
            return ""
        return f"{n} worker{'s' if n > 1 else ''} unreachable (the router's log names them)"

    def view(self, eid: str) -> EndpointView:
        return self._view(self._get(eid), self._clock.now_s())

    def views(self) -> list[EndpointView]:
        """A snapshot of every endpoint, in id order."""
        now_s = self._clock.now_s()
        return [self._view(self._endpoints[eid], now_s) for eid in sorted(self._endpoints)]

    def engines(self) -> list[str]:
        """The engine kinds ("sim", "vllm") the workers last reported, sorted (empty: none has
        reported yet)."""
        return sorted({ep.report.engine for ep in self._endpoints.values() if ep.report})

    def load_rows(self) -> list[tuple[str, int, int, int, int]]:
        """Per ready endpoint: (role, waiting, running, KV blocks in use, KV blocks in total),
        from its last load report (the router's pool gauges, read at scrape time)."""
        return [
            (v.role.value, v.num_waiting, v.num_running,
             v.kv_total_blocks - v.kv_free_blocks, v.kv_total_blocks)
            for v in self.views()
            if v.ready
        ]  # fmt: skip

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after every change (membership, fencing, load reports)."""
        self._listeners.append(listener)

    async def wait_for(
        self, predicate: Callable[[PoolView], bool], timeout_s: float | None = None
    ) -> None:
        """Wait until `predicate(self)` holds; re-checked after each change (reports included).

        Raises:
            TimeoutError: `timeout_s` passed first.
        """
        async with asyncio.timeout(timeout_s):
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()

    # -- internals ---------------------------------------------------------------------------

    def _get(self, eid: str) -> _Endpoint:
        try:
            return self._endpoints[EndpointId(eid)]
        except KeyError:
            raise UnknownEndpoint(eid) from None

    def _view(self, ep: _Endpoint, now_s: float) -> EndpointView:
        r = ep.report
        if r is None:
            inflight = ep.inflight + self.ledger.reserved(ep.id).requests
            return EndpointView(ep.id, Role.MIXED, ready=False, fenced=ep.fenced, inflight=inflight)
        stale = ep.connected and now_s - ep.report_at_s > self._settings.stale_after_s
        if stale != ep.stale:
            self._stale_changed(ep, stale, now_s)
        estimates = self.latency.estimates(ep.id)
        pull_rate = self.latency.pull_tokens_per_s(ep.id)
        # The snapshot is rebuilt only when something it is built from changed (placement takes
        # one of every worker several times a request; most workers are unchanged since the
        # last one). `ep.inflight` counts `acquire`s; reservations are in the ledger's revision.
        # The key holds the report itself: a new report object (even with equal fields) is
        # compared by value, the same one by identity (tuple equality tries `is` first).
        key = (
            r, ep.connected, ep.fenced, ep.inflight, stale,
            self.ledger.revision(ep.id), estimates, pull_rate,
        )  # fmt: skip
        view = ep.view
        if view is not None and key == ep.view_key:
            return view
        view = self._build_view(ep, r, stale, estimates, pull_rate)
        ep.view_key, ep.view = key, view
        return view

    def _build_view(
        self,
        ep: _Endpoint,
        r: common_pb2.LoadReport,
        stale: bool,
        estimates: tuple[float, float, float],
        pull_rate: float,
    ) -> EndpointView:
        res = self.ledger.reserved(ep.id)
        inflight = ep.inflight + res.requests
        rate, base, per = estimates
        pull_tokens = self.ledger.pull_tokens(ep.id)
        role = _ROLES.get(r.role, Role.MIXED)
        if stale:
            # The router's own view: what it has in flight and reserved there, on the last
            # known capacity (started work is counted by `inflight`, its KV is not known).
            return EndpointView(
                id=ep.id,
                role=role,
                ready=r.role in _ROLES,
                fenced=ep.fenced,
                draining=r.draining,
                kv_free_blocks=max(0, r.kv_blocks_total - res.kv_blocks),
                kv_total_blocks=r.kv_blocks_total,
                kv_block_size=r.kv_block_size or 16,
                pending_prefill_tokens=self.ledger.prefill_tokens(ep.id),
                inflight=inflight,
                prefill_tokens_per_s=rate,
                decode_step_base_s=base,
                decode_step_per_seq_s=per,
                kv_pull_tokens_per_s=pull_rate,
                pending_pull_tokens=pull_tokens,
                stale=True,
            )
        return EndpointView(
            id=ep.id,
            role=role,
            ready=ep.connected and r.role in _ROLES,
            fenced=ep.fenced,
            draining=r.draining,
            num_waiting=r.num_waiting,
            num_running=r.num_running,
            kv_free_blocks=max(0, r.kv_blocks_free - res.kv_blocks),
            kv_total_blocks=r.kv_blocks_total,
            kv_block_size=r.kv_block_size or 16,
            # The report lags ~one interval behind calls just sent: the router's own outstanding
            # prefills are a floor (a burst in one instant must not all see an idle worker).
            pending_prefill_tokens=max(
                r.num_pending_prefill_tokens, self.ledger.prefill_tokens(ep.id)
            ),
            inflight=inflight,
            prefill_tokens_per_s=rate,
            decode_step_base_s=base,
            decode_step_per_seq_s=per,
            kv_pull_tokens_per_s=pull_rate,
            pending_pull_tokens=pull_tokens,
        )

    def _stale_changed(self, ep: _Endpoint, stale: bool, now_s: float) -> None:
        ep.stale = stale
        if stale:
            age = now_s - ep.report_at_s
            log.warning(
                "load report of %s is %.1f s old (stale after %.1f s) while its stream is up: "
                "placing on the router's own view of it (in-flight and reserved work) until "
                "reports resume; a starved CPU on the router or the worker delays reports",
                ep.id,
                age,
                self._settings.stale_after_s,
            )
            if self._metrics is not None and ep.report is not None:
                role = _ROLES.get(ep.report.role, Role.MIXED)
                self._metrics.stale_fallbacks.labels(role.value).inc()
        else:
            log.warning("load reports of %s are fresh again", ep.id)

    def _notify(self) -> None:
        self._changed.set()
        if self._metrics is not None:
            self._update_gauge()
        for listener in self._listeners:
            listener()

    def _update_gauge(self) -> None:
        assert self._metrics is not None
        counts: dict[tuple[str, str], int] = {}
        for v in self.views():
            if v.fenced:
                state = "fenced"
            elif v.draining:
                state = "draining"
            else:
                state = "ready" if v.ready else "not_ready"
            counts[(v.role.value, state)] = counts.get((v.role.value, state), 0) + 1
        for role in Role:
            for state in ("ready", "not_ready", "fenced", "draining"):
                self._metrics.endpoints.labels(role.value, state).set(
                    counts.get((role.value, state), 0)
                )

    def _take(self, ep: _Endpoint, report: common_pb2.LoadReport) -> bool:
        """A report from the load feed into the view; False: reordered or replayed."""
        if ep.report is not None and 0 < report.seq <= ep.report.seq and ep.connected:
            return False
        first = ep.report is None
        ep.report, ep.report_at_s, ep.connected = report, self._clock.now_s(), True
        if ep.unreachable is not None:
            log.warning("worker %s is reachable again", ep.id)
            ep.unreachable, ep.unreachable_logged_s = None, float("-inf")
        self.latency.observe_pull_totals(ep.id, report.kv_pulled_tokens, report.kv_pull_seconds)
        if ep.stale:
            self._stale_changed(ep, False, ep.report_at_s)
        if first and self.links is not None:
            self.latency.watch(ep.id, ep.stub)
        self._notify()
        return True

    async def _watch(self, ep: _Endpoint) -> None:
        delay_s = self._settings.reconnect_min_s
        request = worker_pb2.WatchLoadRequest(interval_s=self._settings.load_interval_s)
        relearn = False
        """The link feed failed: the next try goes through `WatchLoad`, whose first report
        names the worker's link port as it is now (a restarted worker may have another)."""
        while True:
            got_report = False
            link = None if relearn else self.feed_link(ep.id)
            relearn = False
            try:
                if link is not None:
                    got_report = await self._watch_link(ep, link, request)
                    log.warning("load feed of %s on its link ended", ep.id)
                else:
                    # wait_for_ready: the call waits for the channel to connect (retried every
                    # <= 0.5 s, core/channels.py) and starts the moment the worker listens again.
                    call = ep.stub.WatchLoad(request, wait_for_ready=True)
                    moved = False
                    # ... which is silent: a channel that fails to connect is watched aside.
                    watcher = (
                        asyncio.create_task(self._watch_channel(ep, ep.channel, request))
                        if isinstance(ep.channel, aio.Channel)
                        else None
                    )
                    try:
                        async for report in call:
                            if watcher is not None:
                                watcher.cancel()
                                watcher = None
                            got_report |= self._take(ep, report)
                            if self.feed_link(ep.id) is not None:
                                call.cancel()  # the feed moves onto the worker's stream link
                                moved = True
                                break
                    finally:
                        if watcher is not None:
                            watcher.cancel()
                    if moved:
                        continue
                    log.warning("load stream of %s ended", ep.id)
            except grpc.RpcError as err:
                code = err.code() if isinstance(err, aio.AioRpcError) else None
                if link is not None and code == grpc.StatusCode.INVALID_ARGUMENT:
                    log.info("worker %s serves no feeds on its link: they stay on gRPC", ep.id)
                    ep.link_feeds = False
                    continue
                where = "on its link " if link is not None else ""
                log.warning("load stream of %s %sfailed: %s", ep.id, where, code)
            relearn = link is not None
            ep.connected = False
            self._notify()
            delay_s = self._settings.reconnect_min_s if got_report else delay_s
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, self._settings.reconnect_max_s)

    async def _watch_channel(
        self, ep: _Endpoint, channel: aio.Channel, request: worker_pb2.WatchLoadRequest
    ) -> None:
        """While the load call waits for `channel` to connect: a channel in TRANSIENT_FAILURE
        (gRPC keeps it there across its retries) is noted and logged at WARNING, rate-limited,
        with gRPC's error; looked at again every `UNREACHABLE_RECHECK_S`."""
        state = channel.get_state(try_to_connect=True)
        while True:
            if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                await self._connect_failed(ep, request)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(UNREACHABLE_RECHECK_S):
                    await channel.wait_for_state_change(state)
            state = channel.get_state()

    async def _connect_failed(self, ep: _Endpoint, request: worker_pb2.WatchLoadRequest) -> None:
        ep.unreachable_checks += 1
        now_s = self._clock.now_s()
        first = ep.unreachable is None
        if first:
            ep.unreachable_since_s = now_s
        elif now_s - ep.unreachable_logged_s < UNREACHABLE_LOG_EVERY_S:
            return
        # A call that does not wait for the channel fails at once with its last error.
        error = "TRANSIENT_FAILURE"
        probe = ep.stub.WatchLoad(request, wait_for_ready=False, timeout=10.0)
        try:
            await probe.read()
        except grpc.RpcError as err:
            if isinstance(err, aio.AioRpcError):
                error = f"{err.code().name}: {err.details()}"
        finally:
            probe.cancel()
        ep.unreachable, ep.unreachable_logged_s = error, now_s
        hint = (
            "; a worker serving mutual TLS refuses a plaintext router (give it --tls-dir)"
            if tls.identity() is None
            else ""
        )
        log.warning(
            "worker %s is unreachable (channel TRANSIENT_FAILURE for %.0f s): %s%s; gRPC keeps "
            "retrying (logged again every %g s while it persists)",
            ep.id,
            now_s - ep.unreachable_since_s,
            error,
            hint,
            UNREACHABLE_LOG_EVERY_S,
        )
        if first:
            self._notify()

    async def _watch_link(
        self, ep: _Endpoint, link: MuxLink, request: worker_pb2.WatchLoadRequest
    ) -> bool:
        """The load feed over `link` until it ends (an error raises as the call's would);
        True: a report came."""
        got_report = False
        sub = link.watch("watch_load", request)
        try:
            while (report := await sub.read()) is not aio.EOF:
                got_report |= self._take(ep, report)
        finally:
            sub.cancel()  # nothing when it ended; the pool stopping watching: a MuxCancel
        return got_report
