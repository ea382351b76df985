"""Worker discovery from Kubernetes: pods in, `PoolView` membership and fencing out.

Two halves:

- a pure translation (`endpoint_of`, `desired_endpoints`, `PodSet`): pod objects, as the API
  returns them, to the endpoint states the router wants (`podIP:grpcPort`, role label, ready,
  fenced);
- `KubernetesDiscovery`: lists the worker pods, watches from the list's resourceVersion, keeps a
  `PodSet` and applies every change of the desired endpoints to the pool (add / remove / fence /
  unfence). It re-lists when a watch ends (server timeout, 410 Gone, a broken stream) and backs
  off exponentially on errors.

A pod that is not Ready in Kubernetes (or is being deleted) stays in the pool but **fenced**: the
router keeps its channel and load stream, so requests already on it finish, a P/D hand-off that
already picked it still finds it, and the pod takes work again the moment it turns Ready. It is
removed only when it is deleted or stops matching the selector. The role label says which pods
are endpoints at all; the role the router places by is the one the worker reports on its load
stream, so a pod whose role label changes keeps its endpoint untouched.

The `kubernetes` client is synchronous: `KubernetesPodSource` runs each list, and each watch's
blocking reads, in a worker thread (`asyncio.to_thread`), handing events to the event loop through
a queue; closing a watch shuts its socket down so the thread ends at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from splitserve.aio import stop_task
from splitserve.api.router import DiscoverySettings
from splitserve.core.roles import Role

log = logging.getLogger(__name__)

Pod = Mapping[str, Any]
"""A pod as the API server returns it (decoded JSON, camelCase keys)."""


# ---------------------------------------------------------------------------------------------
# label selectors


_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[^\s=!,()]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[^\s,()]*)|\s*(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?"
    r"\s*$"
)


def parse_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate over labels for a Kubernetes label selector string.

    Supports `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` and `!k`, joined by
    commas. The API server filters too; this makes the router right against servers that do not
    (kmock) and lets a MODIFIED pod that stopped matching count as gone.

    Raises:
        ValueError: not a selector.
    """
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(selector):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    reqs: list[tuple[str, str, frozenset[str]]] = []
    for part in parts:
        if not part.strip():
            continue
        m = _REQUIREMENT.match(part)
        if m is None or (m["neg"] and (m["op"] or m["set"])):
            raise ValueError(f"bad label selector requirement {part!r} in {selector!r}")
        if m["neg"]:
            reqs.append((m["key"], "!exists", frozenset()))
        elif m["op"]:
            reqs.append((m["key"], "notin" if m["op"] == "!=" else "in", frozenset([m["value"]])))
        elif m["set"]:
            values = frozenset(v.strip() for v in m["values"].split(","))
            reqs.append((m["key"], m["set"], values))
        else:
            reqs.append((m["key"], "exists", frozenset()))

    def matches(labels: Mapping[str, str]) -> bool:
        for key, op, values in reqs:
            present = key in labels
            ok = {
                "exists": present,
                "!exists": not present,
                "in": present and labels[key] in values,
                "notin": not present or labels[key] not in values,
            }[op]
            if not ok:
                return False
        return True

    return matches


# ---------------------------------------------------------------------------------------------
# the pure translation


@dataclass(frozen=True, slots=True)
class EndpointState:
    """What the router wants for one worker endpoint."""

    address: str
    """`podIP:grpcPort`, the endpoint id in the pool."""
    role: Role
    """From the role label (informational: placement uses the worker's own load report)."""
    ready: bool
    """Pod condition Ready is True and the pod is not being deleted."""
    fenced: bool
    """The fenced label is `"true"`."""
    pod: str = ""
    """`namespace/name` of the pod (logs)."""

    @property
    def accepts_work(self) -> bool:
        return self.ready and not self.fenced


def _labels(pod: Pod) -> Mapping[str, str]:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def owned(pod: Pod, settings: DiscoverySettings) -> bool:
    """The pod's controller is a ReplicaSet of one of `settings.owner_deployments`
    (`<deployment>-<pod-template-hash>`); True when no Deployments are listed. A pod that only
    carries the worker labels (created by hand, by another controller) is not a worker."""
    if not settings.owner_deployments:
        return True
    md = pod.get("metadata") or {}
    template_hash = _labels(pod).get("pod-template-hash")
    if not template_hash:
        return False
    names = {f"{d}-{template_hash}" for d in settings.owner_deployments}
    for ref in md.get("ownerReferences") or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("controller") is True
            and ref.get("kind") == "ReplicaSet"
            and str(ref.get("apiVersion", "")).startswith("apps/")
            and ref.get("name") in names
        ):
            return True
    return False


def pod_key(pod: Pod) -> str:
    """`namespace/name`: what identifies a pod across watch events."""
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def endpoint_of(pod: Pod, settings: DiscoverySettings) -> EndpointState | None:
    """The endpoint a pod stands for, or None (no IP, no or unknown role label)."""
    labels = _labels(pod)
    try:
        role = Role(labels.get(settings.role_label, ""))
    except ValueError:
        return None
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if not ip:
        return None
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    host = f"[{ip}]" if ":" in ip else ip
    return EndpointState(
        address=f"{host}:{settings.grpc_port}",
        role=role,
        ready=ready and not deleting,
        fenced=labels.get(settings.fenced_label) == "true",
        pod=pod_key(pod),
    )


def _created(pod: Pod) -> tuple[str, str]:
    md = pod.get("metadata") or {}
    return (str(md.get("creationTimestamp") or ""), pod_key(pod))


def desired_endpoints(pods: Iterable[Pod], settings: DiscoverySettings) -> dict[str, EndpointState]:
    """Endpoint states by address for a set of (matching) pods.

    Two pods claiming one address (an IP reused while the old pod is still terminating): the
    newest pod (creationTimestamp, then namespace/name) wins.
    """
    out: dict[str, EndpointState] = {}
    for pod in sorted(pods, key=_created):
        ep = endpoint_of(pod, settings)
        if ep is not None:
            out[ep.address] = ep
    return out


class PodSet:
    """The matching pods, kept up to date from a list and then watch events."""

    def __init__(self, settings: DiscoverySettings) -> None:
        self.settings = settings
        self._selector = parse_selector(settings.selector)
        self.pods: dict[str, Pod] = {}
        self.refused: set[str] = set()
        """Pods that match the selector but no owner Deployment (logged once each)."""

    def _matches(self, pod: Pod) -> bool:
        if not self._selector(_labels(pod)):
            return False
        if owned(pod, self.settings):
            return True
        key = pod_key(pod)
        if key not in self.refused:
            self.refused.add(key)
            log.warning(
                "discovery: pod %s carries the worker labels but is not controlled by a "
                "ReplicaSet of %s: not a worker",
                key,
                ", ".join(self.settings.owner_deployments),
            )
        return False

    def replace(self, pods: Iterable[Pod]) -> None:
        """A fresh list: forget everything else."""
        self.pods = {pod_key(p): p for p in pods if self._matches(p)}

    def apply(self, event_type: str, pod: Pod) -> None:
        """ADDED / MODIFIED / DELETED (anything else is ignored)."""
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        key = pod_key(pod)
        if event_type == "DELETED" or not self._matches(pod):
            self.pods.pop(key, None)
            if event_type == "DELETED":
                self.refused.discard(key)
        else:
            self.pods[key] = pod

    def desired(self) -> dict[str, EndpointState]:
        return desired_endpoints(self.pods.values(), self.settings)


# ---------------------------------------------------------------------------------------------
# applying to the pool


class Membership(Protocol):
    """The part of `PoolView` discovery drives."""

    def add(self, address: str) -> Any: ...

    async def remove(self, eid: str) -> None: ...

    def fence(self, eid: str) -> None: ...

    def unfence(self, eid: str) -> None: ...


async def reconcile_pool(
    pool: Membership, current: Mapping[str, EndpointState], desired: Mapping[str, EndpointState]
) -> None:
    """Move the pool from `current` (what discovery applied before) to `desired`.

    Removes endpoints that are gone, adds new ones, and fences every endpoint that should take no
    new work (fenced label or not Ready); role changes need nothing.
    """
    for address in sorted(set(current) - set(desired)):
        log.info("discovery: %s (%s) gone", address, current[address].pod)
        await pool.remove(address)
    for address, want in sorted(desired.items()):
        had = current.get(address)
        if had is None:
            pool.add(address)
            log.info(
                "discovery: %s (%s) added, role label %s, ready %s, fenced %s",
                address,
                want.pod,
                want.role.value,
                want.ready,
                want.fenced,
            )
        if had is None or had.accepts_work != want.accepts_work:
            if want.accepts_work:
                pool.unfence(address)
            else:
                pool.fence(address)
        if had is not None and had != want:
            log.info("discovery: %s now %s", address, want)


# ---------------------------------------------------------------------------------------------
# the API side


class WatchGone(Exception):  # noqa: N818 - named after the HTTP status
    """The watch's resourceVersion is too old (410 Gone): list again."""


@dataclass(frozen=True, slots=True)
class PodList:
    items: list[dict[str, Any]]
    resource_version: str


class PodSource(Protocol):
    """Lists and watches the worker pods (`KubernetesPodSource`, or a fake in tests)."""

    async def list(self) -> PodList: ...

    def watch(self, resource_version: str) -> AsyncGenerator[dict[str, Any], None]:
        """Watch events (`{"type": ..., "object": ...}`) after `resource_version`.

        Ends when the server ends the watch. Raises `WatchGone` on 410.
        """
        ...


class KubernetesPodSource:
    """`PodSource` over the `kubernetes` client (in-cluster service account, else $KUBECONFIG)."""

    def __init__(self, settings: DiscoverySettings, api_client: Any | None = None) -> None:
        self.settings = settings
        self._api_client = api_client
        self._api: Any = None

    def _core(self) -> Any:
        if self._api is None:
            from kubernetes import client

            self._api = client.CoreV1Api(self._api_client or new_api_client())
        return self._api

    async def list(self) -> PodList:
        s = self.settings
        resp = await asyncio.to_thread(
            self._core().list_namespaced_pod,
            s.namespace,
            label_selector=s.selector,
            _preload_content=False,
            _request_timeout=30,
        )
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        return PodList(
            list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion"))
        )

    async def watch(self, resource_version: str) -> AsyncGenerator[dict[str, Any], None]:
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        try:
            resp = await asyncio.to_thread(
                self._core().list_namespaced_pod,
                s.namespace,
                label_selector=s.selector,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=s.watch_timeout_s,
                _preload_content=False,
                _request_timeout=(30, s.watch_timeout_s + 30),
            )
        except ApiException as err:
            if err.status == 410:
                raise WatchGone(str(err.reason)) from err
            raise
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stopping = threading.Event()

        def pump() -> None:
            from kubernetes.watch.watch import iter_resp_lines

            try:
                for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                    loop.call_soon_threadsafe(queue.put_nowait, ("line", line))
                loop.call_soon_threadsafe(queue.put_nowait, ("end", None))
            except BaseException as err:  # the socket shut down under us, or a real error
                if not stopping.is_set():
                    loop.call_soon_threadsafe(queue.put_nowait, ("error", err))

        reader = asyncio.ensure_future(asyncio.to_thread(pump))
        try:
            while True:
                what, value = await queue.get()
                if what == "end":
                    return
                if what == "error":
                    raise value
                event = json.loads(value)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchGone(str(obj.get("message")))
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                yield event
        finally:
            stopping.set()
            with contextlib.suppress(Exception):
                resp.shutdown()
            with contextlib.suppress(Exception):
                resp.release_conn()
            with contextlib.suppress(BaseException):
                await asyncio.shield(reader)


def new_api_client() -> Any:
    """A `kubernetes` ApiClient: the pod's service account, else $KUBECONFIG (or ~/.kube/config)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


class KubernetesDiscovery:
    """Keeps a `PoolView` in step with the worker pods.

    `pool` is the router's `PoolView` (anything with its membership methods). `start()` runs the
    list/watch loop in a task; `synced` is set once the first list has been applied; `stop()`
    cancels the loop (endpoints stay in the pool; closing the pool removes them).
    """

    def __init__(
        self,
        pool: Membership,
        settings: DiscoverySettings,
        source: PodSource | None = None,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.source: PodSource = source or KubernetesPodSource(settings)
        self.pods = PodSet(settings)
        self.applied: dict[str, EndpointState] = {}
        """What discovery last applied to the pool, by address."""
        self.synced = asyncio.Event()
        self.lists = 0
        """Lists done so far (tests, logs)."""
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="kubernetes-discovery")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def wait_for(
        self, predicate: Callable[[KubernetesDiscovery], bool], timeout_s: float | None = None
    ) -> None:
        """Wait until `predicate(self)` holds, re-checked after each applied change."""
        async with asyncio.timeout(timeout_s):
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()

    async def _sync(self) -> None:
        desired = self.pods.desired()
        await reconcile_pool(self.pool, self.applied, desired)
        self.applied = desired
        self._changed.set()

    async def run(self) -> None:
        """List, watch, re-list; forever (until cancelled)."""
        s = self.settings
        loop = asyncio.get_running_loop()
        delay_s = s.backoff_min_s
        while True:
            since = loop.time()
            try:
                listed = await self.source.list()
                self.lists += 1
                self.pods.replace(listed.items)
                await self._sync()
                self.synced.set()
                delay_s = s.backoff_min_s
                # aclosing: a cancel while applying an event still closes the watch (and its thread)
                async with contextlib.aclosing(
                    self.source.watch(listed.resource_version)
                ) as events:
                    async for event in events:
                        kind = str(event.get("type", ""))
                        if kind != "BOOKMARK":
                            self.pods.apply(kind, event.get("object") or {})
                            await self._sync()
                log.debug("discovery: watch ended; listing again")
            except WatchGone:
                log.info("discovery: watch expired (410 Gone); listing again")
            except Exception as err:
                log.warning(
                    "discovery: %s: %s; retrying in %.1fs", type(err).__name__, err, delay_s
                )
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, s.backoff_max_s)
                continue
            if loop.time() - since < s.backoff_min_s:  # a server that ends watches at once
                await asyncio.sleep(s.backoff_min_s)


# ---------------------------------------------------------------------------------------------
# a file of endpoints (`splitserve up --autoscale`)


WORKERS_FILE_VERSION = 1


def endpoints_from_file(text: str) -> dict[str, EndpointState]:
    """The endpoints a workers file names.

    The file (written whole, then renamed into place, by `splitserve up`'s supervisor)::

        {"version": 1, "workers": [{"address": "127.0.0.1:5001", "role": "prefill",
                                    "fenced": false}, ...]}

    Raises:
        ValueError: not such a file (bad JSON, a missing or unknown key, a bad role).
    """
    data = json.loads(text)
    if not isinstance(data, dict) or set(data) != {"version", "workers"}:
        raise ValueError('a workers file is {"version": 1, "workers": [...]}')
    if data["version"] != WORKERS_FILE_VERSION:
        raise ValueError(f"workers file version {data['version']!r}, expected 1")
    out: dict[str, EndpointState] = {}
    for entry in data["workers"]:
        if not isinstance(entry, dict) or set(entry) != {"address", "role", "fenced"}:
            raise ValueError(f"a worker entry has address, role and fenced; got {entry!r}")
        address, fenced = entry["address"], entry["fenced"]
        if not isinstance(address, str) or not address or not isinstance(fenced, bool):
            raise ValueError(f"bad worker entry {entry!r}")
        out[address] = EndpointState(address, Role(entry["role"]), True, fenced, address)
    return out


def workers_file_text(endpoints: Iterable[EndpointState]) -> str:
    """What `endpoints_from_file` reads back."""
    workers = [
        {"address": e.address, "role": e.role.value, "fenced": e.fenced}
        for e in sorted(endpoints, key=lambda e: e.address)
    ]
    return json.dumps({"version": WORKERS_FILE_VERSION, "workers": workers}, sort_keys=True)


def applied_path(path: str) -> str:
    """Where `FileDiscovery` writes the text it applied last (the writer's acknowledgement)."""
    return f"{path}.applied"


class FileDiscovery:
    """Keeps a `PoolView` in step with a workers file (`endpoints_from_file`), re-read every
    `poll_s`.

    After applying a version of the file it writes that text to `applied_path(path)`, so the
    writer knows when a fence (or a removal) is in effect in the router before it drains or
    stops the worker. A file that does not parse is logged and left unapplied (the pool keeps
    what it had); a missing file changes nothing (`up` may write it after the router starts),
    but is logged at WARNING when the router starts without it (a mistyped path served with no
    workers and said nothing) and again, at INFO, when it appears.
    """

    def __init__(self, pool: Membership, path: str, poll_s: float = 0.1) -> None:
        self.pool = pool
        self.path = path
        self.poll_s = poll_s
        self.applied: dict[str, EndpointState] = {}
        self.applied_text: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._missing = False
        """The file was missing at the last poll (logged once until it appears)."""

    async def start(self) -> None:
        await self.poll()
        if self._missing:
            log.warning(
                "workers file %s (--workers-file) does not exist: serving with no workers from "
                "it until it is created (it is re-read every %g s)",
                self.path,
                self.poll_s,
            )
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="file-discovery")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.poll()
            except Exception as err:  # keep polling: the next write may fix it
                log.warning("workers file %s: %s: %s", self.path, type(err).__name__, err)

    async def poll(self) -> None:
        """Apply the file if it changed since the last poll."""
        text = _read_text(self.path)  # a small local file: read inline, not in a thread
        if text is None:
            self._missing = True
            return
        if self._missing:
            self._missing = False
            log.info("workers file %s exists now: applying it", self.path)
        if text == self.applied_text:
            return
        try:
            desired = endpoints_from_file(text)
        except (ValueError, TypeError) as err:
            log.warning("workers file %s not applied: %s", self.path, err)
            self.applied_text = text  # do not log it again until it changes
            return
        await reconcile_pool(self.pool, self.applied, desired)
        self.applied, self.applied_text = desired, text
        _write_text(applied_path(self.path), text)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write_text(path: str, text: str) -> None:
    """Whole or not at all (write, then rename)."""
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(f"{path}.tmp", path)
