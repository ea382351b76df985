"""The pure parts of `make bench-router` on many cores: core lists, layouts, the run's budget,
and merging several load generators' results."""

from __future__ import annotations

import pytest

from tests.bench_router.layout import (
    Budget,
    auto_layout,
    backend_counts,
    format_cores,
    make_layout,
    parse_cores,
)
from tests.bench_router.loadgen import Result, merge
from tests.bench_router.loadproc import split


def test_parse_cores_takes_single_cores_ranges_and_lists() -> None:
    assert parse_cores("0") == (0,)
    assert parse_cores("0-3") == (0, 1, 2, 3)
    assert parse_cores("4-5, 0,2") == (0, 2, 4, 5)
    assert parse_cores("1,1-2") == (1, 2)


@pytest.mark.parametrize("spec", ["", "a", "0,,1", "3-1", "-1", "0-x"])
def test_parse_cores_refuses_bad_specs_naming_them(spec: str) -> None:
    with pytest.raises(ValueError, match="core list"):
        parse_cores(spec)


def test_format_cores_is_the_inverse_with_ranges() -> None:
    assert format_cores((0, 1, 2, 5)) == "0-2,5"
    assert format_cores([7]) == "7"
    assert parse_cores(format_cores((0, 2, 3, 4, 9))) == (0, 2, 3, 4, 9)


def test_two_cores_keep_the_historical_layout() -> None:
    layout = auto_layout([0, 1], 1)
    assert (layout.router, layout.load, layout.worker) == ((0,), (1,), (1,))
    assert not layout.overlaps


def test_two_cores_with_two_router_processes_share_the_second_core() -> None:
    layout = auto_layout([0, 1], 2)
    assert layout.router == (0, 1)
    assert layout.overlaps
    assert layout.fits(2)


def test_automatic_layout_on_too_few_cores_says_which_process_counts_fit() -> None:
    layout = make_layout(list(range(12)), 4)
    assert layout.router == (0, 1, 2)
    assert layout.fits(2)
    assert not layout.fits(4)


def test_one_core_is_refused() -> None:
    with pytest.raises(ValueError, match="2 cores"):
        auto_layout([0], 1)


def test_sixteen_cores_give_disjoint_router_load_and_backend_cores() -> None:
    layout = auto_layout(list(range(16)), 4)
    assert layout.router == (0, 1, 2, 3)
    assert layout.load == (4, 5)
    assert layout.worker == tuple(range(6, 16))
    assert not layout.overlaps
    assert [layout.router_core_of(i) for i in range(4)] == [0, 1, 2, 3]


def test_backends_default_to_one_per_backend_core_40_percent_of_them_prefill() -> None:
    assert backend_counts(auto_layout(list(range(16)), 4)) == (4, 6)
    assert backend_counts(auto_layout([0, 1], 1)) == (1, 1)
    assert backend_counts(auto_layout([0, 1], 1), 6) == (4, 6)
    assert backend_counts(auto_layout([0, 1], 1), 1) == (1, 1)
    with pytest.raises(ValueError, match="--backends"):
        backend_counts(auto_layout([0, 1], 1), 0)


def test_auto_layout_gives_the_router_at_most_a_quarter_of_the_cores() -> None:
    assert auto_layout(list(range(8)), 4).router == (0, 1)


def test_given_core_lists_override_and_overlap_is_reported() -> None:
    layout = make_layout([0, 1], 2, router="0,1", load="1", worker="1")
    assert layout.router == (0, 1)
    assert layout.overlaps
    assert not layout.auto
    assert "shared" in layout.describe()


def test_cores_this_process_may_not_use_are_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"--load-cores: core\(s\) 9 not available"):
        make_layout([0, 1, 2, 3], 1, load="9")


def test_more_router_processes_than_router_cores_is_refused() -> None:
    with pytest.raises(ValueError, match="4 router processes need 4 cores"):
        make_layout(list(range(16)), 4, router="0-1")


def test_budget_skips_and_records_parts_that_do_not_fit() -> None:
    now = [100.0]
    budget = Budget(60, lambda: now[0])
    assert budget.allows("first", 50)
    now[0] += 30
    assert not budget.allows("second", 40)
    assert budget.allows("third", 20)
    assert budget.skipped == ["second (needs ~40 s, 30 s left)"]


def test_no_budget_allows_everything() -> None:
    budget = Budget(None, lambda: 0.0)
    assert budget.allows("anything", 1e9)
    assert budget.skipped == []


def test_merge_pools_latencies_sums_counts_and_spans_the_wall_time() -> None:
    a = Result(ttft_s=[0.1], e2e_s=[0.2], errors=1, wall_s=10.0, statuses={"HTTP/1.1 503": 1},
               started_s=100.0, cpu_s=2.0)  # fmt: skip
    b = Result(ttft_s=[0.3, 0.4], e2e_s=[0.5, 0.6], errors=2, wall_s=10.5,
               statuses={"HTTP/1.1 503": 1, "OSError": 1}, started_s=100.2, cpu_s=3.0)  # fmt: skip
    m = merge([a, b])
    assert m.done == 3
    assert m.ttft_s == [0.1, 0.3, 0.4]
    assert m.errors == 3
    assert m.statuses == {"HTTP/1.1 503": 2, "OSError": 1}
    assert m.started_s == 100.0
    assert m.wall_s == pytest.approx(10.7)
    assert m.cpu_s == 5.0


def test_result_survives_its_json_round_trip() -> None:
    r = Result(ttft_s=[0.1], e2e_s=[0.2], errors=0, wall_s=1.5, statuses={}, started_s=3.0,
               cpu_s=0.7)  # fmt: skip
    assert Result.from_json(r.to_json()) == r


def test_merge_of_nothing_is_empty() -> None:
    assert merge([]).done == 0


def test_split_spreads_the_remainder_over_the_first_parts() -> None:
    assert split(32, 6) == [6, 6, 5, 5, 5, 5]
    assert sum(split(10**9, 7)) == 10**9
    with pytest.raises(ValueError, match="parts"):
        split(4, 0)
