"""External mode through the real operator (kopf) against an API server (kmock by default): an
HPA / KEDA scaling an `LLMPool` through `/scale` is normal operation (`SpecApplied` stays True,
no Warning, no writes once settled); a person's later edit of `spec.pools.<role>.replicas`, which
the pool's owner does not apply, is said once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from tests.fakes.kube import FakeWorkers
from tests.fakes.rbac import ApiCall
from tests.integration.operator.conftest import controllers
from tests.integration.operator.test_operator_lifecycle import (
    NS,
    cleanup,
    condition,
    operator,
    quiet,
    roles,
    scale,
    service_body,
    wait_for,
)

from splitserve.api import v1alpha1 as v1
from splitserve.core.roles import Role
from splitserve.operator.kube import RestKube

pytestmark = [pytest.mark.k8s, pytest.mark.integration, pytest.mark.timeout(300)]


def warnings(kube: RestKube, service: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in kube.list("v1", "Event", NS)
        if e.get("type") == "Warning"
        and e.get("reason") == reason
        and (e.get("involvedObject") or {}).get("name") == service
    ]


def test_hpa_scaling_is_normal_but_a_spec_edit_is_said(
    api_server: str, kube: RestKube, api_calls: Callable[[], list[ApiCall]] | None
) -> None:
    svc = "hpa"
    with operator(api_server, FakeWorkers()), controllers(kube, NS):
        kube.create(service_body(svc, scaling={"mode": "External"}))
        wait_for("roles", lambda: roles(kube, svc) == ["decode", "decode", "prefill"])
        scale(kube, svc, Role.DECODE, 3)  # the HPA, through /scale
        wait_for("scaled", lambda: roles(kube, svc) == ["decode", "decode", "decode", "prefill"])
        wait_for(
            "ready",
            lambda: (condition(kube, svc, "Ready") or {}).get("status") == "True",
            timeout=60,
        )
        applied = condition(kube, svc, "SpecApplied")
        assert applied is not None
        assert (applied["status"], applied["reason"]) == ("True", "AsSpecified")
        assert warnings(kube, svc, "PoolReplicasDecide") == []
        if api_calls is not None:  # idle again: no write per reconcile
            wait_for("a quiet second", lambda: quiet(api_calls, 1.0), timeout=40)

        # A person edits the service's value: the HPA owns the pool's size, so it is said.
        kube.patch(
            v1.API_VERSION, "LLMService", NS, svc, {"spec": {"pools": {"decode": {"replicas": 5}}}}
        )
        applied = wait_for(
            "PoolReplicasDecide",
            lambda: (
                c if (c := condition(kube, svc, "SpecApplied")) and c["status"] == "False" else None
            ),
        )
        assert applied["reason"] == "PoolReplicasDecide"
        assert "spec.pools.decode.replicas (5) is not applied" in applied["message"]
        [warning] = wait_for("Warning", lambda: warnings(kube, svc, "PoolReplicasDecide"))
        assert "spec.pools.decode.replicas" in warning["message"]
        assert "HPA / KEDA" in warning["message"]
        time.sleep(3)  # several reconcile ticks: said once, not once per tick
        [warning] = warnings(kube, svc, "PoolReplicasDecide")
        assert int(warning.get("count") or 1) == 1
        pool = kube.get(v1.API_VERSION, "LLMPool", NS, f"{svc}-decode")
        assert pool is not None
        assert pool["spec"]["replicas"] == 3  # the HPA's size stands
        cleanup(kube, svc)
