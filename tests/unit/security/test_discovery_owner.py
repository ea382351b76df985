"""Router discovery accepts only pods controlled by a ReplicaSet of the service's Deployments."""

from __future__ import annotations

from typing import Any

import pytest

from splitserve.api.router import DiscoverySettings
from splitserve.router.discovery import PodSet, owned

SETTINGS = DiscoverySettings(
    namespace="ml",
    selector="app=w",
    role_label="role",
    fenced_label="fenced",
    grpc_port=50051,
    owner_deployments=("s-main",),
)


def _pod(name: str, owner: dict[str, Any] | None, template_hash: str | None = "abc") -> Any:
    labels = {"app": "w", "role": "decode"}
    if template_hash is not None:
        labels["pod-template-hash"] = template_hash
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "status": {"podIP": "10.0.0.1"}}


RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "s-main-abc", "controller": True}


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        (_pod("ok", RS), True),
        (_pod("none", None), False),
        (_pod("no-hash", RS, template_hash=None), False),
        (_pod("other-hash", RS, template_hash="xyz"), False),
        (_pod("other-deployment", {**RS, "name": "t-main-abc"}), False),
        (_pod("not-controller", {**RS, "controller": False}), False),
        (_pod("a-job", {**RS, "kind": "Job", "apiVersion": "batch/v1"}), False),
    ],
)
def test_owned(pod: Any, want: bool) -> None:
    assert owned(pod, SETTINGS) is want


def test_without_owner_deployments_every_matching_pod_counts() -> None:
    assert owned(_pod("none", None), SETTINGS.model_copy(update={"owner_deployments": ()}))


def test_podset_refuses_unowned_pods_and_forgets_them_when_deleted() -> None:
    pods = PodSet(SETTINGS)
    pods.replace([_pod("ok", RS), _pod("stray", None)])
    assert set(pods.pods) == {"ml/ok"}
    assert pods.refused == {"ml/stray"}
    pods.apply("DELETED", _pod("stray", None))
    assert pods.refused == set()
