"""`splitserve profile --from-samples`: a rebuild keeps what only the live run knew.

docs/profiling.md rebuilds in place (`--from-samples profile/samples.csv --out profile/`); that
used to drop fit.json's `method`, `probes` and `steps` (the fit on every reported step) and to
label a steps-method table "whole step periods" (the `outside` method's meaning).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.profile import profile
from splitserve.cli.tls_option import ENV as TLS_ENV
from splitserve.core.perf import HARDWARE, MODELS, BatchShape, RooflineModel
from splitserve.core.perf.samples import Measurement, samples_csv
from splitserve.security import tls


def _samples() -> list[Measurement]:
    """Roofline-priced probes of the grid docs/profiling.md's CPU example uses."""
    model = RooflineModel(MODELS["llama-2-7b"], HARDWARE["a100-80g"])
    out: list[Measurement] = []
    for rep in range(2):
        for total in (64, 256, 768):
            for b in (1, 4):
                n = total // b
                batch = BatchShape(prefill_chunks=((n, 0),) * b)
                out.append(Measurement("prefill", b, n, rep, batch, model.step_s(batch)))
        for b in (1, 4, 16):
            for ctx in (64, 512):
                batch = BatchShape(decode_contexts=(ctx,) * b)
                out.append(Measurement("decode", b, ctx, rep, batch, model.step_s(batch)))
    return out


LIVE: dict[str, object] = {
    "method": "steps",
    "probes": {"round_trip_s": 0.001, "gate_tokens": 1023, "run": 39, "rejected": 0},
    "steps": {"steps": 383, "mixed": 21, "mape": 0.026},
}


def _profile_dir(tmp_path: Path, fit: dict[str, object] | None) -> Path:
    d = tmp_path / "profile"
    d.mkdir()
    (d / "samples.csv").write_text("\n".join(samples_csv(_samples())) + "\n")
    if fit is not None:
        (d / "fit.json").write_text(json.dumps({"fit": {}, **fit}))
    return d


def test_rebuild_in_place_keeps_the_live_runs_method_probes_and_step_fit(tmp_path: Path) -> None:
    d = _profile_dir(tmp_path, LIVE)
    r = CliRunner().invoke(profile, ["--from-samples", str(d / "samples.csv"), "--out", str(d)])
    assert r.exit_code == 0, r.output
    summary = json.loads((d / "fit.json").read_text())
    assert {k: summary[k] for k in LIVE} == LIVE
    assert set(summary["fit"]["coefficients"]) == {"a_p", "b_p", "c_p", "a_d", "b_d", "c_d"}
    head = (d / "profile.csv").read_text().splitlines()[:2]
    assert "(method steps)" in head[0]
    assert "worker's own step times" in head[1]


def test_rebuild_without_the_live_fit_says_the_method_is_unknown(tmp_path: Path) -> None:
    d = _profile_dir(tmp_path, None)
    out = tmp_path / "out"
    r = CliRunner().invoke(profile, ["--from-samples", str(d / "samples.csv"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "fit.json").read_text())
    assert "method" not in summary
    assert "not known" in (out / "profile.csv").read_text().splitlines()[1]


def test_rebuild_of_an_outside_run_keeps_its_meaning(tmp_path: Path) -> None:
    d = _profile_dir(tmp_path, {"method": "outside"})
    out = tmp_path / "out"
    r = CliRunner().invoke(profile, ["--from-samples", str(d / "samples.csv"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "fit.json").read_text())["method"] == "outside"
    assert "whole step periods" in (out / "profile.csv").read_text().splitlines()[1]


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--prefill-tokens", "abc"),
        ("--prefill-batch", "0"),
        ("--decode-batch", "1,x"),
        ("--decode-context", ""),
        ("--token-range", "9:3"),
    ],
)
def test_a_bad_grid_value_is_refused_naming_its_flag(flag: str, value: str, tmp_path: Path) -> None:
    """Before: "Invalid value: want comma-separated integers", no flag named."""

    out = tmp_path / "out"
    r = CliRunner().invoke(profile, ["--worker", "127.0.0.1:1", "--out", str(out), flag, value])
    assert r.exit_code == 2, r.output
    assert f"Invalid value for {flag}:" in r.output


@pytest.mark.parametrize("text", ["a,b\n", "\xd0\xd0\n"])
def test_samples_that_do_not_parse_are_refused_naming_the_flag(tmp_path: Path, text: str) -> None:
    # a ValueError / UnicodeDecodeError traceback
    src = tmp_path / "samples.csv"
    src.write_bytes(text.encode("latin-1"))
    r = CliRunner().invoke(profile, ["--from-samples", str(src), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert "--from-samples" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


@pytest.mark.parametrize(
    "flag",
    [
        ["--worker", "127.0.0.1:1"],
        ["--repeats", "5"],
        ["--prefill-tokens", "64"],
        ["--set-mixed"],
        ["--method", "outside"],
        ["--seed", "3"],
    ],
)
def test_measuring_flags_beside_from_samples_are_refused(tmp_path: Path, flag: list[str]) -> None:
    # nothing is measured: the flag was ignored without a word
    src = tmp_path / "samples.csv"
    src.write_text("\n".join(samples_csv(_samples())) + "\n")
    r = CliRunner().invoke(
        profile, ["--from-samples", str(src), "--out", str(tmp_path / "o"), *flag]
    )
    assert r.exit_code == 2, r.output
    assert flag[0] in r.output
    assert not (tmp_path / "o").exists()


def test_every_measuring_name_is_a_profile_parameter() -> None:
    from splitserve.cli.profile import _MEASURING

    assert {p.name for p in profile.params} >= _MEASURING


def test_tls_dir_beside_from_samples_is_refused(tmp_path: Path) -> None:
    """A rebuild calls no worker: --tls-dir was accepted and did nothing (profiling.md says only
    --out, --holdout-every and --log-level act on a rebuild)."""
    import datetime as dt

    from splitserve.security.ca import local_pki

    d = _profile_dir(tmp_path, LIVE)
    pki = local_pki(tmp_path / "pki", "svc", now=dt.datetime.now(dt.UTC))
    argv = ["--from-samples", str(d / "samples.csv"), "--out", str(tmp_path / "o")]
    prior = os.environ.get(TLS_ENV)
    try:
        r = CliRunner().invoke(profile, [*argv, "--tls-dir", str(pki["admin"])])
    finally:  # the option configures this process's TLS as it parses: undo it for later tests
        tls.configure(None)
        if prior is None:
            os.environ.pop(TLS_ENV, None)
        else:
            os.environ[TLS_ENV] = prior
    assert r.exit_code == 2, r.output
    assert "--tls-dir" in r.output


def test_an_out_it_cannot_make_is_refused_before_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """The directory was made after the measurement: a traceback, and the samples lost."""
    import splitserve.cli.profile as cli_profile

    def measured(*_: object, **__: object) -> None:
        raise AssertionError("measured before --out was made")

    monkeypatch.setattr(cli_profile, "profile_worker", measured)
    # /proc passes `OutDir`'s check for root (writable by access()) yet makes no directory
    out = "/proc/splitserve-no-such-dir"
    r = CliRunner().invoke(profile, ["--worker", "127.0.0.1:1", "--out", out])
    assert r.exit_code == 2, r.output
    assert "--out" in r.output


def _edit(row: str, column: str, value: str) -> str:
    from splitserve.core.perf.samples import SAMPLE_COLUMNS

    parts = row.split(",")
    parts[SAMPLE_COLUMNS.index(column)] = value
    return ",".join(parts)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("seconds", "nan"),  # the row was dropped without a word
        ("seconds", "inf"),
        ("seconds", "-0.01"),
        ("spread_s", "nan"),
        ("batch_size", "-4"),  # a cell of its own, '16 samples in 9 cells' from 8
        ("batch_size", "0"),
        ("prompt_tokens", "0"),
        ("rep", "-1"),
        ("new_tokens", "999"),  # derived from chunks / contexts: a changed value was ignored
        ("prefill_work", "1.5"),
        ("decode_context_sum", "7"),
        ("chunks", "-64:0"),
        ("chunks", "64:x"),
    ],
)
def test_a_sample_with_a_bad_value_is_refused_naming_its_line_and_column(
    tmp_path: Path, column: str, value: str
) -> None:
    d = _profile_dir(tmp_path, None)
    lines = (d / "samples.csv").read_text().splitlines()
    lines[1] = _edit(lines[1], column, value)  # line 2: a prefill sample (1 x 64)
    (d / "samples.csv").write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(profile, ["--from-samples", str(d / "samples.csv"), "--out", str(d)])
    assert r.exit_code == 2, r.output
    assert "--from-samples" in r.output
    assert f"line 2: {column}" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_a_decode_sample_with_contexts_other_than_its_batch_is_refused(tmp_path: Path) -> None:
    d = _profile_dir(tmp_path, None)
    lines = (d / "samples.csv").read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("decode,4,"))
    lines[at] = _edit(_edit(lines[at], "contexts", "64;64"), "decode_context_sum", "128")
    (d / "samples.csv").write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(profile, ["--from-samples", str(d / "samples.csv"), "--out", str(d)])
    assert r.exit_code == 2, r.output
    assert f"line {at + 1}: contexts" in r.output


@pytest.mark.parametrize("text", ["", "kind,batch_size\n# nothing\n"])
def test_a_samples_file_without_samples_is_refused_naming_it(tmp_path: Path, text: str) -> None:
    # was exit 1: "cannot build a table: no usable samples (all empty or non-positive)"
    src = tmp_path / "samples.csv"
    src.write_text(text)
    r = CliRunner().invoke(profile, ["--from-samples", str(src), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert "holds no samples" in r.output
    assert "samples.csv" in r.output


def test_samples_that_all_took_no_time_are_kept_and_the_reason_is_said(tmp_path: Path) -> None:
    """A sim worker started with --sim-time-scale 0 prices every step 0 s: the live run measured
    every cell, then failed with 'cannot build a table: no usable samples (all empty or
    non-positive)' and wrote nothing, the measurement lost."""
    import click

    from splitserve.cli.profile import _write
    from splitserve.worker.profiler import ProfileStats

    zero = [dataclasses.replace(m, seconds=0.0) for m in _samples()]
    out = tmp_path / "out"
    out.mkdir()
    steps = [(1, 10.0, 0.0, BatchShape(decode_contexts=(64,)))]
    with pytest.raises(click.ClickException) as err:
        _write(out, zero, "worker x", ProfileStats(), 4, steps=steps)
    assert "took 0 s" in err.value.message
    assert "--sim-time-scale 0" in err.value.message
    assert str(out / "samples.csv") in err.value.message
    assert len((out / "samples.csv").read_text().splitlines()) == len(zero) + 1
    assert (out / "steps.csv").exists()


def test_the_run_s_notes_are_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cell the engine never ran as one step (its probes rejected every time) was left out
    of the table with '2 samples in 2 cells' on the console and the reason only in fit.json."""
    from splitserve.cli.profile import _write
    from splitserve.worker.profiler import ProfileStats

    stats = ProfileStats(notes=["prefill probe 1x4096 (rep 0) rejected 4 times"])
    out = tmp_path / "out"
    out.mkdir()
    _write(out, _samples(), "worker x", stats, 4)
    printed = capsys.readouterr().out
    assert "note: prefill probe 1x4096 (rep 0) rejected 4 times" in printed
