"""Step-policy parameters a user writes (`worker serve --batching-params`, a scenario pool's
`policy_params`): a value no policy can run on is refused naming it.

Before: NaN / infinite numbers were taken by every policy (a NaN comparison is always false, so
`aging_s: NaN` passed `aging_s <= 0`), and AccelGen's `preempt_prob: -1` / `preempt_max_s: -1`
and ALISE's `kv_bytes_per_token: 0` were accepted."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from splitserve.policy.batching.builtin import (
    BATCHING,
    checked_batching_policy,
    make_batching_policy,
)


def _float_params() -> list[tuple[str, str]]:
    out = []
    for name in BATCHING.names():
        params = make_batching_policy(name).params  # type: ignore[attr-defined]
        hints = typing.get_type_hints(type(params))
        out += [(name, f.name) for f in dataclasses.fields(params) if hints[f.name] is float]
    return out


FLOATS = _float_params()


def test_there_are_float_parameters_to_check() -> None:
    assert len(FLOATS) >= 10


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(("policy", "param"), FLOATS)
def test_a_non_finite_number_is_refused_naming_the_parameter(
    policy: str, param: str, value: float
) -> None:
    with pytest.raises(ValueError, match=rf"{param} must be a finite number"):
        checked_batching_policy(policy, {param: value})


@pytest.mark.parametrize(
    ("policy", "params", "says"),
    [
        ("accelgen", {"preempt_prob": -0.5}, "preempt_prob"),
        ("accelgen", {"preempt_prob": 1.5}, "preempt_prob"),
        ("accelgen", {"preempt_max_s": -1.0}, "preempt_max_s"),
        ("alise", {"kv_bytes_per_token": 0}, "kv_bytes_per_token"),
        ("alise", {"kv_bytes_per_token": -1}, "kv_bytes_per_token"),
    ],
)
def test_an_out_of_range_value_is_refused_naming_it(
    policy: str, params: dict[str, object], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        checked_batching_policy(policy, params)


@pytest.mark.parametrize(
    ("policy", "params"),
    [
        ("accelgen", {"preempt_prob": 0.0, "preempt_max_s": 0.0}),
        ("accelgen", {"preempt_prob": 1.0}),
        ("alise", {"kv_bytes_per_token": 1}),
        ("fcfs", {"max_num_batched_tokens": 512}),
    ],
)
def test_values_in_range_are_taken(policy: str, params: dict[str, object]) -> None:
    built = checked_batching_policy(policy, params)
    for key, value in params.items():
        assert getattr(built.params, key) == value  # type: ignore[attr-defined]
