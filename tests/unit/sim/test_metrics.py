"""Metric definitions and goodput bisection.

Invariants:
- TTFT <= E2E for every finished request; TPOT is undefined for a single output token;
- dropped or unfinished requests never attain an SLO;
- goodput g satisfies att(g) >= target and att(g * (1 + 2 * tolerance)) < target for a
  non-increasing attainment curve; 0 when even the lowest rate misses.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.ids import SloClassName
from splitserve.core.request import SloClass
from splitserve.sim.metrics import RequestRecord, attainment, goodput

SLO = SloClass(SloClassName("default"), ttft_ms=200, tpot_ms=100)


def rec(first: float | None, finish: float | None, n_out: int, dropped: str = "") -> RequestRecord:
    return RequestRecord(
        id="r",
        slo_class=SLO.name,
        arrival_s=1.0,
        num_prompt_tokens=10,
        max_tokens=n_out,
        num_output_tokens=n_out,
        path="aggregated",
        first_token_s=first,
        finish_s=finish,
        dropped=dropped,
    )


def test_latencies() -> None:
    r = rec(1.1, 2.1, 11)
    assert r.ttft_s == pytest.approx(0.1)
    assert r.e2e_s == pytest.approx(1.1)
    assert r.tpot_s == pytest.approx(0.1)
    assert rec(1.1, 1.1, 1).tpot_s is None


def test_attainment_counts_misses() -> None:
    records = [
        rec(1.1, 2.0, 11),  # ok
        rec(1.3, 2.0, 11),  # TTFT 0.3 > 0.2
        rec(1.1, 3.0, 11),  # TPOT 0.19 > 0.1
        rec(None, None, 5, dropped="no eligible endpoint"),
        rec(1.05, 1.05, 1),  # one token: TTFT only
    ]
    assert attainment(records, SLO) == pytest.approx(2 / 5)
    assert attainment([], SLO) == 1.0


@given(st.floats(0.5, 200.0), st.floats(0.01, 0.2))
def test_goodput_brackets_the_threshold(threshold: float, tol: float) -> None:
    def att(rate: float) -> float:
        return 1.0 if rate <= threshold else 0.5

    g = goodput(att, 0.9, 0.25, 1.0, tolerance=tol, max_probes=60)
    assert att(g.rate_per_s) >= 0.9
    assert att(g.rate_per_s * (1 + 2 * tol)) < 0.9
    assert len(g.probes) <= 60


def test_goodput_out_of_probes_while_doubling_is_a_lower_bound() -> None:
    # the last rate probed (2**23: 8,388,608) was reported as the goodput, unmarked
    g = goodput(lambda r: 1.0, 0.9, 1.0, 2.0, max_probes=24)
    assert g.lower_bound
    assert g.rate_per_s == 2.0**23
    bisected = goodput(lambda r: 1.0 if r <= 3 else 0.0, 0.9, 1.0, 2.0)
    assert not bisected.lower_bound


def test_goodput_zero_when_nothing_meets() -> None:
    g = goodput(lambda r: 0.0, 0.9, 1.0, 2.0)
    assert g.rate_per_s == 0.0
    assert g.probes == ((1.0, 0.0),)
