"""The fresh-pairs report of `make bench-kv` (its run needs vLLM; its arithmetic does not)."""

from __future__ import annotations

from splitserve.worker.vllm_adapter.kvbench import Timing
from splitserve.worker.vllm_adapter.kvbench_fresh import (
    ordinal,
    pct,
    report_fresh,
    spread,
    summary,
)


def _t(ttft_ms: float, gap_ms: float) -> Timing:
    return Timing("pd", 128, ttft_ms / 1000, gap_ms / 1000, [1, 2], 0.1)


def test_first_second_and_last_request_over_the_pairs() -> None:
    timings = {
        "read": [[_t(10, 30), _t(9, 29), _t(9, 28)], [_t(14, 50), _t(9, 31), _t(8, 27)]],
        "noread": [[_t(12, 60), _t(9, 30), _t(9, 29)]],
    }
    rows = {(r["variant"], r["request"]): r for r in summary(timings)}
    assert set(rows) == {
        ("read", "1st"),
        ("read", "2nd"),
        ("read", "3rd"),
        ("noread", "1st"),
        ("noread", "2nd"),
        ("noread", "3rd"),
        ("read", "2nd–3rd, pooled"),
        ("noread", "2nd–3rd, pooled"),
    }
    first = rows["read", "1st"]
    assert first["pairs"] == 2
    assert first["gap_s"] == [0.030, 0.050]
    assert spread(first["gap_s"]) == "40.0 (30.0–50.0)"
    assert rows["read", "3rd"]["ttft_s"] == [0.009, 0.008]
    assert rows["noread", "1st"]["gap_s"] == [0.060]
    # Every request but the first, over every pair: the steady state the first is held to.
    assert rows["read", "2nd–3rd, pooled"]["gap_s"] == [0.029, 0.028, 0.031, 0.027]


def test_the_last_request_is_the_shortest_pairs_last_and_json_rows_work() -> None:
    as_json = {
        "read": [[{"ttft_s": 0.01, "token2_s": 0.03}] * 4, [{"ttft_s": 0.02, "token2_s": 0.04}] * 3]
    }
    rows = summary(as_json)
    assert [r["request"] for r in rows] == ["1st", "2nd", "3rd", "2nd–3rd, pooled"]
    assert rows[2]["gap_s"] == [0.03, 0.04]


def test_report_names_the_shape_and_every_row() -> None:
    res = {
        "shape": {
            "pairs": 1,
            "length": 128,
            "requests": 2,
            "max_tokens": 8,
            "settle_s": 1.0,
            "decode_start_s": [20.0],
        },
        "timings": {"read": [[_t(10, 30), _t(9, 29)]], "noread": [[_t(11, 40), _t(9, 30)]]},
    }
    text = report_fresh(res)
    assert "1 fresh decode workers per variant" in text
    assert "| read | 1st | 1 | 10.0 (10.0–10.0) | 30.0 (30.0–30.0) |" in text
    assert "| noread | 1st | 1 | 11.0 (11.0–11.0) | 40.0 (40.0–40.0) |" in text
    assert spread([]) == "n/a"


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 10, 11, 12, 13, 21, 22, 101)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "10th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
    ]


def test_report_gives_the_workers_cpu_per_variant() -> None:
    res = {
        "shape": {
            "pairs": 2,
            "length": 128,
            "requests": 2,
            "max_tokens": 8,
            "settle_s": 1.0,
            "decode_start_s": [20.0, 21.0],
            "variants": ["window", "read"],
        },
        "timings": {"window": [[_t(10, 30), _t(9, 29)]] * 2, "read": [[_t(11, 40), _t(9, 30)]] * 2},
        "cpu": {
            "window": [
                {"prefill_warm": 0.10, "prefill_idle": 0.01, "decode_idle": 0.02},
                {"prefill_warm": 0.30, "prefill_idle": 0.03, "decode_idle": 0.02},
            ],
            "read": [{"prefill_warm": 0.01, "prefill_idle": 0.01, "decode_idle": 0.01}] * 2,
        },
    }
    text = report_fresh(res)
    assert "| window | 20.0 (10.0–30.0) | 2.0 (1.0–3.0) | 2.0 (2.0–2.0) |" in text
    assert "| read | 1.0 (1.0–1.0) | 1.0 (1.0–1.0) | 1.0 (1.0–1.0) |" in text
    assert pct([]) == "n/a"
