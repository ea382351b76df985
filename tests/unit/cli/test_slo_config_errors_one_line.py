"""`--slo-config` with a bad value: one line per problem naming the file and the key as written
in it (before: pydantic's block, "1 validation error for SloClassSpec" with its URL, and the
router keys named by SloSettings' fields, `queue_capacity` for `router.admissionQueueCapacity`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli import router as cli_router


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (
            "sloClasses:\n  - {name: chat, ttftMs: fast, tpotMs: 50}\n",
            ["sloClasses.0.ttftMs: Input should be a valid number"],
        ),
        (
            "router: {admissionQueueCapacity: -1, maxOutstandingPerWorker: x}\n",
            [
                "router.admissionQueueCapacity: Input should be greater than or equal to 0",
                "router.maxOutstandingPerWorker: Input should be a valid integer",
            ],
        ),
    ],
)
def test_a_bad_value_in_the_slo_config_is_one_line_per_problem(
    content: str, says: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_router, "_serve", lambda *_: None)
    path = tmp_path / "slo.yaml"
    path.write_text(content)
    args = ["serve", "--tokenizer", str(tmp_path), "--slo-config", str(path)]
    r = CliRunner().invoke(cli_router.router, args)
    assert r.exit_code == 2, r.output
    assert "errors.pydantic.dev" not in r.output
    assert "validation error" not in r.output
    assert "queue_capacity" not in r.output
    for s in says:
        assert f"{path}: {s}" in r.output, r.output


def test_admission_keys_beside_admission_false_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They were accepted and never applied: with `admission: false` the per-worker cap of 1
    let all 12 of 12 concurrent requests through."""
    monkeypatch.setattr(cli_router, "_serve", lambda *_: None)
    path = tmp_path / "slo.yaml"
    path.write_text("router: {admission: false, maxOutstandingPerWorker: 1}\n")
    args = ["serve", "--tokenizer", str(tmp_path), "--slo-config", str(path)]
    r = CliRunner().invoke(cli_router.router, args)
    assert r.exit_code == 2, r.output
    assert "maxOutstandingPerWorker" in r.output
    assert "admission: false" in r.output
    path.write_text("router: {admission: false}\n")  # alone: the local switch, accepted
    assert CliRunner().invoke(cli_router.router, args).exit_code == 0
