"""Worker discovery: pods -> endpoint states (pure), the list/watch loop on a fake API, fencing
as placement sees it, and `router.yaml` parsing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from splitserve.api import v1alpha1 as v1
from splitserve.api.router import DiscoverySettings, RouterConfig, RouterFile
from splitserve.core.clock import SystemClock
from splitserve.core.errors import NoEligibleEndpoint
from splitserve.core.ids import RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import RequestView
from splitserve.router.discovery import (
    EndpointState,
    KubernetesDiscovery,
    PodList,
    PodSet,
    WatchGone,
    desired_endpoints,
    endpoint_of,
    parse_selector,
    pod_key,
    reconcile_pool,
)
from splitserve.router.dispatch import default_decider
from splitserve.router.pool_view import PoolView
from splitserve.router.server import RouterServer
from tests.fakes.fake_worker import FakeWorker, Script
from tests.fakes.ports import free_port_on_all
from tests.fakes.signals import run_stopped_at_once
from tests.unit.router.conftest import FAST_POOL

SELECTOR = "splitserve.io/component=worker,splitserve.io/service=svc"
SETTINGS = DiscoverySettings(
    namespace="ns",
    selector=SELECTOR,
    role_label=v1.LABEL_ROLE,
    fenced_label=v1.LABEL_FENCED,
    grpc_port=50051,
    backoff_min_s=0.01,
    backoff_max_s=0.05,
)
MATCHING = {v1.LABEL_COMPONENT: "worker", v1.LABEL_SERVICE: "svc"}


def pod(
    name: str = "w-0",
    *,
    ip: str | None = "10.0.0.1",
    role: str | None = "decode",
    ready: bool | None = True,
    fenced: str | None = None,
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    """A worker pod as the API returns it."""
    all_labels = dict(MATCHING if labels is None else labels)
    if role is not None:
        all_labels[v1.LABEL_ROLE] = role
    if fenced is not None:
        all_labels[v1.LABEL_FENCED] = fenced
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": all_labels,
        "creationTimestamp": created,
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    status: dict[str, Any] = {"phase": "Running"}
    if ip is not None:
        status["podIP"] = ip
    if ready is not None:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "status": status}


def state(
    address: str = "10.0.0.1:50051",
    role: Role = Role.DECODE,
    *,
    ready: bool = True,
    fenced: bool = False,
    name: str = "w-0",
) -> EndpointState:
    return EndpointState(address, role, ready=ready, fenced=fenced, pod=f"ns/{name}")


# -- the pure translation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "want"),
    [
        pytest.param(pod(), state(), id="ready-decode"),
        pytest.param(pod(role="prefill"), state(role=Role.PREFILL), id="prefill"),
        pytest.param(pod(role="mixed"), state(role=Role.MIXED), id="mixed"),
        pytest.param(pod(role=None), None, id="no-role-label"),
        pytest.param(pod(role="router"), None, id="unknown-role"),
        pytest.param(pod(ip=None), None, id="no-ip-yet"),
        pytest.param(pod(ip=""), None, id="empty-ip"),
        pytest.param(pod(ready=False), state(ready=False), id="not-ready"),
        pytest.param(pod(ready=None), state(ready=False), id="no-conditions"),
        pytest.param(pod(deleting=True), state(ready=False), id="being-deleted"),
        pytest.param(pod(fenced="true"), state(fenced=True), id="fenced"),
        pytest.param(pod(fenced="false"), state(), id="fenced-false"),
        pytest.param(pod(fenced="True"), state(), id="fenced-only-lowercase-true"),
        pytest.param(
            pod(ready=False, fenced="true"), state(ready=False, fenced=True), id="fenced-not-ready"
        ),
        pytest.param(pod(ip="fd00::5"), state(address="[fd00::5]:50051"), id="ipv6"),
    ],
)
def test_endpoint_of(p: dict[str, Any], want: EndpointState | None) -> None:
    assert endpoint_of(p, SETTINGS) == want


@pytest.mark.parametrize(
    ("ep", "accepts"),
    [
        pytest.param(state(), True, id="ready"),
        pytest.param(state(ready=False), False, id="not-ready"),
        pytest.param(state(fenced=True), False, id="fenced"),
    ],
)
def test_accepts_work(ep: EndpointState, accepts: bool) -> None:
    assert ep.accepts_work is accepts


@pytest.mark.parametrize(
    ("selector", "labels", "want"),
    [
        pytest.param("a=1", {"a": "1"}, True, id="eq"),
        pytest.param("a==1", {"a": "1"}, True, id="eqeq"),
        pytest.param("a=1", {"a": "2"}, False, id="eq-other"),
        pytest.param("a=1", {}, False, id="eq-missing"),
        pytest.param("a!=1", {}, True, id="ne-missing"),
        pytest.param("a!=1", {"a": "1"}, False, id="ne"),
        pytest.param("a=1,b=2", {"a": "1", "b": "2", "c": "3"}, True, id="and"),
        pytest.param("a=1, b=2", {"a": "1"}, False, id="and-missing"),
        pytest.param("a in (1, 2),b", {"a": "2", "b": ""}, True, id="in-exists"),
        pytest.param("a notin (1,2)", {"a": "3"}, True, id="notin"),
        pytest.param("a notin (1,2)", {"a": "1"}, False, id="notin-hit"),
        pytest.param("!a", {"b": "1"}, True, id="not-exists"),
        pytest.param("!a", {"a": "1"}, False, id="not-exists-hit"),
        pytest.param(SELECTOR, {**MATCHING, v1.LABEL_ROLE: "decode"}, True, id="operator"),
        pytest.param("", {"a": "1"}, True, id="empty-matches-all"),
    ],
)
def test_parse_selector(selector: str, labels: dict[str, str], want: bool) -> None:
    assert parse_selector(selector)(labels) is want


@pytest.mark.parametrize("selector", ["a=(1)", "!a=1", "a in 1", "a b"])
def test_parse_selector_rejects(selector: str) -> None:
    with pytest.raises(ValueError, match="bad label selector"):
        parse_selector(selector)


def test_same_ip_newest_pod_wins() -> None:
    old = pod("old", ready=False, deleting=True, created="2026-01-01T00:00:00Z")
    new = pod("new", role="prefill", created="2026-01-01T00:05:00Z")
    for order in ([old, new], [new, old]):
        assert desired_endpoints(order, SETTINGS) == {
            "10.0.0.1:50051": state(role=Role.PREFILL, name="new")
        }


def test_podset_drops_pods_that_stop_matching() -> None:
    pods = PodSet(SETTINGS)
    pods.replace([pod("a"), pod("b", ip="10.0.0.2", labels={"other": "x"})])
    assert list(pods.desired()) == ["10.0.0.1:50051"]
    pods.apply("MODIFIED", pod("a", labels={**MATCHING, v1.LABEL_SERVICE: "other"}))
    assert pods.desired() == {}


# -- convergence: any event sequence ends where the final pod set says ------------------------


@dataclass
class FakePool:
    """`PoolView`'s membership half, recorded."""

    fenced: dict[str, bool] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def add(self, address: str) -> str:
        assert address not in self.fenced, f"added twice: {address}"
        self.fenced[address] = False
        self.calls.append(("add", address))
        return address

    async def remove(self, eid: str) -> None:
        self.fenced.pop(eid)
        self.calls.append(("remove", eid))

    def fence(self, eid: str) -> None:
        self.fenced[eid] = True
        self.calls.append(("fence", eid))

    def unfence(self, eid: str) -> None:
        self.fenced[eid] = False
        self.calls.append(("unfence", eid))


pods_st = st.builds(
    pod,
    name=st.sampled_from(["w-0", "w-1", "w-2", "w-3"]),
    ip=st.sampled_from([None, "10.0.0.1", "10.0.0.2", "10.0.0.3"]),
    role=st.sampled_from([None, "prefill", "decode", "mixed", "bogus"]),
    ready=st.sampled_from([None, True, False]),
    fenced=st.sampled_from([None, "true", "false"]),
    deleting=st.booleans(),
    labels=st.sampled_from([None, {v1.LABEL_COMPONENT: "worker", v1.LABEL_SERVICE: "other"}]),
    created=st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"]),
)
events_st = st.lists(
    st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]), pods_st),
    max_size=30,
)


async def _replay(
    initial: list[dict[str, Any]], events: list[tuple[str, dict[str, Any]]]
) -> tuple[FakePool, dict[str, EndpointState], dict[str, dict[str, Any]]]:
    pool = FakePool()
    podset = PodSet(SETTINGS)
    podset.replace(initial)
    applied: dict[str, EndpointState] = {}
    cluster = {pod_key(p): p for p in initial}
    for kind, obj in [("LIST", {}), *events]:
        if kind in ("ADDED", "MODIFIED"):
            cluster[pod_key(obj)] = obj
        elif kind == "DELETED":
            cluster.pop(pod_key(obj), None)
        if kind != "LIST":
            podset.apply(kind, obj)
        desired = podset.desired()
        await reconcile_pool(pool, applied, desired)
        applied = desired
    return pool, applied, cluster


@settings(max_examples=300, deadline=None)
@given(initial=st.lists(pods_st, max_size=4, unique_by=pod_key), events=events_st)
def test_events_converge_to_final_pod_set(
    initial: list[dict[str, Any]], events: list[tuple[str, dict[str, Any]]]
) -> None:
    pool, applied, cluster = asyncio.run(_replay(initial, events))
    matches = parse_selector(SELECTOR)
    want = desired_endpoints(
        [p for p in cluster.values() if matches(p["metadata"]["labels"])], SETTINGS
    )
    assert applied == want
    assert pool.fenced == {address: not ep.accepts_work for address, ep in want.items()}
    # and a fresh list of the final pods lands in the same place
    relisted = PodSet(SETTINGS)
    relisted.replace(cluster.values())
    assert relisted.desired() == want


# -- the list/watch loop against a fake API ---------------------------------------------------


class FakeSource:
    """A `PodSource`: the cluster is `pods`; the open watch plays the scripts tests queue."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {pod_key(p): p for p in pods}
        self.rv = 1
        self.watches: asyncio.Queue[list[Any]] = asyncio.Queue()
        """Scripts for the open watch: events, an exception to raise, or "end"."""
        self.list_calls = 0
        self.watch_rvs: list[str] = []
        self.fail_lists = 0

    async def list(self) -> PodList:
        self.list_calls += 1
        if self.fail_lists:
            self.fail_lists -= 1
            raise ConnectionError("API server unreachable")
        return PodList(list(self.pods.values()), str(self.rv))

    def event(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        if kind == "DELETED":
            self.pods.pop(pod_key(obj), None)
        else:
            self.pods[pod_key(obj)] = obj
        return {"type": kind, "object": obj}

    async def watch(self, resource_version: str) -> AsyncGenerator[dict[str, Any], None]:
        self.watch_rvs.append(resource_version)
        while True:
            for step in await self.watches.get():
                if step == "end":
                    return
                if isinstance(step, BaseException):
                    raise step
                yield step


@pytest.fixture
def fake_pool() -> FakePool:
    return FakePool()


@contextlib.asynccontextmanager
async def running(discovery: KubernetesDiscovery) -> AsyncIterator[KubernetesDiscovery]:
    await discovery.start()
    try:
        yield discovery
    finally:
        await discovery.stop()


async def test_list_then_watch_then_relist(fake_pool: FakePool) -> None:
    source = FakeSource([pod("a"), pod("b", ip="10.0.0.2", role="prefill", ready=False)])
    discovery = KubernetesDiscovery(fake_pool, SETTINGS, source)
    async with running(discovery):
        await asyncio.wait_for(discovery.synced.wait(), 5)
        assert fake_pool.fenced == {"10.0.0.1:50051": False, "10.0.0.2:50051": True}
        assert source.watch_rvs == ["1"]
        # b turns ready, a is fenced by a flip, c appears, a's role flips: same endpoint
        await source.watches.put(
            [
                source.event("MODIFIED", pod("b", ip="10.0.0.2", role="prefill")),
                source.event("MODIFIED", pod("a", fenced="true")),
                source.event("ADDED", pod("c", ip="10.0.0.3")),
                source.event("MODIFIED", pod("a", fenced="true", role="prefill")),
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
            ]
        )
        await discovery.wait_for(
            lambda d: len(d.applied) == 3 and d.applied["10.0.0.1:50051"].role is Role.PREFILL, 5
        )
        assert fake_pool.fenced == {
            "10.0.0.1:50051": True,
            "10.0.0.2:50051": False,
            "10.0.0.3:50051": False,
        }
        assert ("remove", "10.0.0.1:50051") not in fake_pool.calls
        # the watch expires: list again (c was deleted meanwhile, unseen by the old watch)
        source.pods.pop("ns/c")
        await source.watches.put([WatchGone("too old")])
        await discovery.wait_for(lambda d: "10.0.0.3:50051" not in d.applied, 5)
        assert source.list_calls == 2
        assert "10.0.0.3:50051" not in fake_pool.fenced
        # the server ends the watch: list again
        await source.watches.put(["end"])
        await discovery.wait_for(lambda d: d.lists == 3, 5)
        # deletion removes; unfencing lets it take work again
        await source.watches.put(
            [source.event("DELETED", pod("b")), source.event("MODIFIED", pod("a", fenced="false"))]
        )
        await discovery.wait_for(lambda d: len(d.applied) == 1, 5)
        await discovery.wait_for(lambda d: d.applied["10.0.0.1:50051"].accepts_work, 5)
        assert fake_pool.fenced == {"10.0.0.1:50051": False}


async def test_backs_off_and_recovers_from_errors(fake_pool: FakePool) -> None:
    source = FakeSource([pod("a")])
    source.fail_lists = 2
    discovery = KubernetesDiscovery(fake_pool, SETTINGS, source)
    async with running(discovery):
        await asyncio.wait_for(discovery.synced.wait(), 5)
        assert source.list_calls == 3
        await source.watches.put([RuntimeError("stream broke")])
        await discovery.wait_for(lambda d: d.lists == 2, 5)
        assert fake_pool.fenced == {"10.0.0.1:50051": False}


# -- fencing as placement sees it: live fake workers on 127.0.0.x, one gRPC port ---------------


class LoopbackWorker(FakeWorker):
    async def start_on(self, host: str, port: int) -> str:
        from grpc import aio

        from splitserve._gen.v1 import worker_pb2_grpc

        self._server = aio.server()
        worker_pb2_grpc.add_WorkerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"{host}:{port}")
        await self._server.start()
        self.address = f"{host}:{port}"
        return self.address


@pytest.fixture
async def loopback_workers() -> AsyncIterator[dict[str, LoopbackWorker]]:
    """Decode workers on 127.0.0.2 and .3, a prefill worker on .4, all on one port."""
    hosts = {"127.0.0.2": Role.DECODE, "127.0.0.3": Role.DECODE, "127.0.0.4": Role.PREFILL}
    port = free_port_on_all(list(hosts))
    workers = {host: LoopbackWorker(Script(role=role)) for host, role in hosts.items()}
    for host, worker in workers.items():
        await worker.start_on(host, port)
    yield workers
    for worker in workers.values():
        await worker.stop()


def _picked(pool: PoolView) -> set[str]:
    """Every endpoint placement would consider for a long prompt (empty: none eligible)."""
    req = RequestView(RequestId("r"), num_prompt_tokens=32, max_tokens=8)
    try:
        placement = default_decider().place(req, pool.views())
    except NoEligibleEndpoint:
        return set()
    return {*placement.decode, *placement.prefill}


async def _placed(pool: PoolView, want: set[str]) -> None:
    await pool.wait_for(lambda pv: _picked(pv) == want, 10)


async def test_fenced_or_unready_pods_are_never_picked(
    loopback_workers: dict[str, LoopbackWorker],
) -> None:
    port = int(next(iter(loopback_workers.values())).address.rsplit(":", 1)[1])
    cfg = SETTINGS.model_copy(update={"grpc_port": port})
    d2, d3, p4 = (f"127.0.0.{i}:{port}" for i in (2, 3, 4))
    source = FakeSource(
        [
            pod("d2", ip="127.0.0.2"),
            pod("d3", ip="127.0.0.3", fenced="true"),
            pod("p4", ip="127.0.0.4", role="prefill", ready=False),
        ]
    )
    async with PoolView([], clock=SystemClock(), settings=FAST_POOL) as pool:
        discovery = KubernetesDiscovery(pool, cfg, source)
        async with running(discovery):
            await pool.wait_for(
                lambda pv: len(pv.ids()) == 3 and all(v.ready for v in pv.views()), 10
            )
            await _placed(pool, {d2})  # d3 fenced, p4 not Ready: aggregated on d2
            for _ in range(20):
                assert _picked(pool) & {d3, p4} == set()
            await source.watches.put(
                [
                    source.event("MODIFIED", pod("d2", ip="127.0.0.2", fenced="true")),
                    source.event("MODIFIED", pod("d3", ip="127.0.0.3")),
                    source.event("MODIFIED", pod("p4", ip="127.0.0.4", role="prefill")),
                ]
            )
            await discovery.wait_for(lambda d: d.applied[p4].accepts_work, 5)
            await _placed(pool, {d3, p4})
            for _ in range(20):
                assert d2 not in _picked(pool)
            await source.watches.put(
                [source.event("MODIFIED", pod("d3", ip="127.0.0.3", deleting=True))]
            )
            await discovery.wait_for(lambda d: not d.applied[d3].accepts_work, 5)
            assert pool.view(d3).fenced
            assert _picked(pool) == set()  # only a prefill worker takes work: nothing to place


# -- router.yaml ------------------------------------------------------------------------------


def _router_yaml() -> dict[str, Any]:
    """What operator/render.py `router_config` writes (copied shape; tests may not import it)."""
    data: dict[str, Any] = yaml.safe_load(
        """
defaultSloClass: interactive
discovery:
  fencedLabel: splitserve.io/fenced
  grpcPort: 50051
  kind: kubernetes
  namespace: ns
  roleLabel: splitserve.io/role
  selector: splitserve.io/component=worker,splitserve.io/service=svc
listen: {grpcPort: 50050, httpPort: 8000}
model: {name: llama, source: meta-llama/Llama-3.1-8B-Instruct}
placement: {disaggregation: Auto, profile: default}
service: svc
sloClasses:
- {attainment: 0.95, name: interactive, percentile: 0.9, priority: 10, sheddable: false,
   tpotMs: 50.0, ttftMs: 500.0}
"""
    )
    return data


def test_router_yaml_to_config() -> None:
    parsed, ignored = RouterFile.from_configmap(_router_yaml())
    assert ignored == ()
    config = parsed.router_config()
    assert (config.model_name, config.tokenizer_dir) == (
        "llama",
        "meta-llama/Llama-3.1-8B-Instruct",
    )
    assert (config.http_host, config.http_port, config.grpc_port) == (
        "127.0.0.1",
        8000,
        50050,
    )  # loopback unless told (issue 19)
    assert config.discovery == SETTINGS.model_copy(
        update={"backoff_min_s": 0.5, "backoff_max_s": 30.0}
    )
    assert parsed.slo_classes[0].ttft_ms == 500.0
    assert parsed.router_config(http_port=9000, tokenizer_dir="/t").http_port == 9000


def test_router_yaml_unknown_keys_are_reported_not_fatal() -> None:
    data = _router_yaml()
    data["future"] = {"x": 1}
    data["discovery"]["podPortAnnotation"] = "x"
    data["sloClasses"][0]["newTarget"] = 3
    data["model"]["tokenizer"] = "/tok"
    parsed, ignored = RouterFile.from_configmap(data)
    assert sorted(ignored) == ["discovery.podPortAnnotation", "future", "sloClasses[0].newTarget"]
    assert parsed.router_config().tokenizer_dir == "/tok"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param(("discovery", "kind"), "dns", id="discovery-kind"),
        pytest.param(("discovery", "grpcPort"), 0, id="discovery-port"),
        pytest.param(("listen", "httpPort"), "http", id="listen-port"),
        pytest.param(("placement", "disaggregation"), "Sometimes", id="disaggregation"),
    ],
)
def test_router_yaml_bad_values_fail(path: tuple[str, str], value: object) -> None:
    data = _router_yaml()
    data[path[0]][path[1]] = value
    with pytest.raises(ValidationError):
        RouterFile.from_configmap(data)


# -- the router process with discovery -------------------------------------------------------


async def test_router_serves_discovered_workers(
    loopback_workers: dict[str, LoopbackWorker], tokenizer: Any, tokenizer_dir: Path
) -> None:
    port = int(next(iter(loopback_workers.values())).address.rsplit(":", 1)[1])
    source = FakeSource(
        [
            pod("d2", ip="127.0.0.2"),
            pod("d3", ip="127.0.0.3", fenced="true"),
            pod("p4", ip="127.0.0.4", role="prefill"),
        ]
    )
    config = RouterConfig(
        model_name="m",
        tokenizer_dir=str(tokenizer_dir),
        http_host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        pool=FAST_POOL,
        discovery=SETTINGS.model_copy(update={"grpc_port": port}),
    )
    server = RouterServer(config, tokenizer=tokenizer, pod_source=source)
    await server.start()
    try:
        await server.pool.wait_for(
            lambda pv: len(pv.ids()) == 3 and all(v.ready for v in pv.views()), 10
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
            resp = await client.post(
                "/v1/completions", json={"model": "m", "prompt": "hello there", "max_tokens": 4}
            )
        assert resp.status_code == 200, resp.text
        names = {host: w.names() for host, w in loopback_workers.items()}
        assert names["127.0.0.3"] == []  # fenced: nothing
        assert "Prefill" in names["127.0.0.4"]
        assert "Decode" in names["127.0.0.2"]
    finally:
        await server.stop()
    assert server.pool.ids() == []


# -- `splitserve router serve --config` ------------------------------------------------------


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[RouterConfig]:
    """Run the CLI up to building the server; record the config instead of serving."""
    from splitserve.cli import router as cli_router

    configs: list[RouterConfig] = []

    class NoServer:
        def __init__(
            self, config: RouterConfig, *, reuse_port: bool = False, tokenizer: object = None
        ) -> None:
            configs.append(config)
            self.http_port, self.grpc_port = 1, 2

        async def start(self) -> None:
            pass

        async def wait(self) -> None:
            await asyncio.Event().wait()

        async def stop(self) -> None:
            pass

    monkeypatch.setattr(cli_router, "RouterServer", NoServer)
    monkeypatch.setattr(cli_router, "run_until_signalled", run_stopped_at_once)
    # Not loaded: the file names a hub id (tests/unit/cli/test_tokenizer_refusals.py loads).
    monkeypatch.setattr(cli_router, "_router_tokenizer", lambda *_: None)
    monkeypatch.setattr("splitserve.cli.logs.setup", lambda *a, **k: None)
    return configs


def test_cli_config_file_and_overrides(captured: list[RouterConfig], tmp_path: Path) -> None:
    from splitserve.cli.router import router

    data = _router_yaml()
    data["future"] = 1
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(data))
    runner = CliRunner()
    result = runner.invoke(router, ["serve", f"--config={path}"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        router,
        [
            "serve",
            "--config",
            str(path),
            "--port",
            "9000",
            "--tokenizer",
            str(tmp_path),
            "--worker",
            "x:1",
        ],
    )
    assert result.exit_code == 0, result.output
    from_file, overridden = captured
    assert from_file.http_port == 8000
    assert from_file.grpc_port == 50050
    assert from_file.http_host == "127.0.0.1"  # loopback unless --host or listen.host
    assert from_file.tokenizer_dir == "meta-llama/Llama-3.1-8B-Instruct"
    assert from_file.discovery is not None
    assert from_file.discovery.selector == SELECTOR
    assert from_file.worker_addresses == ()
    assert overridden.http_port == 9000
    assert overridden.grpc_port == 50050  # not given: the file's
    assert overridden.tokenizer_dir == str(tmp_path)
    assert overridden.worker_addresses == ("x:1",)
    assert overridden.discovery == from_file.discovery


def test_cli_without_config_keeps_flags(captured: list[RouterConfig], tmp_path: Path) -> None:
    from splitserve.cli.router import router

    result = CliRunner().invoke(
        router, ["serve", "--worker", "a:1", "--tokenizer", str(tmp_path), "--port", "0"]
    )
    assert result.exit_code == 0, result.output
    (config,) = captured
    assert config.discovery is None
    assert (config.http_host, config.grpc_port, config.worker_addresses) == (
        "127.0.0.1",
        0,
        ("a:1",),
    )


def test_cli_bad_config_file(captured: list[RouterConfig], tmp_path: Path) -> None:
    from splitserve.cli.router import router

    path = tmp_path / "router.yaml"
    path.write_text("- not a mapping\n")
    result = CliRunner().invoke(router, ["serve", f"--config={path}"])
    assert result.exit_code == 2
    assert "not a YAML mapping" in result.output
    data = _router_yaml()
    data["discovery"]["grpcPort"] = "x"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(router, ["serve", f"--config={path}"])
    assert result.exit_code == 2
    assert "grpcPort" in result.output or "grpc_port" in result.output
    assert captured == []


def test_config_models_document_every_field() -> None:
    from splitserve.api import router as api_router

    missing = [
        f"{model.__name__}.{name}"
        for model in (
            api_router.DiscoverySettings,
            api_router.RouterConfig,
            api_router.RouterFile,
            api_router.ListenFile,
            api_router.PlacementFile,
        )
        for name, info in model.model_fields.items()
        if not info.description
    ]
    assert missing == []
