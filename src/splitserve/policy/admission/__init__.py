"""SLO classes at run time: deadlines, the router's EDF admission queue, and who is shed.

Pure (no I/O, no clock): times are plain `now_s` values from the owner's one injected clock.

* `classes`: `SloPolicyClass` (a class's targets, priority, sheddability), `SloClassTable`
  (resolve a request's class name and bounded per-request overrides);
* `deadlines`: `Deadlines` (absolute TTFT / completion deadlines and the TPOT target of one
  request), `deadlines_for`;
* `queue`: `EdfQueue`, the bounded earliest-deadline-first queue (priority first) that never
  evicts a non-sheddable entry while a sheddable one is queued;
* `gate`: `AdmissionGate`, the decision at arrival and at each release (admit / queue / shed /
  reject) from the predicted wait against each request's deadline.
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

__all__ = [
    "OVERRIDE_FACTOR",
    "AdmissionGate",
    "Deadlines",
    "EdfQueue",
    "Entry",
    "GateParams",
    "Outcome",
    "SloClassTable",
    "SloOverrides",
    "SloPolicyClass",
    "UnknownSloClass",
    "Verdict",
    "deadlines_for",
    "rank_key",
]
