"""`splitserve plan` refuses a --name Kubernetes would refuse and a --trace it cannot read,
naming the flag.

Before: `--name Bad_Name!` printed an LLMService that `kubectl apply` refuses, and a CSV without
the Azure header died in a traceback (`ValueError: not an Azure LLM trace header`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.plan import plan


@pytest.mark.parametrize("name", ["Bad_Name!", "", "9lives", "a" * 64, "x-"])
def test_a_name_kubernetes_refuses_is_refused(name: str) -> None:
    r = CliRunner().invoke(plan, ["--rate", "2", "--requests", "20", "--tp", "1", "--name", name])
    assert r.exit_code == 2, r.output
    assert "--name" in r.output


def test_a_trace_without_the_azure_header_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("x,y\n1,2\n")
    r = CliRunner().invoke(plan, ["--trace", str(trace), "--requests", "20", "--tp", "1"])
    assert r.exit_code == 2, r.output
    assert "--trace" in r.output
    assert "Azure" in r.output
