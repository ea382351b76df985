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


def _resize(world: World, role: str, n: int) -> None:
    """`/scale` of the pool (an HPA, KEDA or `kubectl scale`), past the coalescing window."""
    world.scale(role, n)
    world.tick()
    world.clock.t += 5
    world.tick(2)


def _warnings(kube: MemoryKube, reason: str) -> list[str]:
    """Each time a Warning with `reason` was posted (a repeat bumps one Event's `count`)."""
    return [
        o["message"]
        for k, o in sorted(kube.objects.items())
        if k[1] == "Event" and o["type"] == "Warning" and o["reason"] == reason
        for _ in range(int(o.get("count", 1)))
    ]


def _acknowledged(kube: MemoryKube) -> dict[str, int | None]:
    svc = kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    return {p["role"]: p.get("specReplicas") for p in svc["status"]["pools"]}


def test_external_mode_an_autoscaler_moving_the_pool_is_normal_operation() -> None:
    """Found by the operator probe: every HPA / KEDA scale of an External pool set
    `SpecApplied=False PoolReplicasDecide` and posted a Warning Event, though nobody's spec was
    left unapplied; only a person's later edit of spec.pools.<role>.replicas is."""
    world = World(scaling={"mode": "External"})
    world.tick(3)
    assert _acknowledged(world.kube) == {"prefill": 1, "decode": 2}
    _resize(world, "decode", 4)  # the HPA, through /scale
    _resize(world, "decode", 3)
    applied = conditions(world.kube)["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("True", "AsSpecified")
    assert [m for t, _, m in events(world.kube) if t == "Warning"] == []
    assert sorted(r or "-" for r in world.roles().values()).count("decode") == 3
    # Idle again: the acknowledged value did not change, so nothing is written.
    world.kube.writes.clear()
    world.tick(2)
    assert world.kube.writes == []


def test_external_mode_flags_a_persons_later_edit_of_spec_replicas_once() -> None:
    world = World(scaling={"mode": "External"})
    world.tick(3)
    _resize(world, "decode", 4)  # the HPA
    world.kube.patch(
        v1.API_VERSION, "LLMService", NS, "tiny", {"spec": {"pools": {"decode": {"replicas": 6}}}}
    )
    world.tick(3)
    applied = conditions(world.kube)["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("False", "PoolReplicasDecide")
    assert "spec.pools.decode.replicas (6) is not applied" in applied["message"]
    assert "LLMPool tiny-decode's spec.replicas (4) decides" in applied["message"]
    [warning] = _warnings(world.kube, "PoolReplicasDecide")
    assert "spec.pools.decode.replicas" in warning
    assert "HPA / KEDA" in warning
    assert _acknowledged(world.kube)["decode"] == 2  # still the value the pool came from
    _resize(world, "decode", 5)  # the HPA moves on: still not the spec's value, still said
    assert conditions(world.kube)["SpecApplied"]["reason"] == "PoolReplicasDecide"
    assert len(_warnings(world.kube, "PoolReplicasDecide")) == 1
    _resize(world, "decode", 6)  # the pool reaches the spec's value: acknowledged
    assert conditions(world.kube)["SpecApplied"]["status"] == "True"
    assert _acknowledged(world.kube)["decode"] == 6
    _resize(world, "decode", 3)  # and the HPA moving it later is normal operation again
    assert conditions(world.kube)["SpecApplied"]["status"] == "True"
    assert len(_warnings(world.kube, "PoolReplicasDecide")) == 1


def test_external_mode_reverting_the_edit_clears_the_condition() -> None:
    world = World(scaling={"mode": "External"})
    world.tick(3)
    _resize(world, "decode", 4)
    for n in (7, 2):  # an edit, then back to the value the pool was created from
        world.kube.patch(
            v1.API_VERSION,
            "LLMService",
            NS,
            "tiny",
            {"spec": {"pools": {"decode": {"replicas": n}}}},
        )
        world.tick(2)
        status = conditions(world.kube)["SpecApplied"]["status"]
        assert status == ("False" if n == 7 else "True")


def test_manual_mode_kubectl_scale_of_the_pool_leaves_the_spec_applied() -> None:
    """Manual mode's documented way to size a pool (`kubectl scale llmpool/...`) set
    `SpecApplied=False PoolReplicasDecide` with a Warning, like an HPA in External mode."""
    world = World()
    world.tick(3)
    _resize(world, "decode", 4)
    assert sorted(r or "-" for r in world.roles().values()).count("decode") == 4
    applied = conditions(world.kube)["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("True", "AsSpecified")
    assert _warnings(world.kube, "PoolReplicasDecide") == []
    # A person's edit of the service's value after that is still said, naming kubectl scale.
    world.kube.patch(
        v1.API_VERSION, "LLMService", NS, "tiny", {"spec": {"pools": {"decode": {"replicas": 3}}}}
    )
    world.tick()
    applied = conditions(world.kube)["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("False", "PoolReplicasDecide")
    assert "kubectl scale llmpool/tiny-decode" in applied["message"]
    assert len(_warnings(world.kube, "PoolReplicasDecide")) == 1


def test_a_status_without_the_acknowledged_value_acknowledges_the_spec() -> None:
    """A status an older operator wrote has no `specReplicas`: the pool's size differing from
    the spec then is not taken for an edit (it is most likely an autoscaler's)."""
    world = World(scaling={"mode": "External"})
    world.tick(3)
    world.scale("decode", 4)
    svc = world.kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    pools = [{k: v for k, v in p.items() if k != "specReplicas"} for p in svc["status"]["pools"]]
    world.kube.patch(
        v1.API_VERSION, "LLMService", NS, "tiny", {"status": {"pools": pools}}, "status"
    )
    world.tick(2)
    assert conditions(world.kube)["SpecApplied"]["status"] == "True"
    assert _acknowledged(world.kube) == {"prefill": 1, "decode": 2}
