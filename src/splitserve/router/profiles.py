"""The router's named placement profiles (`router.placementProfile`), built live over its ledger.

Each profile is the same `ProfileSpec` the simulator builds for the paper it reproduces, with the
per-worker inputs the plugins need (`mix_of`, `reserved_of`, `load_of`) read from the router's
own `Ledger` instead of the simulator's request table:

* `default`: least-loaded + KV headroom + SLO headroom (TTFT on prefill, TPOT on decode), ties
  taking turns (`fair-max-score`);
* `least-loaded`: the wave-1 router (least-loaded + KV headroom; pending prefill tokens);
* `tetriinfer`: decode by TetriInfer's power-of-two over the heavy:light mix;
* `splitwise`: Splitwise's prompt / token / mixed pools with JSQ, prompt machine = token machine
  runs whole (`SplitwiseDecider`);
* `aladdin`: Aladdin's best-fit bin packing against its ATGT / KV constraints;
* `past-future`: Past-Future's future-peak KV headroom, then least-loaded.
"""

from __future__ import annotations

from typing import Any, Final

from splitserve.core.errors import ConfigError
from splitserve.core.roles import Role
from splitserve.policy.placement import (
    PdDecider,
    PdDeciderParams,
    PluginSpec,
    ProfileSpec,
    build_profile,
    default_decode_profile,
    default_prefill_profile,
)
from splitserve.policy.placement.splitwise import SplitwiseDecider
from splitserve.router.ledger import Ledger

PROFILES: Final = ("default", "least-loaded", "tetriinfer", "splitwise", "aladdin", "past-future")


def _roles(*roles: Role) -> PluginSpec:
    return PluginSpec("role", params={"roles": frozenset(roles)})


def slo_decode_profile() -> ProfileSpec:
    return ProfileSpec(
        name="decode",
        filters=(PluginSpec("accepts-work"), _roles(Role.DECODE, Role.MIXED)),
        scorers=(
            PluginSpec("least-loaded", 1.0),
            PluginSpec("kv-headroom", 0.5),
            PluginSpec("slo-tpot-headroom", 1.0),
        ),
        picker=PluginSpec("fair-max-score"),
    )


def slo_prefill_profile() -> ProfileSpec:
    return ProfileSpec(
        name="prefill",
        filters=(PluginSpec("accepts-work"), _roles(Role.PREFILL)),
        scorers=(
            PluginSpec("pending-prefill-tokens", 1.0),
            PluginSpec("least-loaded", 0.5),
            PluginSpec("slo-ttft-headroom", 1.0),
        ),
        picker=PluginSpec("fair-max-score"),
    )


def _decode_with(scorers: tuple[PluginSpec, ...], name: str) -> ProfileSpec:
    return ProfileSpec(
        name=name,
        filters=(PluginSpec("accepts-work"), _roles(Role.DECODE, Role.MIXED)),
        scorers=scorers,
    )


def _splitwise(phase: str, ledger: Ledger) -> ProfileSpec:
    # As `sim.reproductions.splitwise_cluster._profile`, with the router's reserved KV.
    params: dict[str, Any] = {"phase": phase, "reserved_of": ledger.reserved_of}
    return ProfileSpec(
        name=f"splitwise-{phase}",
        filters=(PluginSpec("splitwise-pool", params=params),),
        scorers=(PluginSpec("splitwise-overflow", 1.0, params),),
    )


def profile_specs(name: str, ledger: Ledger) -> tuple[ProfileSpec, ProfileSpec]:
    """(decode profile, prefill profile) of a named profile.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    if name == "default":
        return slo_decode_profile(), slo_prefill_profile()
    if name == "least-loaded":
        return default_decode_profile(), default_prefill_profile()
    if name == "tetriinfer":
        p2c = {"mix_of": ledger.mix_of, "heavy_threshold_tokens": ledger.heavy_threshold_tokens}
        tetri = (PluginSpec("tetriinfer-p2c", 1.0, p2c),)
        return _decode_with(tetri, "tetriinfer-decode"), default_prefill_profile()
    if name == "splitwise":
        return _splitwise("token", ledger), _splitwise("prompt", ledger)
    if name == "aladdin":
        aladdin = (PluginSpec("aladdin-pack", 1.0, {"load_of": ledger.load_of}),)
        return _decode_with(aladdin, "aladdin-decode"), default_prefill_profile()
    if name == "past-future":
        scorers = (
            PluginSpec("pastfuture-peak-kv", 1.0, {"load_of": ledger.load_of}),
            PluginSpec("least-loaded", 0.5),
        )
        return _decode_with(scorers, "past-future-decode"), default_prefill_profile()
    raise ConfigError(
        f"router.placementProfile: unknown profile {name!r}; known: {', '.join(PROFILES)}"
    )


def build_decider(name: str, ledger: Ledger, params: PdDeciderParams) -> PdDecider:
    decode, prefill = profile_specs(name, ledger)
    cls = SplitwiseDecider if name == "splitwise" else PdDecider
    return cls(build_profile(decode), build_profile(prefill), params)
