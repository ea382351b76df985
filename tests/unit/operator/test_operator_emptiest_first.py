"""Consolidation-aware scale-down in the live operator: when the control loop shrinks a pool it
marks the emptiest worker (fewest requests, least KV, from the load reports) `scale-down-first`;
the reconcile drains that one, marks it cheapest to delete, and the (emulated) ReplicaSet
deletes exactly it, not the newest pod it would take by itself."""

from __future__ import annotations

import datetime

from prometheus_client import CollectorRegistry

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.obs.metrics import OperatorMetrics
from splitserve.operator import observe
from splitserve.operator.control.loop import Controller
from splitserve.policy.planner import flip
from splitserve.policy.planner.signals import WorkerLoad
from tests.fakes.router_metrics import FakeRouterMetrics
from tests.unit.operator.test_operator_controllers import NS, World, settled


class Loads:
    def __init__(self) -> None:
        self.queued: dict[str, int] = {}

    def load(self, address: str) -> WorkerLoad:
        return WorkerLoad(address, Role.MIXED, self.queued.get(address, 0), 1, 0.2)


def test_flip_plan_takes_marked_workers_as_surplus_first() -> None:
    both = frozenset({Role.PREFILL, Role.DECODE})
    workers = [flip.WorkerObs(f"w-{i}", both, Role.DECODE) for i in range(3)]
    assert flip.plan(workers, {Role.DECODE: 2}).surplus == ("w-2",)  # the last name, unmarked
    workers[0] = flip.WorkerObs("w-0", both, Role.DECODE, scale_down_first=True)
    assert flip.plan(workers, {Role.DECODE: 2}).surplus == ("w-0",)


def test_loop_scale_down_deletes_the_emptiest_worker() -> None:
    world = World(
        pools={
            "prefill": {"replicas": 1, "minReplicas": 1, "maxReplicas": 4},
            "decode": {"replicas": 3, "minReplicas": 1, "maxReplicas": 4},
        },
        sloClasses=[{"name": "chat", "ttftMs": 2000, "tpotMs": 100}],
        scaling={
            "mode": "Managed",
            "intervalSeconds": 10,
            "scaleDownStabilizationSeconds": 20,
            "windowSeconds": 30,
        },
    )
    roles = settled(world)
    decode = sorted(p for p, r in roles.items() if r == "decode")
    assert len(decode) == 3
    emptiest = decode[0]  # not the newest: the ReplicaSet alone would delete decode[-1]
    loads = Loads()
    for pod in decode:
        loads.queued[world.address(pod)] = 0 if pod == emptiest else 3
    router = FakeRouterMetrics()
    controller = Controller(
        world.kube,
        OperatorMetrics(CollectorRegistry()),
        get=lambda url: router.text(),
        loads=loads,
        clock=world.clock,
        wall=lambda: datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    )
    for _ in range(12):  # little load: decode shrinks after the stabilization window
        router.serve(n=1, prompt=200, output=20)
        world.clock.t += 10.0
        controller.tick(NS, "tiny")
        world.tick(2)
        if world.controller.deleted:
            break
    assert world.controller.deleted == [emptiest]
    svc = world.kube.get(v1.API_VERSION, "LLMService", NS, "tiny")
    assert svc is not None
    assert svc["spec"]["pools"]["decode"]["replicas"] == 2
    kept = world.kube.list("v1", "Pod", NS, {v1.LABEL_SERVICE: "tiny"})
    marks = [
        p["metadata"]["name"]
        for p in kept
        if (p["metadata"].get("annotations") or {}).get(observe.SCALE_DOWN_FIRST)
    ]
    assert marks == []  # the marked worker is gone; nobody else carries the mark
