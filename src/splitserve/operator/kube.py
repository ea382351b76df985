"""Talking to the API server: get, list, create, JSON merge-patch, delete. Nothing else.

Only these verbs, on purpose: they behave the same on every API server the operator meets,
including test emulators without server-side apply, PUT or strategic merge. `apply` is
create-or-merge-patch with a client-side diff, so applying the same manifest twice sends
nothing the second time.

`Kube` is the protocol the reconciler uses; `RestKube` speaks HTTP through the official client's
configuration (kubeconfig or in-cluster), `CachedKube` serves reads from watch-fed caches; tests
use an in-memory fake (`tests/fakes/kube.py`).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from splitserve.api import v1alpha1 as v1

log = logging.getLogger(__name__)

Obj = dict[str, Any]

PLURALS: Final[Mapping[tuple[str, str], str]] = {
    ("v1", "Pod"): "pods",
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Event"): "events",
    ("v1", "Secret"): "secrets",
    ("apps/v1", "Deployment"): "deployments",
    ("batch/v1", "Job"): "jobs",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    (v1.API_VERSION, "LLMService"): "llmservices",
    (v1.API_VERSION, "LLMPool"): "llmpools",
    ("cert-manager.io/v1", "Certificate"): "certificates",
}

OWNED_KINDS: Final = (
    (v1.API_VERSION, "LLMPool"),
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("batch/v1", "Job"),
    ("v1", "PersistentVolumeClaim"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)
"""Kinds an `LLMService` owns (what deletion and pruning look at)."""


USER_AGENT: Final = "splitserve-operator"
REQUEST_TIMEOUT_S: Final = 30.0
"""No call to the API server may block a reconcile (and the operator's shutdown) for longer."""


PERMANENT: Final = frozenset({400, 403, 422})
"""Answers that repeating the same request cannot change: bad request, forbidden, invalid."""

REASONS: Final[Mapping[int, str]] = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
}


class KubeError(Exception):
    def __init__(
        self, status: int, message: str, target: str = "", permanent: bool | None = None
    ) -> None:
        super().__init__(f"{status}: {target + ': ' if target else ''}{message}")
        self.status = status
        self.message = message
        self.target = target
        """What the operator was doing, e.g. `create Deployment tiny-w`."""
        self._permanent = permanent

    @property
    def permanent(self) -> bool:
        """The same request would fail again: retry only after a change (or a long back-off).
        By the status unless the operator knows better (a child another service owns)."""
        return self.status in PERMANENT if self._permanent is None else self._permanent

    @property
    def reason(self) -> str:
        """One CamelCase word, for conditions and Events."""
        return REASONS.get(self.status, "ServerError" if self.status >= 500 else "ApiError")

    def about(self, target: str) -> KubeError:
        """The same error, naming what the operator was doing."""
        return KubeError(self.status, self.message, target, self._permanent)


def resource_path(
    api_version: str, kind: str, namespace: str, name: str | None = None, sub: str | None = None
) -> str:
    plural = PLURALS[(api_version, kind)]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}"
    if name is not None:
        path += f"/{name}"
        if sub is not None:
            path += f"/{sub}"
    return path


class Kube(Protocol):
    def get(
        self, api_version: str, kind: str, namespace: str, name: str, *, live: bool = False
    ) -> Obj | None:
        """The object, or None. `live`: from the API server even where a cache could answer."""
        ...

    def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[Obj]: ...

    def create(self, obj: Obj) -> Obj: ...

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Obj,
        subresource: str | None = None,
    ) -> Obj: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool: ...


def matches(obj: Mapping[str, Any], labels: Mapping[str, str] | None) -> bool:
    have = obj.get("metadata", {}).get("labels") or {}
    return all(have.get(k) == v for k, v in (labels or {}).items())


def covers(current: Any, desired: Any) -> bool:
    """Whether `current` already has everything `desired` sets (server defaults may add more)."""
    if isinstance(desired, Mapping):
        return isinstance(current, Mapping) and all(
            covers(current.get(k), v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(covers(c, d) for c, d in zip(current, desired, strict=True))
        )
    if isinstance(desired, str) and isinstance(current, int | float):
        return str(current) == desired
    return bool(current == desired)


def merge_diff(current: Mapping[str, Any], desired: Mapping[str, Any]) -> Obj:
    """The JSON merge patch that brings `current` up to `desired` (fields desired sets only)."""
    out: Obj = {}
    for key, want in desired.items():
        have = current.get(key)
        if covers(have, want):
            continue
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            out[key] = merge_diff(have, want)
        else:
            out[key] = want
    return out


APPLIED_FIELDS: Final = f"{v1.GROUP}/applied-fields"
"""Annotation on every object `apply` writes: the fields (keys only, no values) it set last, so
the next apply deletes those it no longer renders (a JSON merge patch keeps what it leaves out)."""

LEFT_TO_OTHERS: Final[Mapping[str, tuple[tuple[str, ...], ...]]] = {
    "LLMPool": (("spec", "replicas"),),
}
"""Fields rendered only at times (an `LLMPool`'s replicas: by the operator in Managed mode, by
`kubectl scale` or an HPA otherwise): not rendering them leaves them as they are."""


def _fields(value: Any) -> Any:
    """The shape of `value`: objects as objects of their keys, lists as lists of their items'
    shapes, any other value as 0."""
    if isinstance(value, Mapping):
        return {k: _fields(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fields(v) for v in value]
    return 0


def _record(body: Mapping[str, Any]) -> str:
    """The `APPLIED_FIELDS` annotation for `body` (its shape, less `LEFT_TO_OTHERS`)."""
    md = body.get("metadata") or {}
    skip = ("apiVersion", "kind", "metadata", "status")
    fields = _fields({k: v for k, v in body.items() if k not in skip})
    fields["metadata"] = {
        k: _fields(md[k]) for k in ("labels", "annotations") if isinstance(md.get(k), Mapping)
    }
    fields["metadata"].get("annotations", {}).pop(APPLIED_FIELDS, None)
    for path in LEFT_TO_OTHERS.get(str(body.get("kind")), ()):
        parent = fields
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def _dropped(
    last: Mapping[str, Any], body: Mapping[str, Any], current: Mapping[str, Any]
) -> dict[str, Any]:
    """A merge patch deleting what `last` recorded and `body` no longer sets (where `current`
    still has it)."""
    out: dict[str, Any] = {}
    for key, was in last.items():
        if key not in current:
            continue
        if key not in body:
            out[key] = None
        elif isinstance(was, Mapping) and isinstance(body[key], Mapping):
            have = current[key]
            if isinstance(have, Mapping) and (sub := _dropped(was, body[key], have)):
                out[key] = sub
        elif isinstance(was, list) and isinstance(body[key], list):
            # A merge patch replaces a list whole: send it when one of its objects lost a field.
            have = current[key]
            if isinstance(have, list) and any(
                isinstance(w, Mapping)
                and isinstance(b, Mapping)
                and isinstance(c, Mapping)
                and _dropped(w, b, c)
                for w, b, c in zip(was, body[key], have, strict=False)
            ):
                out[key] = body[key]
    return out


def _merged(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        have = out.get(key)
        if isinstance(have, Mapping) and isinstance(value, Mapping):
            out[key] = _merged(have, value)
        elif key not in out:
            out[key] = value
    return out


def apply(kube: Kube, obj: Obj) -> tuple[str, Obj]:
    """Create `obj`, or merge-patch the fields that differ. Returns (action, object).

    The fields set are recorded on the object (`APPLIED_FIELDS`); a field the last apply set
    and `obj` leaves out is deleted (except `LEFT_TO_OTHERS`). A failure names the object and
    the verb (`KubeError.target`).
    """
    record = _record(obj)
    obj = copy.deepcopy(obj)
    obj["metadata"].setdefault("annotations", {})[APPLIED_FIELDS] = record
    md = obj["metadata"]
    api_version, kind, namespace, name = obj["apiVersion"], obj["kind"], md["namespace"], md["name"]
    verb = "create"
    try:
        current = kube.get(api_version, kind, namespace, name)
        if current is None:
            try:
                return "created", kube.create(obj)
            except KubeError as err:
                if err.status != 409:
                    raise
                # Created meanwhile (or a cache that has not seen it yet): patch it instead.
                current = kube.get(api_version, kind, namespace, name, live=True)
                if current is None:
                    raise
        verb = "patch"
        _check_controller(current, obj)
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}
        diff = merge_diff(current, body)
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        try:
            last = json.loads(annotations[APPLIED_FIELDS])
        except (KeyError, TypeError, ValueError):
            last = None
        if isinstance(last, dict):
            diff = _merged(diff, _dropped(last, body, current))
        if not diff:
            return "unchanged", current
        return "patched", kube.patch(api_version, kind, namespace, name, diff)
    except KubeError as err:
        raise err.about(f"{verb} {kind} {name}") from err


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None)


def _check_controller(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> None:
    """Raise 409 when `current` is controlled by another owner than `wanted` names: a
    controller never takes over another's object (as a ReplicaSet never adopts a pod another
    controls). Permanent when the owner is another object (a name clash: a rename fixes it),
    temporary when it is an earlier object of the same kind and name (deleted, its children
    not yet collected)."""
    want, have = _controller(wanted), _controller(current)
    if want is None or have is None or have.get("uid") == want.get("uid"):
        return
    md = current.get("metadata") or {}
    what = f"{current.get('kind', wanted.get('kind'))} {md.get('name')}"
    owner = f"{have.get('kind')} {have.get('name')}"
    if (have.get("kind"), have.get("name")) == (want.get("kind"), want.get("name")):
        message = (
            f"{what} still belongs to the deleted {owner} of the same name (uid "
            f"{have.get('uid')}); waiting for the garbage collector to remove it"
        )
        raise KubeError(409, message, permanent=False)
    message = f"{what} belongs to {owner}: the names clash; rename one of them"
    raise KubeError(409, message, permanent=True)


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


ApiObserver = Callable[[str, str, float], None]
"""Told of every request `RestKube` makes: (verb, HTTP status code or `error`, seconds)."""

_VERBS: Final[Mapping[str, str]] = {
    "GET": "get",
    "POST": "create",
    "PATCH": "patch",
    "PUT": "update",
    "DELETE": "delete",
}


class RestKube:
    """The API server over HTTP, with the official client's auth and TLS configuration.

    `observe`: told of every request (the operator's `splitserve_operator_kube_*` metrics); all
    of them pass through `_call`, the one place that talks HTTP.
    """

    def __init__(self, api_client: Any | None = None, observe: ApiObserver | None = None) -> None:
        import kubernetes

        self.client = api_client or kubernetes.client.ApiClient()
        self.client.user_agent = USER_AGENT
        self.observe = observe

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        verb: str | None = None,
    ) -> Any:
        if self.observe is None:
            return self._request(method, path, body, content_type, query)[1]
        started = time.monotonic()
        code = "error"
        try:
            status, out = self._request(method, path, body, content_type, query)
            code = str(status)
            return out
        except KubeError as err:
            code = str(err.status)
            raise
        finally:
            self.observe(
                verb or _VERBS.get(method, method.lower()), code, time.monotonic() - started
            )

    def _request(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str,
        query: Mapping[str, str] | None,
    ) -> tuple[int, Any]:
        """(HTTP status, the decoded answer); a status outside 2xx raises `KubeError`."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        verb, url, header_params, payload, post_params = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.client.call_api(
            verb, url, header_params, payload, post_params, _request_timeout=REQUEST_TIMEOUT_S
        )
        data = response.read()
        if not 200 <= response.status < 300:
            try:
                message = json.loads(data).get("message", "")
            except ValueError:
                message = data.decode(errors="replace")[:500]
            raise KubeError(response.status, message, f"{method} {path}")
        return int(response.status), json.loads(data) if data else None

    def get(
        self, api_version: str, kind: str, namespace: str, name: str, *, live: bool = False
    ) -> Obj | None:
        try:
            out: Obj = self._call("GET", resource_path(api_version, kind, namespace, name))
        except KubeError as err:
            if err.status == 404:
                return None
            raise
        return out

    def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[Obj]:
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else {}
        out = self._call(
            "GET", resource_path(api_version, kind, namespace), query=query, verb="list"
        )
        items: list[Obj] = out.get("items") or []
        # Filter here too: some servers (and emulators) ignore labelSelector.
        return [i for i in items if matches(i, labels)]

    def create(self, obj: Obj) -> Obj:
        md = obj["metadata"]
        out: Obj = self._call(
            "POST", resource_path(obj["apiVersion"], obj["kind"], md["namespace"]), obj
        )
        return out

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Obj,
        subresource: str | None = None,
    ) -> Obj:
        path = resource_path(api_version, kind, namespace, name, subresource)
        out: Obj = self._call("PATCH", path, patch, "application/merge-patch+json")
        return out

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        try:
            self._call("DELETE", resource_path(api_version, kind, namespace, name), body)
        except KubeError as err:
            if err.status == 404:
                return False
            raise
        return True


class KubeconfigError(ValueError):
    """No usable credentials: one line saying where they were looked for and why they failed
    (`operator run` prints it and exits; kopf's start-up logs it)."""


def load_configuration(path: str | None) -> Any:
    """The official client's `Configuration`: from `path` when given, else in-cluster (the pod's
    ServiceAccount), else the default kubeconfig. kopf's login uses the same object, so the
    operator's own calls and kopf's run as one identity.

    Raises:
        KubeconfigError: none of these gives a server to call (a file that is not YAML or not
            a kubeconfig, no current context, a context without a server, no credentials).
    """
    import kubernetes
    import yaml

    from splitserve.api.validation import yaml_problem

    cfg = kubernetes.client.Configuration()
    if path is None or not path:
        try:
            kubernetes.config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return cfg
        except kubernetes.config.ConfigException as err:
            in_cluster = str(err).rstrip(".")
        where = "~/.kube/config"
    else:
        where = path
    try:
        # Without `path`: the default location (~/.kube/config; $KUBECONFIG as it was at import).
        kubernetes.config.load_kube_config(config_file=path or None, client_configuration=cfg)  # type: ignore[no-untyped-call]
    except yaml.YAMLError as err:
        problem = yaml_problem(err)
    except kubernetes.config.ConfigException as err:
        problem = str(err).removeprefix("Invalid kube-config file. ").rstrip(".")
    except OSError as err:  # unreadable
        problem = f"cannot be read ({err.strerror or err})"
    except (TypeError, AttributeError, KeyError, ValueError) as err:  # a list, a string, ...
        problem = f"not a kubeconfig ({err})"
    else:
        if cfg.host:
            return cfg
        problem = "the current context's cluster names no server"
    if path:
        raise KubeconfigError(f"kubeconfig {path}: {problem}")
    raise KubeconfigError(
        f"no Kubernetes credentials: not in a pod ({in_cluster}), and {where}: {problem}; "
        "give --kubeconfig or set KUBECONFIG"
    )


def _newer(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether `new` is at least as recent as `old` (resourceVersions compare as integers on
    every API server in use; anything else counts as newer)."""
    if old is None:
        return True
    a = str(new.get("metadata", {}).get("resourceVersion", ""))
    b = str(old.get("metadata", {}).get("resourceVersion", ""))
    if a.isdigit() and b.isdigit():
        return int(a) >= int(b)
    return True


class Store:
    """Objects of some kinds, kept current by watch events (kopf `on.event` handlers).

    A kind is *primed* in a namespace by one live list the first time it is read there; from
    then on the watch keeps it current and reads cost no request. Thread-safe (kopf feeds it on
    its event loop, reconciles read it from worker threads).
    """

    def __init__(
        self,
        kinds: Iterable[tuple[str, str]],
        keep: Callable[[Mapping[str, Any]], bool] = lambda obj: True,
    ) -> None:
        self.kinds = frozenset(kinds)
        self.keep = keep
        """Which objects to hold (the watch feeding the store must apply the same filter)."""
        self._objects: dict[tuple[str, str, str], dict[str, Obj]] = {}
        self._primed: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def caches(self, api_version: str, kind: str) -> bool:
        return (api_version, kind) in self.kinds

    def primed(self, api_version: str, kind: str, namespace: str) -> bool:
        with self._lock:
            return (api_version, kind, namespace) in self._primed

    def prime(self, api_version: str, kind: str, namespace: str, items: Iterable[Obj]) -> None:
        with self._lock:
            bucket = self._objects.setdefault((api_version, kind, namespace), {})
            for obj in items:
                if not self.keep(obj):
                    continue
                name = str(obj["metadata"]["name"])
                if _newer(obj, bucket.get(name)):
                    bucket[name] = obj
            self._primed.add((api_version, kind, namespace))

    def put(self, obj: Mapping[str, Any]) -> None:
        md = obj["metadata"]
        key = (str(obj["apiVersion"]), str(obj["kind"]), str(md.get("namespace", "")))
        if key[:2] not in self.kinds or not self.keep(obj):
            return
        with self._lock:
            bucket = self._objects.setdefault(key, {})
            if _newer(obj, bucket.get(str(md["name"]))):
                bucket[str(md["name"])] = copy.deepcopy(dict(obj))

    def remove(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self._objects.get((api_version, kind, namespace), {}).pop(name, None)

    def event(self, type_: str | None, obj: Mapping[str, Any]) -> None:
        """A watch event (`ADDED`, `MODIFIED`, `DELETED`; kopf's initial listing has None)."""
        if type_ == "DELETED":
            md = obj["metadata"]
            self.remove(obj["apiVersion"], obj["kind"], md.get("namespace", ""), md["name"])
        else:
            self.put(obj)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        with self._lock:
            obj = self._objects.get((api_version, kind, namespace), {}).get(name)
            return copy.deepcopy(obj) if obj is not None else None

    def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str] | None
    ) -> list[Obj]:
        with self._lock:
            bucket = self._objects.get((api_version, kind, namespace), {})
            return [copy.deepcopy(o) for _, o in sorted(bucket.items()) if matches(o, labels)]


class CachedKube:
    """A `Kube` whose reads of cached kinds come from a `Store`; writes go to `inner` and their
    answers update the store at once (a reconcile sees its own writes)."""

    def __init__(self, inner: Kube, store: Store) -> None:
        self.inner = inner
        self.store = store

    def _ready(self, api_version: str, kind: str, namespace: str) -> bool:
        if not self.store.caches(api_version, kind):
            return False
        if not self.store.primed(api_version, kind, namespace):
            items = self.inner.list(api_version, kind, namespace)
            self.store.prime(api_version, kind, namespace, items)
        return True

    def get(
        self, api_version: str, kind: str, namespace: str, name: str, *, live: bool = False
    ) -> Obj | None:
        if live or not self._ready(api_version, kind, namespace):
            obj = self.inner.get(api_version, kind, namespace, name, live=live)
            if obj is not None:
                self.store.put(obj)
            return obj
        return self.store.get(api_version, kind, namespace, name)

    def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[Obj]:
        if not self._ready(api_version, kind, namespace):
            return self.inner.list(api_version, kind, namespace, labels)
        return self.store.list(api_version, kind, namespace, labels)

    def create(self, obj: Obj) -> Obj:
        out = self.inner.create(obj)
        self.store.put(out)
        return out

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Obj,
        subresource: str | None = None,
    ) -> Obj:
        out = self.inner.patch(api_version, kind, namespace, name, patch, subresource)
        self.store.put(out)
        return out

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        gone = self.inner.delete(api_version, kind, namespace, name)
        self.store.remove(api_version, kind, namespace, name)
        return gone
