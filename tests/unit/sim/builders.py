"""Builders for simulator tests: tiny clusters on the tiny model, constant-time latency models."""

from __future__ import annotations

from dataclasses import dataclass

from splitserve.core.ids import PoolName
from splitserve.core.kv import KvLayout
from splitserve.core.perf import HARDWARE, MODELS, BatchShape, RooflineModel
from splitserve.core.roles import Role
from splitserve.sim.cluster import ClusterSpec
from splitserve.sim.entities import PoolSpec, WorkerTemplate

TINY_LAYOUT: KvLayout = MODELS["tiny"].kv_layout


@dataclass(frozen=True, slots=True)
class ConstantModel:
    """Every non-empty step takes `step_time_s`; transfers take `transfer_s`."""

    step_time_s: float = 1.0
    transfer_s: float = 0.0

    @property
    def ready(self) -> bool:
        return True

    def step_s(self, batch: BatchShape) -> float:
        return 0.0 if batch.is_empty else self.step_time_s

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.transfer_s if num_bytes > 0 else 0.0


def tiny_template(num_blocks: int = 256, **policy_params: object) -> WorkerTemplate:
    return WorkerTemplate(
        latency=RooflineModel(MODELS["tiny"], HARDWARE["a100-80g"]),
        num_blocks=num_blocks,
        kv_layout=TINY_LAYOUT,
        policy_params=dict(policy_params),
    )


def colocated(n: int = 2, num_blocks: int = 256, **policy_params: object) -> ClusterSpec:
    t = tiny_template(num_blocks, **policy_params)
    return ClusterSpec((PoolSpec(PoolName("mixed"), Role.MIXED, n, t),))


def disaggregated(
    p: int = 1, d: int = 1, num_blocks: int = 256, **policy_params: object
) -> ClusterSpec:
    t = tiny_template(num_blocks, **policy_params)
    return ClusterSpec(
        (
            PoolSpec(PoolName("prefill"), Role.PREFILL, p, t),
            PoolSpec(PoolName("decode"), Role.DECODE, d, t),
        )
    )
