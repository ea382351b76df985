"""Per-worker step policies and the engine model that runs them.

A step policy looks at a `StepView` (waiting and running sequences, free KV blocks) and returns a
`StepDecision` (which sequences run how many tokens this step, which are preempted). The
`EngineModel` applies decisions to its block ledger; it is shared by the simulated engine (real
clock) and the simulator (simulated clock).
"""

from splitserve.policy.batching.base import BatchingPolicy, SeqView, StepDecision, StepView
from splitserve.policy.batching.builtin import BATCHING, make_batching_policy
from splitserve.policy.batching.engine import EngineModel, SeqPhase, Step, StepResult, TokenEvent
from splitserve.policy.batching.fcfs import FcfsParams, FcfsPolicy

__all__ = [
    "BATCHING",
    "BatchingPolicy",
    "EngineModel",
    "FcfsParams",
    "FcfsPolicy",
    "SeqPhase",
    "SeqView",
    "Step",
    "StepDecision",
    "StepResult",
    "StepView",
    "TokenEvent",
    "make_batching_policy",
]
