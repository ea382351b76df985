"""Learning finished lengths from step views (the policy side of predictor feedback).

`EngineModel` reports every finished request with its true output length in
`StepView.finished` (exact also for requests that finish at the end of a fused decode run). A
`FinishTracker` passes those on; once it has seen one such report it trusts only them.

Views built by hand (tests, other drivers) carry no reports, so until one arrives the tracker
infers finishes from consecutive views: a sequence whose chunk last step reached all its known
tokens (so the engine sampled one more token) and that is absent from the next view (neither
running nor waiting) finished with one token more than it had. That inference is exact when steps
are not fused and under-counts with fused runs; prompt-only sequences are skipped (on a prefill
worker they leave to hold KV, not because they finished). Either way the sequences that finish
in the very last step are never reported, as no later decision follows.

Invariant tested (tests/unit/policy/batching/test_pastfuture.py, test_engine_finish.py): over a
whole engine run the reported lengths are exactly the true ones, bar the last step's finishers,
fused runs included.
"""

from __future__ import annotations

from collections.abc import Iterable

from splitserve.core.ids import RequestId
from splitserve.policy.batching.base import StepView


class FinishTracker:
    def __init__(self) -> None:
        self._pending: dict[RequestId, tuple[int, int]] = {}
        """Sequences whose chunk reached their known tokens last step -> (prompt, outputs)."""
        self.engine_reports = False
        """True once a view carried `StepView.finished`: inference is off from then on."""

    def finished(self, view: StepView) -> list[tuple[int, int]]:
        """(prompt tokens, output tokens) of the sequences that finished since the last step."""
        if view.finished:
            self.engine_reports = True
            self._pending = {}
            return [(f.num_prompt_tokens, f.num_output_tokens) for f in view.finished]
        if self.engine_reports or not self._pending:
            return []
        present = {s.id for s in view.running}
        present.update(s.id for s in view.waiting)
        return [(p, o + 1) for rid, (p, o) in self._pending.items() if rid not in present]

    def scheduled(self, view: StepView, chunks: Iterable[tuple[RequestId, int]]) -> None:
        """Remember which sequences this step's chunks complete (inference mode only)."""
        if self.engine_reports:
            return
        by_id = {s.id: s for s in view.running}
        by_id.update((s.id, s) for s in view.waiting)
        pending: dict[RequestId, tuple[int, int]] = {}
        for rid, n in chunks:
            s = by_id[rid]
            if n > 0 and n == s.num_uncomputed_tokens and s.num_output_tokens:
                pending[rid] = (s.num_prompt_tokens, s.num_output_tokens)
        self._pending = pending
