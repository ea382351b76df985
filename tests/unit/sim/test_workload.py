"""Workload generators and trace parsing.

Invariants:
- arrival times are non-decreasing and their mean rate matches the requested rate;
- gamma inter-arrivals have the requested coefficient of variation;
- sampled lengths stay inside a distribution's bounds and are >= 1;
- trace parsing keeps row order and lengths, and time scaling multiplies offsets;
- the same seed gives the same workload.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.sim.workload import (
    PRESETS,
    Fixed,
    Gamma,
    LogNormal,
    Poisson,
    Uniform,
    WorkItem,
    items_from_pairs,
    parse_azure_trace,
    scale_to_rate,
    synthetic,
)

TRACE = [
    "TIMESTAMP,ContextTokens,GeneratedTokens\n",
    "2023-11-16 18:15:46.6805900,374,44\n",
    "2023-11-16 18:15:50.9951690,396,109\n",
    "2023-11-16 18:15:51.2224670,879,0\n",
    "2023-11-16 18:15:52.6805900,91,16\n",
]


def test_poisson_rate_and_order() -> None:
    t = Poisson(4.0).times_s(20_000, np.random.default_rng(1))
    assert np.all(np.diff(t) >= 0)
    assert 20_000 / t[-1] == pytest.approx(4.0, rel=0.03)


def test_gamma_cv() -> None:
    t = Gamma(2.0, cv=3.0).times_s(50_000, np.random.default_rng(2))
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


@given(
    st.floats(1, 5000),
    st.floats(0, 2),
    st.integers(1, 100),
    st.integers(100, 10_000),
    st.integers(0, 2**32 - 1),
)
def test_lognormal_bounds(median: float, sigma: float, lo: int, hi: int, seed: int) -> None:
    x = LogNormal(median, sigma, lo, hi).sample(200, np.random.default_rng(seed))
    assert x.min() >= lo
    assert x.max() <= hi


def test_fixed_and_uniform() -> None:
    rng = np.random.default_rng(0)
    assert set(Fixed(7).sample(10, rng).tolist()) == {7}
    u = Uniform(3, 5).sample(1000, rng)
    assert set(u.tolist()) == {3, 4, 5}
    with pytest.raises(ValueError, match="low_tokens"):
        Uniform(5, 3)


def test_synthetic_is_seeded() -> None:
    p = PRESETS["sharegpt"]
    a = synthetic(Poisson(1.0), p.prompt, p.output, 50, np.random.default_rng(9))
    b = synthetic(Poisson(1.0), p.prompt, p.output, 50, np.random.default_rng(9))
    assert a == b
    assert all(isinstance(w, WorkItem) for w in a)


def test_preset_means_match_their_sources() -> None:
    # ShareGPT: mean prompt 161 / output 338 tokens (vLLM paper) within 10 %.
    p = PRESETS["sharegpt"]
    assert p.prompt.mean_tokens == pytest.approx(161, rel=0.1)
    assert p.output.mean_tokens == pytest.approx(338, rel=0.1)
    assert PRESETS["longbench"].prompt.mean_tokens > 10 * PRESETS["humaneval"].prompt.mean_tokens


def test_resample_pairs() -> None:
    items = items_from_pairs(Poisson(2.0), [(10, 2), (20, 4)], 100, np.random.default_rng(0))
    assert {(w.num_prompt_tokens, w.num_output_tokens) for w in items} == {(10, 2), (20, 4)}


def test_parse_azure_trace_with_time_scale() -> None:
    items = parse_azure_trace(TRACE)
    assert [(w.num_prompt_tokens, w.num_output_tokens) for w in items] == [
        (374, 44),
        (396, 109),
        (91, 16),
    ]
    assert items[0].arrival_s == 0.0
    assert items[1].arrival_s == pytest.approx(4.314579)
    fast = parse_azure_trace(TRACE, time_scale=0.5)
    assert fast[2].arrival_s == pytest.approx(items[2].arrival_s / 2)
    assert len(parse_azure_trace(TRACE, max_requests=2)) == 2
    with pytest.raises(ValueError, match="header"):
        parse_azure_trace(["a,b,c\n"])


def test_scale_to_rate() -> None:
    items = parse_azure_trace(TRACE)
    scaled = scale_to_rate(items, 10.0)
    assert (len(scaled) - 1) / scaled[-1].arrival_s == pytest.approx(10.0)


@pytest.mark.parametrize("rows", [1, 3])
def test_scale_to_rate_refuses_items_with_no_span(rows: int) -> None:
    # returned them unchanged: every rate of a goodput search ran the same requests
    items = tuple(WorkItem(2.0, 8, 8) for _ in range(rows))
    with pytest.raises(ValueError, match="arrive at once: no arrival rate"):
        scale_to_rate(items, 10.0)


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([], "empty"),  # was StopIteration
        (["TIMESTAMP,ContextTokens,GeneratedTokens", "x,1,2"], "line 2.*TIMESTAMP 'x'"),
        (
            ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.68,ten,2"],
            "line 2.*ContextTokens 'ten'",
        ),
        (  # a negative length was skipped as a zero one is
            ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.68,-4,2"],
            "line 2.*ContextTokens -4",
        ),
        (  # read as if the extra value were not there (`sim validate` refuses it in recordings)
            [
                "TIMESTAMP,ContextTokens,GeneratedTokens",
                "2023-11-16 18:15:46.0,10,44",
                "2023-11-16 18:15:47.0,10,10,99",
            ],
            "line 3: 4 values, more than the header's 3 columns",
        ),
    ],
)
def test_parse_azure_trace_names_the_bad_line(lines: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_azure_trace(lines)
