"""Learning finished lengths from consecutive step views (the policy side of predictor feedback).

`SeqView` carries no finish signal, so a policy that must learn output lengths infers them: a
sequence whose chunk last step reached all its known tokens (so the engine sampled one more
token) and that is absent from the next view (neither running nor waiting) finished with one token
more than it had. Exact when the engine does not fuse steps (`EngineModel.schedule(now,
max_repeat=1)`); with fused decode runs it under-counts. Prompt-only sequences are skipped (on a
prefill worker they leave to hold KV, not because they finished). The sequences that finish in
the very last step are never reported, as no later view shows them gone.

Invariant tested (tests/unit/policy/batching/test_pastfuture.py): over a whole engine run the
reported lengths are exactly the true ones, bar the last step's finishers.
"""

from __future__ import annotations

from collections.abc import Iterable

from splitserve.core.ids import RequestId
from splitserve.policy.batching.base import StepView


class FinishTracker:
    def __init__(self) -> None:
        self._pending: dict[RequestId, tuple[int, int]] = {}
        """Sequences whose chunk reached their known tokens last step -> (prompt, outputs)."""

    def finished(self, view: StepView) -> list[tuple[int, int]]:
        """(prompt tokens, output tokens) of the sequences that finished since the last step."""
        if not self._pending:
            return []
        present = {s.id for s in view.running}
        present.update(s.id for s in view.waiting)
        return [(p, o + 1) for rid, (p, o) in self._pending.items() if rid not in present]

    def scheduled(self, view: StepView, chunks: Iterable[tuple[RequestId, int]]) -> None:
        """Remember which sequences this step's chunks complete."""
        by_id = {s.id: s for s in view.running}
        by_id.update((s.id, s) for s in view.waiting)
        pending: dict[RequestId, tuple[int, int]] = {}
        for rid, n in chunks:
            s = by_id[rid]
            if n > 0 and n == s.num_uncomputed_tokens and s.num_output_tokens:
                pending[rid] = (s.num_prompt_tokens, s.num_output_tokens)
        self._pending = pending
