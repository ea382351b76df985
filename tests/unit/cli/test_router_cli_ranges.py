"""`splitserve router serve` refuses values it cannot honour before anything starts, naming the
flag.

Before: `--port -1`, `--port 70000`, `--grpc-port -5`, `--max-model-len 0`,
`--default-max-tokens 0` and `--min-prompt-tokens-for-pd -1` were refused by RouterConfig's
validation, naming its field (`http_port`, `placement.min_prompt_tokens_for_pd`) rather than the
flag; `--worker notanaddress` (or `127.0.0.1:0`) was watched for ever as a worker that never
answered, with nothing logged. `--worker 127.0.0.1:²` was a traceback (str.isdigit() holds
for Unicode digits that int() refuses).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli import router as cli_router


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--port", "-1"),
        ("--port", "70000"),
        ("--grpc-port", "-5"),
        ("--max-model-len", "0"),
        ("--max-model-len", "1"),
        ("--default-max-tokens", "0"),
        ("--min-prompt-tokens-for-pd", "-1"),
        ("--worker", "notanaddress"),
        ("--worker", "127.0.0.1:0"),
        ("--worker", "127.0.0.1:70000"),
        ("--worker", ":50051"),
        ("--worker", "host:port"),
        # Unicode digits: "²" passed str.isdigit() and int() raised (a traceback); "٣" (an
        # Arabic-Indic 3) was taken and watched for ever as a worker at port 3.
        ("--worker", "127.0.0.1:\u00b2"),
        ("--worker", "127.0.0.1:\u0663"),
        # was RouterConfig's pydantic block naming `model_name`, not the flag
        ("--model", ""),
    ],
)
def test_a_value_it_cannot_honour_is_refused_naming_the_flag(
    flag: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[object] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: served.append(config))
    args = ["serve", "--tokenizer", str(tmp_path), flag, value]
    r = CliRunner().invoke(cli_router.router, args)
    assert r.exit_code == 2, r.output
    assert f"'{flag}'" in r.output or f"{flag}:" in r.output, r.output
    assert served == []


@pytest.mark.parametrize("address", ["127.0.0.1:50051", "worker-0.ml.svc:1", "[::1]:50051"])
def test_host_port_addresses_are_taken(
    address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[object] = []
    monkeypatch.setattr(cli_router, "_serve", lambda config, *_: served.append(config))
    args = ["serve", "--tokenizer", str(tmp_path), "--worker", address]
    r = CliRunner().invoke(cli_router.router, args)
    assert r.exit_code == 0, r.output
    assert served[0].worker_addresses == (address,)  # type: ignore[attr-defined]
