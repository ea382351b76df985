"""Parity: each paper's placement plugin runs live in the router as the very object the simulator
builds for that paper (same type, same parameters), its per-worker inputs read from the router's
ledger; and the ledger answers those inputs from the requests the router placed."""

from __future__ import annotations

from typing import Any

import pytest

from splitserve.core.ids import EndpointId, RequestId
from splitserve.core.roles import Role
from splitserve.policy.placement import (
    EndpointView,
    PdDeciderParams,
    Profile,
    ProfileSpec,
    RequestView,
    build_profile,
)
from splitserve.policy.placement.aladdin import AladdinPacking
from splitserve.policy.placement.filters import RoleIn
from splitserve.policy.placement.splitwise import SplitwiseDecider
from splitserve.policy.placement.tetriinfer import HeavyLightMix, TetriPowerOfTwo
from splitserve.router.ledger import Ledger
from splitserve.router.profiles import PROFILES, build_decider, profile_specs
from splitserve.sim.reproductions.aladdin_cluster import AladdinLoads, split_spec
from splitserve.sim.reproductions.splitwise_cluster import A100, splitwise_spec
from splitserve.sim.reproductions.tetriinfer_cluster import RoutedMix, tetriinfer_spec
from tests.unit.sim.builders import tiny_template as template


def _plugins(profile: Profile) -> list[Any]:
    """Every plugin but the role filter (the router's decode side also takes MIXED workers)."""
    filters = [f for f in profile.filters if not isinstance(f, RoleIn)]
    return [*filters, *(ws.scorer for ws in profile.scorers), profile.picker]


def _same(router: ProfileSpec, sim: ProfileSpec) -> None:
    r, s = build_profile(router), build_profile(sim)
    assert [type(p) for p in _plugins(r)] == [type(p) for p in _plugins(s)]
    assert _plugins(r) == _plugins(s)  # dataclass equality: every parameter but the inputs
    assert [ws.weight for ws in r.scorers] == [ws.weight for ws in s.scorers]


def test_tetriinfer_parity() -> None:
    ledger = Ledger()
    decode, _ = profile_specs("tetriinfer", ledger)
    sim = tetriinfer_spec(template(), template(), mix=RoutedMix())
    _same(decode, sim.decode_profile)
    [scorer] = build_profile(decode).scorers
    assert isinstance(scorer.scorer, TetriPowerOfTwo)
    assert scorer.scorer.mix_of == ledger.mix_of


def test_splitwise_parity() -> None:
    ledger = Ledger()
    decode, prefill = profile_specs("splitwise", ledger)
    sim = splitwise_spec(A100, A100, 1, 1)
    _same(decode, sim.decode_profile)
    _same(prefill, sim.prefill_profile)
    decider = build_decider("splitwise", ledger, PdDeciderParams())
    assert isinstance(decider, SplitwiseDecider)


def test_aladdin_parity() -> None:
    ledger = Ledger()
    decode, _ = profile_specs("aladdin", ledger)
    sim = split_spec(template(), 1, template(), 1, "aladdin", loads=AladdinLoads())
    _same(decode, sim.decode_profile)
    [scorer] = build_profile(decode).scorers
    assert isinstance(scorer.scorer, AladdinPacking)
    assert scorer.scorer.load_of == ledger.load_of


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_builds_and_places(name: str) -> None:
    ledger = Ledger()
    decider = build_decider(name, ledger, PdDeciderParams())
    eps = [
        EndpointView(EndpointId(f"d{i}"), Role.DECODE, kv_free_blocks=100, kv_total_blocks=100)
        for i in range(2)
    ] + [EndpointView(EndpointId("p0"), Role.PREFILL, kv_free_blocks=100, kv_total_blocks=100)]
    placed = decider.place(RequestView(RequestId("r"), 64, 16), eps)
    assert placed.decode
    assert placed.decode[0].startswith("d")


def test_unknown_profile_is_a_config_error() -> None:
    from splitserve.core.errors import ConfigError

    with pytest.raises(ConfigError, match="placementProfile"):
        profile_specs("nope", Ledger())


def test_ledger_answers_the_plugins_inputs() -> None:
    ledger = Ledger(heavy_threshold_tokens=128)
    d = EndpointId("d")
    ledger.reserve(
        d, "a", prefill=False, num_prompt_tokens=32, predicted_output_tokens=200, block_size=16
    )
    ledger.reserve(
        d, "b", prefill=False, num_prompt_tokens=16, predicted_output_tokens=10, block_size=16
    )
    ledger.reserve(
        EndpointId("p"),
        "a",
        prefill=True,
        num_prompt_tokens=32,
        predicted_output_tokens=200,
        block_size=16,
    )
    assert ledger.mix_of(d) == HeavyLightMix(1, 1)
    assert ledger.reserved_of(d) == 15 + 2  # ceil(232/16) + ceil(26/16)
    assert ledger.reserved(d).requests == 2
    assert ledger.reserved(EndpointId("p")).prefill_tokens == 32
    ledger.start(EndpointId("p"), "a")
    assert ledger.prefill_tokens(EndpointId("p")) == 32  # running prefills still count
    ledger.start(d, "a")
    ledger.progress(d, "a", 50)
    assert ledger.reserved(d).requests == 1  # started work is the worker's to report
    load = ledger.load_of(d)
    assert sorted(r.num_generated_tokens for r in load.requests) == [0, 50]
    ledger.drop(d, "a")
    ledger.drop(d, "b")
    assert ledger.mix_of(d) == HeavyLightMix()
    assert list(ledger.entries(d)) == []
