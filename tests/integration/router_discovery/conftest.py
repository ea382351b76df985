"""An API server for the router's discovery tests: kmock (default) or a real cluster.

`TARGET=kmock` (default) runs kmock's `KubernetesEmulator` on 127.0.0.1 in a thread of its own,
declaring `v1/pods` and stamping what a real server would on create (namespace, uid,
creationTimestamp, resourceVersion). kmock ignores label selectors and `resourceVersion` (every
watch replays the current pods as ADDED) and never ends a watch; discovery copes with all three.
Its watch also had a window that lost writes (`tests.fakes.kmock_thread.consistent_watch` closes
it).

`TARGET=real` uses `$KUBECONFIG` as it is; pods are created in `$TEST_NAMESPACE` (default
`default`) and must be able to run `$TEST_POD_IMAGE` (default `registry.k8s.io/pause:3.10`).

Unlike the operator's harness this one leaves `$KUBECONFIG` alone: discovery gets its API client
passed in.
"""

from __future__ import annotations

import datetime
import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.kmock_thread import KmockThread, consistent_watch
from tests.fakes.rbac import ApiCall

TARGET = os.environ.get("TARGET", "kmock")


def _emulator_class() -> type[Any]:
    import kmock
    from kmock._internal import enums

    class Emulator(kmock.KubernetesEmulator):
        _versions = itertools.count(100)
        expire_watches = 0
        """The next this many watches answer `410 Gone` (an ERROR event) and end."""

        async def _handle(self, request: Any) -> Any:
            if request.resource is not None and isinstance(request.data, dict):
                rv = str(next(self._versions))
                md = request.data.setdefault("metadata", {})
                md["resourceVersion"] = rv
                if request.action == enums.action.CREATE:
                    if request.namespace:
                        md["namespace"] = request.namespace
                    md.setdefault("uid", str(uuid.uuid4()))
                    md.setdefault(
                        "creationTimestamp",
                        datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                    )
            return await super()._handle(request)

        async def _serve_list(self, request: Any) -> Any:
            result: dict[str, Any] = dict(await super()._serve_list(request))  # type: ignore[arg-type]
            result["metadata"] = {"resourceVersion": str(next(self._versions))}
            return result

        async def _serve_watch(self, request: Any) -> Any:
            if self.expire_watches > 0:
                self.expire_watches -= 1
                yield b""
                yield {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": "Expired",
                        "code": 410,
                        "message": "too old resource version",
                    },
                }
                return
            async for event in consistent_watch(self, request):
                yield event

    return Emulator


def _populate(emulator: Any) -> None:
    import kmock

    emulator.resources["v1/pods"] = kmock.ResourceInfo(
        kind="Pod",
        singular="pod",
        namespaced=True,
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        subresources={"status"},
    )


class KmockServer(KmockThread):
    """kmock serving pods (the test's own loop runs the router)."""

    def __init__(self) -> None:
        super().__init__(_emulator_class(), _populate)


_SERVER: KmockServer | None = None


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The kubeconfig path of the API server under test."""
    global _SERVER
    if TARGET == "kmock":
        _SERVER = KmockServer().start()
        path = Path(tmp_path_factory.mktemp("kmock")) / "kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: kmock, cluster: {{server: '{_SERVER.url}'}}}}]\n"
            "users: [{name: test, user: {}}]\n"
            "contexts: [{name: kmock, context: {cluster: kmock, user: test}}]\n"
            "current-context: kmock\n"
        )
        yield str(path)
        _SERVER.stop()
        _SERVER = None
    else:
        path_env = os.environ.get("KUBECONFIG")
        if not path_env:
            pytest.skip("TARGET=real needs KUBECONFIG")
        if not _ready_nodes(path_env):
            pytest.skip(
                "TARGET=real: no Ready node, so no kubelet to run the test pods and give them "
                "IPs (a control plane alone cannot run these tests)"
            )
        yield path_env


def _ready_nodes(kubeconfig: str) -> list[str]:
    import kubernetes

    client = kubernetes.config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    out = []
    for node in kubernetes.client.CoreV1Api(client).list_node().items:
        conditions = (node.status.conditions if node.status else None) or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            out.append(str(node.metadata.name if node.metadata else ""))
    return out


@pytest.fixture
def expire_watches(kubeconfig: str) -> Callable[[int], None] | None:
    """Make the next n watches answer 410 Gone (None on a real cluster)."""
    if _SERVER is None:
        return None
    emulator = _SERVER.emulator

    def expire(n: int) -> None:
        emulator.expire_watches = n

    return expire


@pytest.fixture
def api_calls(kubeconfig: str) -> Callable[[], list[ApiCall]] | None:
    """Every request the emulator has answered so far (None on a real cluster)."""
    return None if _SERVER is None else _SERVER.calls
