"""`splitserve worker serve` refuses ports and KV sizes it cannot honour, naming the flag.

Before: `--port 70000` served on 4464 and `--port -1` on 65535 (wrapped modulo 65536),
`--metrics-port -2` died in a traceback, `--sim-kv-blocks 0` was taken as "default" and
`--sim-kv-blocks -5` died in a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.worker import worker


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--port", "70000"),
        ("--port", "-1"),
        ("--grpc-port", "65536"),
        ("--metrics-port", "-2"),
        ("--health-port", "70000"),
        ("--nixl-port", "-1"),
        ("--sim-kv-blocks", "0"),
        ("--sim-kv-blocks", "-5"),
    ],
)
def test_out_of_range_values_are_refused_before_anything_starts(flag: str, value: str) -> None:
    r = CliRunner().invoke(worker, ["serve", flag, value])
    assert r.exit_code == 2, r.output
    assert flag.split("-port")[0] in r.output


@pytest.mark.parametrize(
    ("args", "flag", "says"),
    [
        (["--batching", "nope"], "--batching", "valid: accelgen"),
        (["--batching-params", '{"bogus": 1}'], "--batching-params", "unknown parameter 'bogus'"),
        (["--batching-params", "notjson"], "--batching-params", "not JSON"),
        # A decode / mixed worker behind prefill workers receives hand-offs this policy never
        # schedules: the request hung (curl timed out); the simulator refused the same set-up.
        (
            ["--role", "decode", "--batching", "tetriinfer-prefill"],
            "--batching",
            "never runs a decode hand-off",
        ),
        (["--role", "mixed", "--batching", "tetriinfer-prefill"], "--batching", "--role prefill"),
        # The oracle reads true lengths: a live worker quietly gated on max_tokens instead.
        (
            ["--batching", "pastfuture", "--batching-params", '{"admission": "oracle"}'],
            "--batching-params",
            "only the simulator knows",
        ),
        (["--batching-params", '{"max_num_batched_tokens": -5}'], "--batching-params", ">= 1"),
        (["--batching-params", "[1]"], "--batching-params", "JSON object"),
        (["--batching", "sarathi", "--batching-params", '{"x": 1}'], "--batching-params", "x"),
        # a value of the wrong type: 100.5 built a policy whose load reports failed on every
        # call; "false" (a true string) left chunking on; "8" was a str-vs-int TypeError
        (
            ["--batching-params", '{"max_num_batched_tokens": 100.5}'],
            "--batching-params",
            "max_num_batched_tokens must be an integer",
        ),
        (
            ["--batching-params", '{"chunked_prefill": "false"}'],
            "--batching-params",
            "chunked_prefill must be true or false",
        ),
        (
            ["--batching-params", '{"max_num_seqs": "8"}'],
            "--batching-params",
            "max_num_seqs must be an integer",
        ),
        (
            ["--batching", "alise", "--batching-params", '{"num_queues": 1.5}'],
            "--batching-params",
            "num_queues must be an integer",
        ),
        (
            ["--batching", "bros", "--batching-params", '{"ewma_alpha": "0.5"}'],
            "--batching-params",
            "ewma_alpha must be a number",
        ),
    ],
)
def test_a_step_policy_that_cannot_be_built_is_refused_naming_the_flag(
    args: list[str], flag: str, says: str
) -> None:
    """docs/policies.md: an unknown name lists the valid ones; these were tracebacks."""
    r = CliRunner().invoke(worker, ["serve", *args])
    assert r.exit_code == 2, r.output
    assert flag in r.output
    assert says in r.output


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--sim-latency-model", "nope"], "--sim-latency-model"),
        (["--sim-latency-model", "vidur-h100"], "--sim-latency-model"),  # measured on an H100
        (["--sim-shape", "nope"], "--sim-shape"),
        (["--sim-hardware", "nope"], "--sim-hardware"),
    ],
)
def test_sim_engine_options_are_refused_as_up_refuses_them(args: list[str], flag: str) -> None:
    """Same messages as `splitserve up`; `worker serve` raised them as ConfigError tracebacks."""
    r = CliRunner().invoke(worker, ["serve", *args])
    assert r.exit_code == 2, r.output
    assert flag in r.output


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--vocab-size", "0"], "--vocab-size"),
        (["--vocab-size", "-5"], "--vocab-size"),
        (["--first-token-id", "-1"], "--first-token-id"),
        (["--first-token-id", "5000"], "--first-token-id"),
        (["--vocab-size", "16"], "--first-token-id"),  # the default first id 16 is not below 16
        (["--log-level", "bogus"], "--log-level"),
        (["--role", "bogus"], "--role"),
        (["--batching-params", "{bad"], "--batching-params"),
    ],
)
def test_sim_token_and_log_options_are_refused_naming_the_flag(args: list[str], flag: str) -> None:
    """These were tracebacks once the worker had started (or errors naming no flag)."""
    r = CliRunner().invoke(worker, ["serve", *args])
    assert r.exit_code == 2, r.output
    assert flag in r.output


@pytest.mark.parametrize("ids", ['["a"]', "[5000]", "[-1]", "{"])
def test_a_token_ids_file_that_cannot_be_used_is_refused(ids: str, tmp_path: Path) -> None:
    path = tmp_path / "ids.json"
    path.write_text(ids)
    r = CliRunner().invoke(worker, ["serve", "--token-ids-file", str(path)])
    assert r.exit_code == 2, r.output
    assert "--token-ids-file" in r.output
