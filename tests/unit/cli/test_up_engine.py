"""`splitserve up` engine arguments: pass-through after `--`, the local CPU dtype, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from splitserve.cli.up import up
from splitserve.cli.up_engine import (
    EngineArgsError,
    bf16_pd_warning,
    chosen_dtype,
    host_cpu_flags,
    vllm_engine_args,
)

SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
ZEN3 = {"avx2", "fma", "f16c"}


def test_float32_is_added_when_no_dtype_is_named() -> None:
    assert vllm_engine_args([]) == ["--dtype", "float32"]
    assert vllm_engine_args(["--max-num-seqs", "8"]) == [
        "--max-num-seqs",
        "8",
        "--dtype",
        "float32",
    ]


@pytest.mark.parametrize(
    "args", [["--dtype", "bfloat16"], ["--dtype=bfloat16"], ["--enforce-eager", "--dtype", "bf16"]]
)
def test_a_named_dtype_is_kept(args: list[str]) -> None:
    out = vllm_engine_args(args)
    assert out == args
    assert chosen_dtype(out) in ("bfloat16", "bf16")


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--max-model-len", "9"], "--max-model-len"),
        (["--max_model_len=9"], "--max-model-len"),
        (["--served-model-name", "x"], "--served-model-name"),
        (["--tokenizer", "/t"], "--tokenizer"),
    ],
)
def test_arguments_up_sets_itself_are_refused_naming_the_option(
    args: list[str], option: str
) -> None:
    with pytest.raises(EngineArgsError, match=option):
        vllm_engine_args(args)


def test_a_value_without_a_name_is_refused() -> None:
    with pytest.raises(EngineArgsError, match="--name"):
        vllm_engine_args(["bfloat16"])


def test_bf16_pd_on_an_amx_host_warns() -> None:
    warning = bf16_pd_warning(["--dtype", "bfloat16"], pd=True, cpu_flags=SAPPHIRE_RAPIDS)
    assert warning is not None
    assert "SIGILL" in warning
    assert "amx_bf16" in warning


@pytest.mark.parametrize(
    ("args", "pd", "flags"),
    [
        (["--dtype", "float32"], True, SAPPHIRE_RAPIDS),  # the chosen default
        (["--dtype", "bfloat16"], False, SAPPHIRE_RAPIDS),  # aggregated bf16 works
        (["--dtype", "bfloat16"], True, ZEN3),  # no AVX-512 / AMX
    ],
)
def test_no_warning_where_bf16_pd_is_not_at_risk(
    args: list[str], pd: bool, flags: set[str]
) -> None:
    assert bf16_pd_warning(args, pd=pd, cpu_flags=flags) is None


def test_host_cpu_flags_reads_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_tile\n\nprocessor\t: 1\n")
    assert host_cpu_flags(info) == {"fpu", "avx2", "amx_tile"}
    assert host_cpu_flags(tmp_path / "missing") == set()


def test_up_refuses_engine_args_for_the_sim_engine(tmp_path: Path) -> None:
    result = CliRunner().invoke(up, ["--run-dir", str(tmp_path), "--", "--dtype", "float32"])
    assert result.exit_code == 2
    assert "--engine vllm" in result.output


def test_up_refuses_engine_args_it_owns(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        up, ["--engine", "vllm", "--model", str(tmp_path), "--", "--max-model-len", "9"]
    )
    assert result.exit_code == 2
    assert "--max-model-len" in result.output
