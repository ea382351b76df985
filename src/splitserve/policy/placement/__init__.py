"""Request placement: filters -> weighted scorers -> picker, per profile, and the P/D decider."""

from splitserve.policy.placement.base import (
    EndpointView,
    Filter,
    Path,
    Picker,
    Placement,
    RequestView,
    Scorer,
)
from splitserve.policy.placement.builtin import FILTERS, PICKERS, SCORERS
from splitserve.policy.placement.decider import Disaggregation, PdDecider, PdDeciderParams, why_none
from splitserve.policy.placement.profile import (
    PluginSpec,
    Profile,
    ProfileSpec,
    WeightedScorer,
    build_profile,
    default_decode_profile,
    default_prefill_profile,
)

__all__ = [
    "FILTERS",
    "PICKERS",
    "SCORERS",
    "Disaggregation",
    "EndpointView",
    "Filter",
    "Path",
    "PdDecider",
    "PdDeciderParams",
    "Picker",
    "Placement",
    "PluginSpec",
    "Profile",
    "ProfileSpec",
    "RequestView",
    "Scorer",
    "WeightedScorer",
    "build_profile",
    "default_decode_profile",
    "default_prefill_profile",
    "why_none",
]
