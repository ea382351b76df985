"""reconcile() against the in-memory API server: children, roles, flips, status, idempotence."""

from __future__ import annotations

from typing import Any

import pytest

from splitserve.api import v1alpha1 as v1
from splitserve.core.errors import ConfigError
from splitserve.core.roles import Role
from splitserve.operator import reconcile as rc
from splitserve.operator import render
from splitserve.operator.kube import KubeError
from splitserve.policy.planner.flip import FlipProgress, Step
from tests.fakes.kube import FakeWorkers, MemoryKube, worker_pod

NS = "default"
NOW = "2026-01-01T00:00:00Z"
SETTINGS = rc.Settings(router_image="router:1", drain_wait_s=0.0)


def make_service(kube: MemoryKube, name: str = "tiny", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name": "m", "source": "org/m"},
        "engine": {"kind": "sim", "image": "img:1"},
        "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
        "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
        "scaling": {"mode": "Manual"},
    }
    body.update(spec)
    return kube.create(
        {
            "apiVersion": v1.API_VERSION,
            "kind": "LLMService",
            "metadata": {"name": name, "namespace": NS},
            "spec": body,
        }
    )


def run(kube: MemoryKube, workers: FakeWorkers, name: str = "tiny") -> rc.Outcome:
    return rc.reconcile(kube, workers, NS, name, SETTINGS, NOW)


def roles(kube: MemoryKube) -> dict[str, str | None]:
    return rc.assigned_roles(kube.list("v1", "Pod", NS))


def add_pods(kube: MemoryKube, n: int, **kw: Any) -> None:
    for i in range(n):
        kube.create(worker_pod("tiny", "w", f"tiny-w-{i}", ip=f"10.0.0.{i + 1}", **kw))


def _a_prefill(kube: MemoryKube) -> tuple[str, str]:
    """A prefill worker's pod name and its worker's address."""
    name = next(n for n, r in roles(kube).items() if r == "prefill")
    pod = kube.get("v1", "Pod", NS, name)
    assert pod is not None
    return name, f"{pod['status']['podIP']}:50051"


def _ask_pools(kube: MemoryKube, prefill: int, decode: int) -> None:
    """Set the prefill and decode LLMPools' replicas (as an HPA or `kubectl scale` would)."""
    kube.patch(v1.API_VERSION, "LLMPool", NS, "tiny-prefill", {"spec": {"replicas": prefill}})
    kube.patch(v1.API_VERSION, "LLMPool", NS, "tiny-decode", {"spec": {"replicas": decode}})


def _edit_spec(kube: MemoryKube, spec: dict[str, Any]) -> None:
    """Merge-patch the `tiny` LLMService's spec (as `kubectl patch --type merge` would)."""
    kube.patch(v1.API_VERSION, "LLMService", NS, "tiny", {"spec": spec})


def _events(kube: MemoryKube, reason: str) -> list[dict[str, Any]]:
    """The Events of `reason` the operator wrote in the namespace."""
    return [e for e in kube.list("v1", "Event", NS) if e["reason"] == reason]


def _decisions(kube: MemoryKube, kind: str) -> list[str]:
    """The messages of the service's status.decisions of `kind`, oldest first."""
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    return [d["message"] for d in svc["status"]["decisions"] if d["kind"] == kind]


def test_creates_children_and_is_idempotent() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube)
    first = run(kube, workers)
    assert "created Deployment tiny-w" in first.actions
    assert "created LLMPool tiny-decode" in first.actions
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 3
    writes = len(kube.writes)
    second = run(kube, workers)
    assert second.actions == []
    assert len(kube.writes) == writes, kube.writes[writes:]


def test_status_explains_missing_pods() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube)
    run(kube, workers)
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    conds = {c["type"]: c for c in svc["status"]["conditions"]}
    assert conds["NotRoutable"]["status"] == "True"
    assert conds["NotRoutable"]["reason"] == "NoWorkerPods"
    assert "matched 0 pods" in conds["NotRoutable"]["message"]
    assert conds["Ready"]["status"] == "False"
    assert svc["status"]["summary"] == {"prefill": "0/1", "decode": "0/2", "mixed": "-"}
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["status"]["selector"].endswith(
        "splitserve.io/role=decode,splitserve.io/service=tiny"
    )


def test_assigns_roles_to_new_pods_then_idles() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube)
    add_pods(kube, 3)
    run(kube, workers)
    assert sorted(v for v in roles(kube).values() if v) == ["decode", "decode", "prefill"]
    assert all(("set_role", f"10.0.0.{i}:50051") in workers.calls for i in (1, 2, 3))
    pods = kube.list("v1", "Pod", NS)
    assert all(v1.ANNOTATION_FLIP not in (p["metadata"].get("annotations") or {}) for p in pods)
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    assert svc["status"]["summary"]["decode"] == "2/2"
    conds = {c["type"]: c for c in svc["status"]["conditions"]}
    assert conds["NotRoutable"]["status"] == "False"
    # No controller runs the router's Deployment here.
    assert conds["Degraded"]["message"] == "router 0/1 ready"
    assert conds["Ready"]["reason"] == "RouterNotReady"
    assert [d["kind"] for d in svc["status"]["decisions"]] == ["assign"] * 3
    writes = len(kube.writes)
    assert run(kube, workers).actions == []
    assert len(kube.writes) == writes


def test_scale_through_the_pool_flips_a_worker() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube)
    add_pods(kube, 3)
    run(kube, workers)
    # kubectl scale llmpool/tiny-prefill --replicas=0 ; llmpool/tiny-decode --replicas=3
    _ask_pools(kube, 0, 3)
    workers.calls.clear()
    out = run(kube, workers)
    assert sorted(v for v in roles(kube).values() if v) == ["decode"] * 3
    # The last prefill worker's queue is read before it leaves the role.
    assert [m for m, _ in workers.calls] == ["load", "drain", "set_role", "resume"]
    # Manual mode: the operator left the pools' replicas alone.
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["spec"]["replicas"] == 3
    assert "patched LLMPool tiny-decode" not in out.actions
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 3


def test_flip_waits_for_drain_and_resumes_from_the_annotation() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube, pools={"prefill": {"replicas": 2}, "decode": {"replicas": 1}})
    add_pods(kube, 3)
    run(kube, workers)
    prefill = sorted(n for n, r in roles(kube).items() if r == "prefill")
    _ask_pools(kube, 1, 2)
    victim = kube.get("v1", "Pod", NS, prefill[0])
    assert victim is not None
    address = f"{victim['status']['podIP']}:50051"
    workers.in_flight[address] = 2
    run(kube, workers)
    pod = kube.get("v1", "Pod", NS, prefill[0])
    assert pod is not None
    assert pod["metadata"]["labels"][v1.LABEL_FENCED] == "true"
    assert pod["metadata"]["labels"][v1.LABEL_ROLE] == "prefill"
    progress = FlipProgress.decode(pod["metadata"]["annotations"][v1.ANNOTATION_FLIP])
    assert progress == FlipProgress(Step.DRAIN, Role.PREFILL, Role.DECODE)
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    pools = {p["role"]: p for p in svc["status"]["pools"]}
    assert pools["decode"]["flipping"] == 1
    # A fresh reconcile (a restarted operator: no memory but the cluster) picks it up.
    workers.in_flight[address] = 0
    run(kube, workers)
    pod = kube.get("v1", "Pod", NS, prefill[0])
    assert pod is not None
    assert pod["metadata"]["labels"][v1.LABEL_ROLE] == "decode"
    assert v1.LABEL_FENCED not in pod["metadata"]["labels"]
    assert v1.ANNOTATION_FLIP not in (pod["metadata"].get("annotations") or {})


def test_worker_failure_keeps_the_step() -> None:
    kube, workers = MemoryKube(), FakeWorkers(down={"10.0.0.1:50051"})
    make_service(kube)
    add_pods(kube, 1)
    run(kube, workers)
    assert roles(kube) == {"tiny-w-0": None}
    workers.down.clear()
    run(kube, workers)
    assert roles(kube) == {"tiny-w-0": "decode"}


def test_surplus_pods_are_cheapest_to_delete() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube)
    add_pods(kube, 3)
    run(kube, workers)
    kube.patch(v1.API_VERSION, "LLMPool", NS, "tiny-decode", {"spec": {"replicas": 1}})
    run(kube, workers)
    costs = {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(
            "controller.kubernetes.io/pod-deletion-cost"
        )
        for p in kube.list("v1", "Pod", NS)
    }
    assert sorted(c for c in costs.values() if c) == ["-100"]
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 2


def test_managed_mode_owns_replicas() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube, scaling={"mode": "Managed"})
    run(kube, workers)
    kube.patch(v1.API_VERSION, "LLMPool", NS, "tiny-decode", {"spec": {"replicas": 9}})
    run(kube, workers)
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["spec"]["replicas"] == 2


def test_update_prunes_and_delete_removes_everything() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    svc = make_service(kube)
    run(kube, workers)
    _edit_spec(kube, {"pools": {"prefill": None, "decode": {"replicas": 2}}})
    out = run(kube, workers)
    assert "deleted LLMPool tiny-prefill" in out.actions
    ref = render.ServiceRef("tiny", NS, svc["metadata"]["uid"])
    deleted = rc.delete_owned(kube, ref)
    assert len(deleted) == 10  # with the two NetworkPolicies
    left = [k for k in kube.objects if k[1] not in ("LLMService", "Event")]
    assert left == []


def test_invalid_spec_is_a_config_error() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube, pools={})
    with pytest.raises(ConfigError, match="pools"):
        run(kube, workers)


def test_missing_service_is_a_no_op() -> None:
    assert rc.reconcile(MemoryKube(), FakeWorkers(), NS, "nope", SETTINGS, NOW).status is None


def test_drain_timeout_switches_anyway() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(
        kube,
        pools={"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
        flipping={"drainTimeoutSeconds": 60},
    )
    add_pods(kube, 2)
    run(kube, workers)
    prefill, address = _a_prefill(kube)
    _ask_pools(kube, 0, 2)
    workers.in_flight[address] = 1
    run(kube, workers)
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert pod["metadata"]["annotations"][v1.ANNOTATION_FLIP_SINCE] == NOW
    rc.reconcile(kube, workers, NS, "tiny", SETTINGS, "2026-01-01T00:00:30Z")
    assert roles(kube)[prefill] == "prefill"
    rc.reconcile(kube, workers, NS, "tiny", SETTINGS, "2026-01-01T00:01:01Z")
    assert roles(kube)[prefill] == "decode"
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert v1.ANNOTATION_FLIP_SINCE not in pod["metadata"]["annotations"]


def test_last_worker_with_queued_work_is_kept() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube)
    add_pods(kube, 3)
    run(kube, workers)
    prefill, address = _a_prefill(kube)
    workers.queued[address] = 4
    _ask_pools(kube, 0, 3)
    run(kube, workers)
    assert roles(kube)[prefill] == "prefill"
    workers.queued.clear()
    run(kube, workers)
    assert roles(kube)[prefill] == "decode"


def test_status_fields_that_no_longer_apply_are_removed() -> None:
    """`status` is written with a JSON merge patch, which keeps every key the patch leaves out:
    a field that no longer applies (here `modelArtifact.path` and `.job` once `model.cache` is
    removed) must be deleted explicitly, and an idle reconcile then writes nothing."""
    kube, workers = MemoryKube(), FakeWorkers()
    cached = {"name": "m", "source": "hf://org/m", "cache": {"size": "1Gi"}}
    make_service(kube, engine={"kind": "vllm", "image": "img:1"}, model=cached)
    run(kube, workers)
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    assert {"path", "job"} <= set(svc["status"]["modelArtifact"])
    _edit_spec(kube, {"model": {"cache": None}})
    run(kube, workers)
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    artifact = svc["status"]["modelArtifact"]
    assert artifact["phase"] == "PerPod"
    assert "job" not in artifact
    assert "path" not in artifact
    writes = len(kube.writes)
    assert run(kube, workers).actions == []
    assert kube.writes[writes:] == []


def test_settings_removed_from_the_spec_leave_the_children() -> None:
    """Children are written with JSON merge patches, which keep every field the patch leaves
    out: a setting removed from the spec (a worker group's nodeSelector, a resource limit, the
    pods' tolerations / priorityClassName / serviceAccountName, a pool's maxReplicas) must be
    deleted from the child the operator rendered it into, and an idle reconcile then writes
    nothing."""
    kube, workers = MemoryKube(), FakeWorkers()
    group = {
        "name": "w",
        "roles": ["prefill", "decode"],
        "nodeSelector": {"pool": "gpu"},
        "resources": {"limits": {"memory": "1Gi", "cpu": "2"}},
        "pod": {
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "high",
            "serviceAccountName": "model-reader",
        },
    }
    make_service(
        kube,
        workerGroups=[group],
        pools={"prefill": {"replicas": 1}, "decode": {"replicas": 2, "maxReplicas": 4}},
    )
    run(kube, workers)
    _edit_spec(
        kube,
        {
            "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
            "pools": {"decode": {"maxReplicas": None}},
        },
    )
    run(kube, workers)
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    pod = dep["spec"]["template"]["spec"]
    for field in ("nodeSelector", "tolerations", "priorityClassName", "serviceAccountName"):
        assert field not in pod, field
    worker = next(c for c in pod["containers"] if c["name"] == "worker")
    assert "cpu" not in (worker.get("resources") or {}).get("limits", {})
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert "maxReplicas" not in pool["spec"]
    writes = len(kube.writes)
    assert run(kube, workers).actions == []
    assert kube.writes[writes:] == []


def test_a_pool_left_to_others_keeps_its_replicas_when_managed_mode_ends() -> None:
    """Managed mode renders `LLMPool.spec.replicas`; Manual and External leave it to kubectl
    scale / an HPA. Switching away from Managed must not delete it."""
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube, scaling={"mode": "Managed"})
    run(kube, workers)
    _edit_spec(kube, {"scaling": {"mode": "External"}})
    run(kube, workers)
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["spec"]["replicas"] == 2


def test_a_child_another_service_owns_is_not_taken_over() -> None:
    """Children are named `<service>-<group>`: service `a` with group `b-c` and service `a-b`
    with group `c` both want Deployment `a-b-c`. The second must not patch (and adopt) the
    first's Deployment; its reconcile fails naming the owner and the field to change."""
    kube, workers = MemoryKube(), FakeWorkers()
    groups = {"workerGroups": [{"name": "b-c", "roles": ["mixed"]}]}
    make_service(kube, "a", pools={"mixed": {"replicas": 1}}, **groups)
    run(kube, workers, "a")
    first = kube.get("apps/v1", "Deployment", NS, "a-b-c")
    assert first is not None
    make_service(
        kube,
        "a-b",
        workerGroups=[{"name": "c", "roles": ["mixed"]}],
        pools={"mixed": {"replicas": 3}},
    )
    with pytest.raises(KubeError) as err:
        run(kube, workers, "a-b")
    assert err.value.permanent
    message = str(err.value)
    assert "Deployment a-b-c" in message
    assert "LLMService a" in message
    after = kube.get("apps/v1", "Deployment", NS, "a-b-c")
    assert after == first
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "a-b")
    assert svc is not None
    ready = next(c for c in svc["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert "spec.workerGroups[c]" in ready["message"]


def test_a_child_left_by_the_services_previous_incarnation_is_waited_for() -> None:
    """Re-created under the same name while the garbage collector still deletes the old
    children: a temporary failure (retried), not a take-over."""
    kube, workers = MemoryKube(), FakeWorkers()
    old = make_service(kube)
    run(kube, workers)
    kube.delete(v1.API_VERSION, "LLMService", NS, "tiny")
    make_service(kube)
    with pytest.raises(KubeError) as err:
        run(kube, workers)
    assert not err.value.permanent
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["metadata"]["ownerReferences"][0]["uid"] == old["metadata"]["uid"]


def test_an_unreadable_flip_is_abandoned_without_leaving_the_worker_fenced() -> None:
    """A flip's progress annotation the operator cannot read (written by another version, or
    edited) abandons the flip; the worker it fenced must be re-opened, not stay fenced (out of
    the router's rotation) for ever."""
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube)
    add_pods(kube, 3)
    run(kube, workers)
    run(kube, workers)
    fenced = "tiny-w-0"
    before = roles(kube)
    kube.patch(
        "v1",
        "Pod",
        NS,
        fenced,
        {
            "metadata": {
                "labels": {v1.LABEL_FENCED: "true"},
                "annotations": {
                    v1.ANNOTATION_FLIP: "teleport:decode:prefill",
                    v1.ANNOTATION_FLIP_SINCE: NOW,
                },
            }
        },
    )
    workers.calls.clear()
    run(kube, workers)
    pod = kube.get("v1", "Pod", NS, fenced)
    assert pod is not None
    assert v1.LABEL_FENCED not in pod["metadata"]["labels"]
    notes = pod["metadata"].get("annotations") or {}
    assert v1.ANNOTATION_FLIP not in notes
    assert v1.ANNOTATION_FLIP_SINCE not in notes
    # The worker's role is set back to its label's (SetRole may or may not have run), then it
    # re-opens.
    assert [c[0] for c in workers.calls if c[0] in ("set_role", "resume")] == [
        "set_role",
        "resume",
    ]
    assert roles(kube) == before
    assert any(fenced in e["message"] for e in _events(kube, "FlipAbandoned"))


def _start_flip_of_prefill(kube: MemoryKube, workers: FakeWorkers) -> tuple[str, str]:
    """Two workers (1 prefill, 1 decode); the prefill one is asked to become decode and the
    flip stops at its first step that needs the worker. Returns (pod, its address)."""
    make_service(
        kube,
        pools={"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
        flipping={"drainTimeoutSeconds": 60},
    )
    add_pods(kube, 2)
    run(kube, workers)
    return _a_prefill(kube)


def test_a_flip_whose_worker_stays_unreachable_is_abandoned_after_the_drain_timeout() -> None:
    """A worker that crash-loops mid-flip (every Drain / SetRole fails) must not stay fenced,
    holding a `flipping.maxConcurrent` slot, for ever: once `drainTimeoutSeconds` has passed
    since the fence, the flip is abandoned (fence and progress removed, role label kept), with
    a Warning Event and a status decision saying why."""
    kube, workers = MemoryKube(), FakeWorkers()
    prefill, address = _start_flip_of_prefill(kube, workers)
    workers.in_flight[address] = 1  # the flip fences it and waits for its drain
    _ask_pools(kube, 0, 2)
    run(kube, workers)
    workers.down.add(address)  # then it crash-loops
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert pod["metadata"]["labels"][v1.LABEL_FENCED] == "true"
    assert pod["metadata"]["annotations"][v1.ANNOTATION_FLIP] == "drain:prefill:decode"
    # Within the timeout the step is retried.
    rc.reconcile(kube, workers, NS, "tiny", SETTINGS, "2026-01-01T00:00:30Z")
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert v1.ANNOTATION_FLIP in pod["metadata"]["annotations"]
    # Past it the flip is given up.
    rc.reconcile(kube, workers, NS, "tiny", SETTINGS, "2026-01-01T00:01:01Z")
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert v1.LABEL_FENCED not in pod["metadata"]["labels"]
    assert pod["metadata"]["labels"][v1.LABEL_ROLE] == "prefill"
    notes = pod["metadata"].get("annotations") or {}
    assert v1.ANNOTATION_FLIP not in notes
    assert v1.ANNOTATION_FLIP_SINCE not in notes
    assert any(
        prefill in e["message"] and e["type"] == "Warning" for e in _events(kube, "FlipAbandoned")
    )
    abandon = _decisions(kube, "abandon")
    assert abandon
    assert prefill in abandon[-1]
    assert "unreachable" in abandon[-1]


def test_a_flip_into_a_role_the_spec_no_longer_allows_is_abandoned() -> None:
    """The worker group's roles are edited while a worker is being flipped into one of them:
    the flip is abandoned (worker re-opened in its old role), not carried on into a role the
    group no longer allows."""
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(
        kube,
        workerGroups=[{"name": "w", "roles": ["prefill", "decode", "mixed"]}],
        pools={"prefill": {"replicas": 1}, "decode": {"replicas": 1}},
    )
    add_pods(kube, 2)
    run(kube, workers)
    prefill, address = _a_prefill(kube)
    workers.in_flight[address] = 1
    _ask_pools(kube, 0, 2)
    run(kube, workers)
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert pod["metadata"]["annotations"][v1.ANNOTATION_FLIP] == "drain:prefill:decode"
    _edit_spec(
        kube,
        {
            "workerGroups": [{"name": "w", "roles": ["prefill", "mixed"]}],
            "pools": {"prefill": {"replicas": 1}, "decode": None, "mixed": {"replicas": 1}},
        },
    )
    workers.calls.clear()
    run(kube, workers)
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert pod["metadata"]["labels"][v1.LABEL_ROLE] == "prefill"
    address = f"{pod['status']['podIP']}:50051"
    mine = [c[0] for c in workers.calls if c[1] == address]
    assert mine[:2] == ["set_role", "resume"]  # back to prefill, re-opened
    notes = pod["metadata"].get("annotations") or {}
    assert v1.ANNOTATION_FLIP not in notes
    # Its LLMPool wants no prefill worker and the group shrinks to 1: it is retired (fenced
    # and drained before removal), no longer flipping.
    assert "splitserve.io/retire-since" in notes
    assert any(prefill in e["message"] for e in _events(kube, "FlipAbandoned"))
    abandon = _decisions(kube, "abandon")
    assert abandon
    assert "no longer allows decode" in abandon[-1]


def test_an_invalid_spec_abandons_the_flip_in_progress_instead_of_leaving_it_fenced() -> None:
    """A spec the CRD schema accepts but the operator refuses stops every new decision; a worker
    that was being flipped must not stay fenced (out of rotation) until someone fixes it: its
    flip is abandoned (role back to its label's, re-opened, fence and progress removed)."""
    kube, workers = MemoryKube(), FakeWorkers()
    prefill, address = _start_flip_of_prefill(kube, workers)
    workers.in_flight[address] = 1
    _ask_pools(kube, 0, 2)
    run(kube, workers)
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert pod["metadata"]["labels"][v1.LABEL_FENCED] == "true"
    _edit_spec(kube, {"pools": None})
    workers.calls.clear()
    with pytest.raises(ConfigError, match="pools"):
        run(kube, workers)
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert v1.LABEL_FENCED not in pod["metadata"]["labels"]
    assert pod["metadata"]["labels"][v1.LABEL_ROLE] == "prefill"
    notes = pod["metadata"].get("annotations") or {}
    assert v1.ANNOTATION_FLIP not in notes
    assert v1.ANNOTATION_FLIP_SINCE not in notes
    assert [c[0] for c in workers.calls if c[1] == address] == ["set_role", "resume"]
    assert any(
        prefill in e["message"] and "invalid" in e["message"]
        for e in _events(kube, "FlipAbandoned")
    )
    abandon = _decisions(kube, "abandon")
    assert len(abandon) == 1
    assert prefill in abandon[0]
    assert "invalid" in abandon[0]


def _rename_the_group_of_a_busy_prefill(kube: MemoryKube, workers: FakeWorkers) -> tuple[str, str]:
    """Three workers in group "w" (drain timeout 60 s), the prefill one with 2 requests running;
    then the spec renames the group to "v". Returns (that prefill pod, its address)."""
    make_service(kube, flipping={"drainTimeoutSeconds": 60})
    add_pods(kube, 3)
    run(kube, workers)
    busy, address = _a_prefill(kube)
    workers.in_flight[address] = 2
    _edit_spec(kube, {"workerGroups": [{"name": "v", "roles": ["prefill", "decode"]}]})
    return busy, address


def test_a_removed_worker_group_is_drained_before_its_deployment_goes() -> None:
    """Renaming (or removing) a worker group must not delete its workers with requests in
    flight: they are fenced and drained like a scale-down, and their Deployment is deleted only
    once they are drained (or `flipping.drainTimeoutSeconds` passed), with an Event and a status
    decision saying so."""
    kube, workers = MemoryKube(), FakeWorkers()
    busy, address = _rename_the_group_of_a_busy_prefill(kube, workers)
    out = run(kube, workers)
    assert "deleted Deployment tiny-w" not in out.actions
    assert kube.get("apps/v1", "Deployment", NS, "tiny-w") is not None
    assert kube.get("apps/v1", "Deployment", NS, "tiny-v") is not None
    for pod in kube.list("v1", "Pod", NS):
        assert pod["metadata"]["labels"][v1.LABEL_FENCED] == "true"
        assert "splitserve.io/retire-since" in pod["metadata"]["annotations"]
    assert ("drain", address) in workers.calls
    assert any(
        busy in e["message"] and "workerGroups" in e["message"] for e in _events(kube, "Retiring")
    )
    retire = _decisions(kube, "retire")
    assert retire
    assert "tiny-w" in retire[-1]
    # Still busy within the timeout: the Deployment stays.
    out = rc.reconcile(kube, workers, NS, "tiny", SETTINGS, "2026-01-01T00:00:30Z")
    assert kube.get("apps/v1", "Deployment", NS, "tiny-w") is not None
    # Drained: it goes.
    workers.in_flight[address] = 0
    out = rc.reconcile(kube, workers, NS, "tiny", SETTINGS, "2026-01-01T00:00:31Z")
    assert "deleted Deployment tiny-w" in out.actions
    assert kube.get("apps/v1", "Deployment", NS, "tiny-v") is not None


def test_a_removed_worker_group_goes_after_the_drain_timeout() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    _rename_the_group_of_a_busy_prefill(kube, workers)
    run(kube, workers)
    assert kube.get("apps/v1", "Deployment", NS, "tiny-w") is not None
    out = rc.reconcile(kube, workers, NS, "tiny", SETTINGS, "2026-01-01T00:01:00Z")
    assert "deleted Deployment tiny-w" in out.actions


def test_a_flip_in_a_removed_worker_group_is_given_up_and_the_worker_stays_fenced() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    prefill, address = _start_flip_of_prefill(kube, workers)
    workers.in_flight[address] = 1
    _ask_pools(kube, 0, 2)
    run(kube, workers)
    _edit_spec(kube, {"workerGroups": [{"name": "v", "roles": ["prefill", "decode"]}]})
    run(kube, workers)
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert pod["metadata"]["labels"][v1.LABEL_FENCED] == "true"
    notes = pod["metadata"]["annotations"]
    assert v1.ANNOTATION_FLIP not in notes
    assert notes["splitserve.io/retire-since"] == NOW  # the drain counts from the flip's fence
    assert kube.get("apps/v1", "Deployment", NS, "tiny-w") is not None
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    kinds = [d["kind"] for d in svc["status"]["decisions"]]
    assert "abandon" in kinds
    assert "retire" in kinds


def test_a_worker_group_put_back_while_draining_keeps_its_workers() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    _rename_the_group_of_a_busy_prefill(kube, workers)
    run(kube, workers)
    _edit_spec(kube, {"workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}]})
    run(kube, workers)
    assert kube.get("apps/v1", "Deployment", NS, "tiny-w") is not None
    for pod in kube.list("v1", "Pod", NS):
        assert v1.LABEL_FENCED not in pod["metadata"]["labels"]
        assert "splitserve.io/retire-since" not in (pod["metadata"].get("annotations") or {})


def _retire_one_of_three_busy_workers(
    kube: MemoryKube, workers: FakeWorkers
) -> tuple[dict[str, Any], str]:
    """Three workers (drain timeout 60 s), each with a request running; the LLMPools then ask
    for one prefill and one decode, so one worker is fenced to retire. Returns (that pod, its
    address)."""
    make_service(kube, flipping={"drainTimeoutSeconds": 60})
    add_pods(kube, 3)
    run(kube, workers)
    for i in range(3):
        workers.in_flight[f"10.0.0.{i + 1}:50051"] = 1
    _ask_pools(kube, 1, 1)
    run(kube, workers)
    (pod,) = [p for p in kube.list("v1", "Pod", NS) if p["metadata"]["labels"].get(v1.LABEL_FENCED)]
    return pod, f"{pod['status']['podIP']}:50051"


def test_an_invalid_spec_re_opens_a_worker_being_retired() -> None:
    """A worker fenced for a scale-down must not stay fenced while the spec is invalid (the
    Deployment keeps its size then): its retirement is rolled back and it is re-opened."""
    kube, workers = MemoryKube(), FakeWorkers()
    fenced, address = _retire_one_of_three_busy_workers(kube, workers)
    name = fenced["metadata"]["name"]
    assert "splitserve.io/retire-since" in fenced["metadata"]["annotations"]
    _edit_spec(kube, {"pools": None})
    workers.calls.clear()
    with pytest.raises(ConfigError, match="pools"):
        run(kube, workers)
    pod = kube.get("v1", "Pod", NS, name)
    assert pod is not None
    assert v1.LABEL_FENCED not in pod["metadata"]["labels"]
    notes = pod["metadata"].get("annotations") or {}
    assert "splitserve.io/retire-since" not in notes
    assert "controller.kubernetes.io/pod-deletion-cost" not in notes
    assert ("resume", address) in workers.calls
    assert any(name in e["message"] and "invalid" in e["message"] for e in _events(kube, "Kept"))
    keep = _decisions(kube, "keep")
    assert len(keep) == 1
    assert name in keep[0]
    assert "invalid" in keep[0]


def test_an_invalid_spec_keeps_a_retiring_worker_it_cannot_reach_fenced_and_retries() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    pod, address = _retire_one_of_three_busy_workers(kube, workers)
    name = pod["metadata"]["name"]
    _edit_spec(kube, {"pools": None})
    workers.down.add(address)
    with pytest.raises(ConfigError):
        run(kube, workers)
    kept = kube.get("v1", "Pod", NS, name)
    assert kept is not None
    assert kept["metadata"]["labels"][v1.LABEL_FENCED] == "true"
    workers.down.clear()
    with pytest.raises(ConfigError):
        run(kube, workers)
    opened = kube.get("v1", "Pod", NS, name)
    assert opened is not None
    assert v1.LABEL_FENCED not in opened["metadata"]["labels"]


def test_an_invalid_spec_leaves_a_drained_worker_its_deployment_shrank_by() -> None:
    """A drained surplus worker whose Deployment has already shrunk is the one the ReplicaSet
    deletes: re-opening it (and dropping its deletion cost) would have another pod deleted."""
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(kube)
    add_pods(kube, 3)
    run(kube, workers)
    _ask_pools(kube, 1, 1)
    run(kube, workers)
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 2
    (pod,) = [p for p in kube.list("v1", "Pod", NS) if p["metadata"]["labels"].get(v1.LABEL_FENCED)]
    _edit_spec(kube, {"pools": None})
    with pytest.raises(ConfigError):
        run(kube, workers)
    after = kube.get("v1", "Pod", NS, pod["metadata"]["name"])
    assert after is not None
    assert after["metadata"]["labels"][v1.LABEL_FENCED] == "true"
    assert after["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] == "-100"


class _PoolStatusFails(MemoryKube):
    """An API server that refuses `LLMPool` status writes (a late step of every reconcile)."""

    failing = False

    def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        if self.failing and kind == "LLMPool" and subresource == "status":
            raise KubeError(500, "etcd timeout", f"patch LLMPool {name}")
        return super().patch(api_version, kind, namespace, name, patch, subresource)


def test_a_flip_started_in_a_pass_that_fails_later_is_in_the_decisions() -> None:
    """The flip's fence is on the pod; a later write of the same pass fails: status.decisions
    must still say which flip was started (it is not planned again: the next pass continues
    it)."""
    kube, workers = _PoolStatusFails(), FakeWorkers()
    prefill, address = _start_flip_of_prefill(kube, workers)
    workers.in_flight[address] = 1
    _ask_pools(kube, 0, 2)
    kube.failing = True
    with pytest.raises(KubeError):
        run(kube, workers)
    pod = kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert pod["metadata"]["labels"][v1.LABEL_FENCED] == "true"
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    assert svc["status"]["conditions"][0]["status"] == "False"  # Ready=False: it failed
    flips = _decisions(kube, "flip")
    assert flips == [f"flip {prefill} prefill -> decode"]
    kube.failing = False
    run(kube, workers)
    flips = _decisions(kube, "flip")
    assert flips == [f"flip {prefill} prefill -> decode"]


def test_entering_managed_mode_starts_from_the_live_pool_sizes() -> None:
    """External -> Managed: spec.pools.<role>.replicas still hold the numbers from before
    External (1 prefill, 2 decode) while an HPA grew the pools to 3 and 5. The operator must
    not shrink the pools to those old numbers: it takes the live sizes into the spec (the field
    it owns in Managed mode) and says so."""
    kube, workers = MemoryKube(), FakeWorkers()
    make_service(
        kube,
        scaling={"mode": "External"},
        pools={
            "prefill": {"replicas": 1, "maxReplicas": 4},
            "decode": {"replicas": 2},
        },
    )
    run(kube, workers)
    _ask_pools(kube, 6, 5)  # prefill beyond its maxReplicas: 4 is taken
    run(kube, workers)
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 11
    _edit_spec(kube, {"scaling": {"mode": "Managed"}})
    run(kube, workers)
    pools = {r: kube.get(v1.API_VERSION, "LLMPool", NS, f"tiny-{r}") for r in ("prefill", "decode")}
    assert {r: p["spec"]["replicas"] for r, p in pools.items() if p} == {
        "prefill": 4,
        "decode": 5,
    }
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    assert svc["spec"]["pools"]["prefill"]["replicas"] == 4
    assert svc["spec"]["pools"]["decode"]["replicas"] == 5
    assert svc["status"]["scalingMode"] == "Managed"
    dep = kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 9
    scale = _decisions(kube, "scale")
    assert scale
    assert "External -> Managed" in scale[-1]
    assert _events(kube, "ManagedFromLiveSizes")
    # Managed from now on: the spec decides, a later kubectl scale is reverted.
    _edit_spec(kube, {"pools": {"decode": {"replicas": 3}}})
    run(kube, workers)
    pool = kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["spec"]["replicas"] == 3


def test_a_removed_group_whose_only_serving_worker_was_flipping_says_it_drains() -> None:
    kube, workers = MemoryKube(), FakeWorkers()
    prefill, address = _start_flip_of_prefill(kube, workers)
    workers.in_flight[address] = 1
    _ask_pools(kube, 0, 2)
    run(kube, workers)
    for pod in kube.list("v1", "Pod", NS):
        if pod["metadata"]["name"] != prefill:  # the other worker is not serving
            not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
            kube.patch("v1", "Pod", NS, pod["metadata"]["name"], not_ready)
    _edit_spec(kube, {"workerGroups": [{"name": "v", "roles": ["prefill", "decode"]}]})
    run(kube, workers)
    retire = _decisions(kube, "retire")
    assert len(retire) == 1
    assert "drained before Deployment tiny-w is deleted" in retire[0]
