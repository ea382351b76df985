"""The scale-out part of `make bench-router`'s report: ratios to one process and the balance."""

from __future__ import annotations

from typing import Any

from tests.bench_router.run import scaling_lines


def _run(n: int, rps: float, ratio: float) -> dict[str, Any]:
    return {
        "processes": n,
        "cores": f"0-{n - 1}",
        "thread_affinity": [str(i) for i in range(n)],
        "concurrency": 32 * n,
        "rps": rps,
        "errors": 0,
        "cpu_ms_per_req": 1.0,
        "router_cpu_pct": [90.0] * n,
        "cpu_shares": [1 / n] * n,
        "busiest_backend_cpu_pct": 40.0,
        "backend_cpu_pct": {"prefill": [30.0, 31.0], "decode": [40.0, 39.0]},
        "load_cpu_pct": 10.0,
        "ratio": ratio,
    }


def test_scale_out_table_has_the_ratios_shares_and_placement() -> None:
    runs = [_run(1, 500, 1.0), _run(2, 950, 1.9), _run(4, 1800, 3.6)]
    text = "\n".join(scaling_lines({
        "scaling": {"runs": runs, "concurrency_per_process": 32, "sat_s": 8},
        "layout": {"router_cores": "0-3", "load_cores": "4-5", "overlaps": False},
    }))  # fmt: skip
    assert "ratios: 2/1 = 1.9, 4/1 = 3.6" in text
    assert "| 4 | 0 / 1 / 2 / 3 | 128 | 1800 | 3.6 |" in text
    assert "0.25 / 0.25 / 0.25 / 0.25" in text
    assert "decode [40.0, 39.0]" in text
    assert "lower bound" not in text


def test_shared_router_cores_are_called_a_lower_bound() -> None:
    text = "\n".join(scaling_lines({
        "scaling": {"runs": [_run(1, 200, 1.0)], "concurrency_per_process": 32, "sat_s": 4},
        "layout": {"router_cores": "0-1", "load_cores": "1", "overlaps": True},
    }))  # fmt: skip
    assert "lower bound" in text
    assert "ratios" not in text
