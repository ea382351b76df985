"""SLO classes at run time: deadlines, the router's EDF admission queue, and who is shed.

Pure (no I/O, no clock): times are plain `now_s` values from the owner's one injected clock.

* `classes`: `SloPolicyClass` (a class's targets, priority, sheddability), `SloClassTable`
  (resolve a request's class name and bounded per-request overrides);
* `deadlines`: `Deadlines` (absolute TTFT / completion deadlines and the TPOT target of one
  request), `deadlines_for`;
* `queue`: `EdfQueue`, the bounded earliest-deadline-first queue (priority first) that never
  evicts a non-sheddable entry while a sheddable one is queued;
* `gate`: `AdmissionGate`, the decision at arrival and at each release (admit / queue / shed /
  reject) from the predicted wait against each request's deadline;
* `room`: `has_room`, `backlog_s`, `at_percentile`, `prefill_side`, the room / backlog
  arithmetic both edges of the gate share (the live router and the simulator's model of it).
"""

from splitserve.policy.admission.classes import (
    OVERRIDE_FACTOR,
    SloClassTable,
    SloOverrides,
    SloPolicyClass,
    UnknownSloClass,
)
from splitserve.policy.admission.deadlines import Deadlines, deadlines_for
from splitserve.policy.admission.gate import AdmissionGate, GateParams, Outcome, Verdict
from splitserve.policy.admission.queue import EdfQueue, Entry, rank_key
from splitserve.policy.admission.room import (
    RateOf,
    at_percentile,
    backlog_s,
    has_room,
    prefill_side,
)

__all__ = [
    "OVERRIDE_FACTOR",
    "AdmissionGate",
    "Deadlines",
    "EdfQueue",
    "Entry",
    "GateParams",
    "Outcome",
    "RateOf",
    "SloClassTable",
    "SloOverrides",
    "SloPolicyClass",
    "UnknownSloClass",
    "Verdict",
    "at_percentile",
    "backlog_s",
    "deadlines_for",
    "has_room",
    "prefill_side",
    "rank_key",
]
