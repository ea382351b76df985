"""The built-in step policies, listed in one place."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
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


def checked_batching_policy(name: str, params: Mapping[str, Any]) -> BatchingPolicy:
    """`make_batching_policy` for parameters a user wrote (JSON, YAML): each value must have its
    field's type. Raises `ValueError` naming the field: the dataclasses check ranges, not types,
    so `max_num_batched_tokens: 100.5` built a policy whose load reports then failed on every
    call, and `chunked_prefill: "false"` (a true string) left chunking on."""
    defaults = getattr(make_batching_policy(name), "params", None)  # the params' dataclass
    if defaults is not None and dataclasses.is_dataclass(defaults):
        hints = typing.get_type_hints(type(defaults))
        names = [f.name for f in dataclasses.fields(defaults)]
        if unknown := sorted(set(params) - set(names)):  # was "__init__() got an unexpected ..."
            raise ValueError(
                f"unknown parameter {', '.join(map(repr, unknown))} ({name} takes "
                f"{', '.join(names)})"
            )
        for key, value in params.items():  # before the dataclass compares a string with 1
            want = hints.get(key)
            if want is not None and not _has_type(value, want):
                raise ValueError(f"{key} must be {_type_name(want)}, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):  # NaN passed every range
                raise ValueError(f"{key} must be a finite number, got {value!r}")
    return make_batching_policy(name, **params)


def _has_type(value: object, want: Any) -> bool:
    if typing.get_origin(want) in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in typing.get_args(want))
    if want is type(None):
        return value is None
    if want is bool:
        return isinstance(value, bool)
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if want is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if want is str:
        return isinstance(value, str)
    return True  # containers and the rest: the dataclass's own checks


def _type_name(want: Any) -> str:
    if typing.get_origin(want) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(want))
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(want, "null" if want is type(None) else str(want))
