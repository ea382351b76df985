"""Profiled (table) latency model.

Invariants:
- a curve passes through its points, interpolates linearly between them, extrapolates with the
  last slope and is monotone;
- curves that are not monotone are refused (so the model stays monotone);
- a table sampled from the roofline reproduces the roofline at and between sample points
  (within a few per cent) for prefill-only and decode-only batches;
- adding work to a batch never makes it cheaper; empty batches cost 0;
- CSV profiles parse, average duplicates and reject unknown components.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitserve.core.perf import HARDWARE, MODELS, BatchShape, LatencyModel, RooflineModel
from splitserve.core.perf.table import ProfileCurve, ProfiledModel, parse_profile_csv

ROOF = RooflineModel(MODELS["opt-13b"], HARDWARE["a100-80g"])
TABLE = ProfiledModel.sampled_from(ROOF)
_conforms: LatencyModel = TABLE


def test_curve_interpolation() -> None:
    c = ProfileCurve((1.0, 3.0), (2.0, 4.0))
    assert c.at(1.0) == 2.0
    assert c.at(2.0) == pytest.approx(3.0)
    assert c.at(5.0) == pytest.approx(6.0)
    assert c.at(0.5) == 2.0
    assert c.at(0.0) == 0.0
    assert ProfileCurve((2.0,), (4.0,)).at(3.0) == pytest.approx(6.0)


def test_curve_must_be_monotone() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        ProfileCurve((1.0, 2.0), (3.0, 1.0))
    with pytest.raises(ValueError, match="strictly increasing"):
        ProfileCurve((2.0, 1.0), (1.0, 3.0))


@pytest.mark.parametrize("n", [32, 300, 512, 1500, 3000])
def test_prefill_matches_roofline(n: int) -> None:
    b = BatchShape(prefill_chunks=((n, 0),))
    assert TABLE.step_s(b) == pytest.approx(ROOF.step_s(b), rel=0.05)


@pytest.mark.parametrize(("batch", "ctx"), [(1, 100), (16, 500), (64, 900), (200, 2000)])
def test_decode_matches_roofline(batch: int, ctx: int) -> None:
    b = BatchShape(decode_contexts=(ctx,) * batch)
    assert TABLE.step_s(b) == pytest.approx(ROOF.step_s(b), rel=0.05)


_shape = st.builds(
    BatchShape,
    st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 4096)), max_size=4).map(tuple),
    st.lists(st.integers(1, 8192), max_size=64).map(tuple),
)


@given(_shape, st.integers(1, 512), st.integers(1, 4096))
def test_monotone(batch: BatchShape, extra_chunk: int, extra_ctx: int) -> None:
    more = BatchShape((*batch.prefill_chunks, (extra_chunk, 0)), batch.decode_contexts)
    longer = BatchShape(batch.prefill_chunks, (*batch.decode_contexts, extra_ctx))
    assert TABLE.step_s(more) >= TABLE.step_s(batch)
    assert TABLE.step_s(longer) >= TABLE.step_s(batch)
    assert TABLE.step_s(BatchShape()) == 0.0


def test_parse_profile_csv() -> None:
    rows = [
        "component,x,seconds",
        "gemm,1,0.010",
        "gemm,1,0.012",
        "gemm,512,0.050",
        "prefill_attention,1000,0.001",
        "decode_attention,1000,0.002",
    ]
    m = parse_profile_csv(rows, overhead_s=0.001)
    assert m.gemm.ys[0] == pytest.approx(0.011)
    assert m.step_s(BatchShape(decode_contexts=(1000,))) == pytest.approx(0.001 + 0.011 + 0.002)
    with pytest.raises(ValueError, match="bad profile row"):
        parse_profile_csv(["mlp,1,0.1"])
    with pytest.raises(ValueError, match="no 'decode_attention'"):
        parse_profile_csv(rows[:5])


def test_kv_transfer_follows_the_link() -> None:
    assert TABLE.kv_transfer_s(0) == 0.0
    assert TABLE.kv_transfer_s(25 * 10**9) == pytest.approx(
        ROOF.kv_transfer_s(25 * 10**9), rel=1e-6
    )


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ("gemm,128,nan", "seconds"),
        ("gemm,128,inf", "seconds"),
        ("gemm,128,-0.01", "seconds"),
        ("gemm,128,abc", "seconds"),
        ("gemm,nan,0.02", "x"),
        ("gemm,-128,0.02", "x"),
        ("gemm,,0.02", "x"),
        ("decode_attention,1000,", "seconds"),
    ],
)
def test_parse_profile_csv_refuses_a_bad_number_naming_its_line(row: str, why: str) -> None:
    """A NaN seconds priced every step NaN (a run of 0 % attainment and no latencies), a
    negative one was silently raised to its neighbour, a negative x moved the curve."""
    rows = [
        "component,x,seconds",
        "gemm,1,0.010",
        "gemm,512,0.050",
        "prefill_attention,1000,0.001",
        "decode_attention,1000,0.002",
        row,
    ]
    with pytest.raises(ValueError, match=rf"line 6: {why} .*{row.split(',')[0]}"):
        parse_profile_csv(rows)
