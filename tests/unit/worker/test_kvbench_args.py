"""kvbench refuses bad numeric options before it starts anything: argparse's error naming the
flag, exit status 2 (a bad `--lengths` used to raise a traceback, and `--repeat 0` ran a bench
with no rows)."""

from __future__ import annotations

import pytest

from splitserve.worker.vllm_adapter import kvbench_runs

BAD = [
    (["--lengths", "abc"], "--lengths"),
    (["--lengths", "128,x"], "--lengths"),
    (["--lengths", "0"], "--lengths"),
    (["--lengths=-5"], "--lengths"),
    (["--runs", "sim", "--repeat", "0"], "--repeat"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--idle-s=-1"], "--idle-s"),
    (["--idle-s", "nan"], "--idle-s"),
    (["--fresh-pairs", "0"], "--fresh-pairs"),
    (["--fresh-requests", "0"], "--fresh-requests"),
    (["--fresh-length=-1"], "--fresh-length"),
    (["--raw-cold-mib=-2"], "--raw-cold-mib"),
    (["--streams", "0"], "--streams"),
    (["--long-len", "0"], "--long-len"),
    (["--long-every-s", "0"], "--long-every-s"),
    (["--duration-s", "0"], "--duration-s"),
    (["--duration-s", "inf"], "--duration-s"),
    (["--runs", "sim,bogus"], "--runs"),
    (["--fresh-variants", "window,x"], "--fresh-variants"),
    (["--pull-in-step", "--async-pull"], "--async-pull"),
]


@pytest.mark.parametrize(("argv", "flag"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_option_refused_naming_it(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def started(*_a: object, **_k: object) -> None:
        raise AssertionError("the bench started")

    monkeypatch.setattr(kvbench_runs, "bench_model", started)
    with pytest.raises(SystemExit) as exc:
        kvbench_runs.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err
    assert "Traceback" not in err


def test_good_values_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Valid values get past parsing (the run is stopped where it would build its model)."""

    class ReachedError(Exception):
        pass

    def reached(*_a: object, **_k: object) -> None:
        raise ReachedError

    monkeypatch.setattr(kvbench_runs, "bench_model", reached)
    with pytest.raises(ReachedError):
        kvbench_runs.main(
            ["--lengths", "1,2048", "--repeat", "1", "--idle-s", "0", "--raw-cold-mib=-1"]
        )
