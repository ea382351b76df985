"""Flips and shrinks against a Deployment / ReplicaSet controller that behaves like the real one
(`tests.fakes.controllers`): the operator decides which pod goes, not the ReplicaSet."""

from __future__ import annotations

from typing import Any

from splitserve.api import v1alpha1 as v1
from splitserve.operator import reconcile as rc
from splitserve.operator import render
from tests.fakes.controllers import DeploymentController, Kubelet, deletion_order
from tests.fakes.kube import FakeWorkers, MemoryKube

NS = "default"
NOW = "2026-01-01T00:00:00Z"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class World:
    """The operator, a Deployment controller and a kubelet over one in-memory API server."""

    def __init__(self, **spec: Any) -> None:
        self.kube = MemoryKube()
        self.workers = FakeWorkers()
        self.clock = Clock()
        self.coalescer = rc.Coalescer(2.0, self.clock)
        self.controller = DeploymentController(self.kube, NS)
        self.kubelet = Kubelet(self.kube, NS)
        body: dict[str, Any] = {
            "model": {"name": "m", "source": "org/m"},
            "engine": {"kind": "sim", "image": "img:1"},
            "workerGroups": [{"name": "w", "roles": ["prefill", "decode"]}],
            "pools": {"prefill": {"replicas": 1}, "decode": {"replicas": 2}},
            "scaling": {"mode": "Manual"},
        }
        body.update(spec)
        self.kube.create(
            {
                "apiVersion": v1.API_VERSION,
                "kind": "LLMService",
                "metadata": {"name": "tiny", "namespace": NS},
                "spec": body,
            }
        )

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            rc.reconcile(
                self.kube,
                self.workers,
                NS,
                "tiny",
                rc.Settings(drain_wait_s=0.0),
                NOW,
                coalescer=self.coalescer,
            )
            self.controller.sync()
            self.kubelet.sync()

    def roles(self) -> dict[str, str | None]:
        return rc.assigned_roles(self.kube.list("v1", "Pod", NS, render.worker_selector("tiny")))

    def created(self) -> list[str]:
        return [n for n in self.controller.created if n.startswith("tiny-w-")]

    def scale(self, role: str, n: int) -> None:
        self.kube.patch(v1.API_VERSION, "LLMPool", NS, f"tiny-{role}", {"spec": {"replicas": n}})

    def address(self, pod: str) -> str:
        obj = self.kube.get("v1", "Pod", NS, pod)
        assert obj is not None
        return f"{obj['status']['podIP']}:50051"


def settled(world: World) -> dict[str, str | None]:
    world.tick(6)
    return world.roles()


def test_two_kubectl_scales_in_a_row_are_one_flip() -> None:
    world = World()
    before = settled(world)
    assert sorted(r or "-" for r in before.values()) == ["decode", "decode", "prefill"]
    assert len(world.created()) == 3
    (prefill,) = [p for p, r in before.items() if r == "prefill"]
    # kubectl scale llmpool/tiny-prefill --replicas=0; kubectl scale llmpool/tiny-decode ...=3
    world.scale("prefill", 0)
    world.tick(2)
    world.clock.t += 1.0
    world.scale("decode", 3)
    world.tick(2)
    assert world.roles() == before  # inside the window: nothing moved
    world.clock.t += 2.5
    after = settled(world)
    assert world.controller.deleted == []  # no pod deleted ...
    assert len(world.created()) == 3  # ... and none created: a flip
    assert after[prefill] == "decode"
    assert ("set_role", world.address(prefill)) in world.workers.calls


def test_shrink_drains_the_chosen_worker_and_the_replicaset_deletes_only_it() -> None:
    world = World()
    before = settled(world)
    (prefill,) = [p for p, r in before.items() if r == "prefill"]
    newest = max(before)
    assert prefill != newest  # left alone, the ReplicaSet would delete the newest pod
    world.workers.in_flight[world.address(prefill)] = 3
    world.scale("prefill", 0)
    world.tick()
    world.clock.t += 3.0
    world.tick(3)
    # Fenced and draining; the Deployment keeps its size meanwhile.
    pod = world.kube.get("v1", "Pod", NS, prefill)
    assert pod is not None
    assert pod["metadata"]["labels"][v1.LABEL_FENCED] == "true"
    dep = world.kube.get("apps/v1", "Deployment", NS, "tiny-w")
    assert dep is not None
    assert dep["spec"]["replicas"] == 3
    assert world.controller.deleted == []
    # Drained: marked cheapest, the Deployment shrinks, the ReplicaSet removes that pod.
    world.workers.in_flight.clear()
    world.tick(3)
    assert world.controller.deleted == [prefill]
    assert sorted(world.roles()) == sorted(p for p in before if p != prefill)
    assert len(world.created()) == 3


def test_replicaset_order_without_deletion_cost_takes_the_newest() -> None:
    pods: list[dict[str, Any]] = [
        {
            "metadata": {
                "name": f"p{i}",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "resourceVersion": str(i),
            },
            "spec": {"nodeName": "n"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        for i in range(3)
    ]
    assert [p["metadata"]["name"] for p in deletion_order(pods)] == ["p2", "p1", "p0"]
    pods[0]["metadata"]["annotations"] = {"controller.kubernetes.io/pod-deletion-cost": "-100"}
    assert deletion_order(pods)[0]["metadata"]["name"] == "p0"
    pods[1]["status"]["phase"] = "Pending"  # phase ranks before cost
    assert deletion_order(pods)[0]["metadata"]["name"] == "p1"
