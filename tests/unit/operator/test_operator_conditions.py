"""Conditions and Events a user reads: why pods are not ready, and changes the operator does not
honour (over a Deployment controller and kubelet that behave like the real ones)."""

from __future__ import annotations

from typing import Any

from splitserve.api import v1alpha1 as v1
from splitserve.operator import observe
from tests.fakes.kube import MemoryKube
from tests.unit.operator.test_operator_controllers import NS, World

GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available"


def conditions(kube: MemoryKube) -> dict[str, dict[str, Any]]:
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    return {c["type"]: c for c in svc["status"]["conditions"]}


def events(kube: MemoryKube) -> list[tuple[str, str, str]]:
    return [
        (o["type"], o["reason"], o["message"])
        for k, o in sorted(kube.objects.items())
        if k[1] == "Event"
    ]


def test_unschedulable_pods_say_why_with_the_scheduler_message() -> None:
    world = World()
    world.kubelet.unschedulable = GPU
    world.tick(3)
    conds = conditions(world.kube)
    nr = conds["NotRoutable"]
    assert (nr["status"], nr["reason"]) == ("True", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in nr["message"]
    assert "capacity" in nr["message"]
    assert "image pulls" not in nr["message"]
    assert conds["Ready"]["reason"] == "Unschedulable"
    assert any(t == "Warning" and r == "Unschedulable" for t, r, _ in events(world.kube))


def test_image_pull_errors_are_their_own_reason() -> None:
    world = World()
    world.kubelet.bad_images = {"img:1"}
    world.tick(3)
    nr = conditions(world.kube)["NotRoutable"]
    assert nr["reason"] == "ImagePullFailed"
    assert "engine.image" in nr["message"]


def test_crash_loops_are_read_from_container_states() -> None:
    pod = {
        "metadata": {"name": "p"},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "worker",
                    "restartCount": 4,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
                }
            ],
        },
    }
    problem = observe.pod_problem(pod)
    assert problem is not None
    assert problem.reason == "CrashLooping"
    assert "restarted 4 time(s), last exit code 1 (Error)" in problem.message
    starting = {"metadata": {"name": "q"}, "status": {"phase": "Pending"}}
    assert observe.pod_problem(starting) is None  # still starting: the old hint


def test_manual_mode_explains_that_the_pool_decides() -> None:
    world = World()
    world.tick(3)
    assert conditions(world.kube)["SpecApplied"]["status"] == "True"
    world.kube.patch(
        v1.API_VERSION,
        "LLMService",
        NS,
        "tiny",
        {"spec": {"pools": {"decode": {"replicas": 4}}}},
    )
    world.tick()
    applied = conditions(world.kube)["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("False", "PoolReplicasDecide")
    assert "spec.pools.decode.replicas (4) is not applied" in applied["message"]
    assert "kubectl scale llmpool/tiny-decode" in applied["message"]
    assert any(r == "PoolReplicasDecide" for _, r, _ in events(world.kube))


def test_managed_mode_says_it_reverted_a_kubectl_scale() -> None:
    world = World(scaling={"mode": "Managed"})
    world.tick(3)
    world.scale("decode", 5)
    world.tick()
    pool = world.kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["spec"]["replicas"] == 2  # reverted ...
    applied = conditions(world.kube)["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("False", "ScaleReverted")  # ... and said
    assert "--replicas=5 was reverted to 2" in applied["message"]
    assert ("Warning", "ScaleReverted") in {(t, r) for t, r, _ in events(world.kube)}
    world.tick(2)  # still explained on the next ticks ...
    assert conditions(world.kube)["SpecApplied"]["reason"] == "ScaleReverted"
    world.kube.patch(
        v1.API_VERSION, "LLMService", NS, "tiny", {"spec": {"pools": {"decode": {"replicas": 3}}}}
    )
    world.tick()  # ... until the service changes
    assert conditions(world.kube)["SpecApplied"]["status"] == "True"


def test_decisions_and_flip_steps_are_events() -> None:
    world = World()
    world.tick(3)
    world.scale("prefill", 0)
    world.scale("decode", 3)
    world.tick()
    world.clock.t += 3
    world.tick(3)
    reasons = [r for _, r, _ in events(world.kube)]
    assert "Assigned" in reasons
    assert "FlipStarted" in reasons
    steps = [m for _, r, m in events(world.kube) if r == "FlipStep"]
    assert {m.split(": ")[1].split(" ")[0] for m in steps} == {
        "fence",
        "drain",
        "set-role",
        "relabel",
        "unfence",
    }


def test_a_pool_short_while_flipping_is_off_says_which_worker_could_move() -> None:
    """Found by the operator probe: with `flipping.enabled: false`, `kubectl scale` prefill
    1 -> 0 and decode 2 -> 3 left the group at 3 pods, one of them a surplus prefill worker,
    for ever: `Degraded` said "decode 2/3 ready" and nothing said why or what to do."""
    world = World(flipping={"enabled": False})
    world.tick(6)
    (prefill,) = [p for p, r in world.roles().items() if r == "prefill"]
    world.scale("prefill", 0)
    world.scale("decode", 3)
    world.tick()
    world.clock.t += 5  # past the 2 s window that makes two scales one change
    world.tick(6)
    applied = conditions(world.kube)["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("False", "FlippingDisabled")
    assert "decode 2/3" in applied["message"]
    assert prefill in applied["message"]
    assert "spec.flipping.enabled" in applied["message"]
    assert f"kubectl delete pod -n {NS} {prefill}" in applied["message"]
    assert ("Warning", "FlippingDisabled") in {(t, r) for t, r, _ in events(world.kube)}
    # The way out it names: the replacement pod is assigned the missing role.
    world.kube.delete("v1", "Pod", NS, prefill)
    world.tick(6)
    assert sorted(r or "-" for r in world.roles().values()) == ["decode", "decode", "decode"]
    assert conditions(world.kube)["SpecApplied"]["reason"] != "FlippingDisabled"


def test_a_deleted_llmpool_comes_back_at_its_last_size_and_says_so() -> None:
    """Found by the operator probe: in Manual mode, `kubectl delete llmpool tiny-decode` after
    `kubectl scale --replicas=4` recreated the pool at spec.pools.decode.replicas (2) and the
    group shrank from 5 workers to 3, with no Event. Now it comes back at its last size (4),
    with a Warning Event and a decision naming both numbers."""
    world = World()
    world.tick(6)
    world.scale("decode", 4)
    world.tick()
    world.clock.t += 5
    world.tick(6)
    assert sorted(r or "-" for r in world.roles().values()).count("decode") == 4
    world.kube.delete(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    world.tick()
    world.clock.t += 5
    world.tick(6)
    pool = world.kube.get(v1.API_VERSION, "LLMPool", NS, "tiny-decode")
    assert pool is not None
    assert pool["spec"]["replicas"] == 4
    assert sorted(r or "-" for r in world.roles().values()).count("decode") == 4
    [(kind, message)] = [(t, m) for t, r, m in events(world.kube) if r == "PoolRecreated"]
    assert kind == "Warning"
    assert "LLMPool tiny-decode was deleted" in message
    assert "last size 4" in message
    assert "spec.pools.decode.replicas (2)" in message


def test_external_mode_names_the_autoscaler_not_kubectl_scale() -> None:
    """Found by the operator probe: in External mode PoolReplicasDecide told the person to run
    `kubectl scale llmpool/...`, which the HPA / KEDA that owns the pool undoes at its next
    sync."""
    world = World(scaling={"mode": "External"})
    world.tick(3)
    world.kube.patch(
        v1.API_VERSION, "LLMService", NS, "tiny", {"spec": {"pools": {"decode": {"replicas": 4}}}}
    )
    world.tick()
    applied = conditions(world.kube)["SpecApplied"]
    assert applied["reason"] == "PoolReplicasDecide"
    assert "your HPA / KEDA" in applied["message"]
    assert "kubectl scale" not in applied["message"]
