"""The built-in step policies, listed in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from splitserve.policy.batching.base import BatchingPolicy
from splitserve.policy.registry import PluginRegistry

BATCHING: PluginRegistry[Callable[..., BatchingPolicy]] = PluginRegistry("batching policy")
BATCHING.add("fcfs", "splitserve.policy.batching.builtin:_make_fcfs")
BATCHING.add("sarathi", "splitserve.policy.batching.builtin:_make_sarathi")
# Each of these modules exposes `make(**params) -> BatchingPolicy`.
BATCHING.add("tetriinfer-prefill", "splitserve.policy.batching.tetriinfer:make_prefill")
BATCHING.add("tetriinfer-decode", "splitserve.policy.batching.tetriinfer:make_decode")
BATCHING.add("pastfuture", "splitserve.policy.batching.pastfuture:make")
BATCHING.add("alise", "splitserve.policy.batching.alise:make")
BATCHING.add("accelgen", "splitserve.policy.batching.accelgen:make")
BATCHING.add("bros", "splitserve.policy.batching.bros:make")


def _make_fcfs(**params: Any) -> BatchingPolicy:
    from splitserve.policy.batching.fcfs import FcfsParams, FcfsPolicy

    return FcfsPolicy(FcfsParams(**params))


def _make_sarathi(**params: Any) -> BatchingPolicy:
    from splitserve.policy.batching.sarathi import SarathiParams, SarathiPolicy

    return SarathiPolicy(SarathiParams(**params))


def make_batching_policy(name: str, **params: Any) -> BatchingPolicy:
    """Build a registered step policy by name with its parameters."""
    return BATCHING.get(name)(**params)
