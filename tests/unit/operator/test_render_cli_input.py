"""`splitserve operator render` on documents whose shape is wrong: a one-line error and exit 1
(docs/install.md), never a Python traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.operator import operator


@pytest.mark.parametrize("metadata", ["5", "[1]", "just-a-name"])
def test_metadata_that_is_not_a_mapping_is_refused(tmp_path: Path, metadata: str) -> None:
    f = tmp_path / "svc.yaml"
    f.write_text(f"apiVersion: splitserve.io/v1alpha1\nkind: LLMService\nmetadata: {metadata}\n")
    result = CliRunner().invoke(operator, ["render", "-f", str(f)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "document 0: metadata must be a mapping" in result.output
