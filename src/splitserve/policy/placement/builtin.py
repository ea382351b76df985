"""The built-in placement plugins, listed in one greppable place."""

from __future__ import annotations

from typing import Any

from splitserve.policy.registry import PluginRegistry

FILTERS: PluginRegistry[Any] = PluginRegistry("placement filter")
SCORERS: PluginRegistry[Any] = PluginRegistry("placement scorer")
PICKERS: PluginRegistry[Any] = PluginRegistry("placement picker")

FILTERS.add("accepts-work", "splitserve.policy.placement.filters:AcceptsWork")
FILTERS.add("role", "splitserve.policy.placement.filters:RoleIn")
FILTERS.add("kv-fits", "splitserve.policy.placement.filters:KvCanHoldPrompt")
SCORERS.add("least-loaded", "splitserve.policy.placement.scorers:LeastLoaded")
SCORERS.add("kv-headroom", "splitserve.policy.placement.scorers:KvHeadroom")
SCORERS.add(
    "pending-prefill-tokens", "splitserve.policy.placement.scorers:FewestPendingPrefillTokens"
)
PICKERS.add("max-score", "splitserve.policy.placement.pickers:MaxScore")
SCORERS.add("tetriinfer-p2c", "splitserve.policy.placement.tetriinfer:TetriPowerOfTwo")
FILTERS.add("splitwise-pool", "splitserve.policy.placement.splitwise:SplitwisePoolFilter")
SCORERS.add("splitwise-overflow", "splitserve.policy.placement.splitwise:SplitwiseOverflow")
SCORERS.add("aladdin-pack", "splitserve.policy.placement.aladdin:AladdinPacking")
SCORERS.add("slo-ttft-headroom", "splitserve.policy.placement.slo:TtftHeadroom")
SCORERS.add("slo-tpot-headroom", "splitserve.policy.placement.slo:TpotHeadroom")
SCORERS.add("pastfuture-peak-kv", "splitserve.policy.placement.pastfuture:FuturePeakKv")
PICKERS.add("fair-max-score", "splitserve.policy.placement.pickers:FairMaxScore")
