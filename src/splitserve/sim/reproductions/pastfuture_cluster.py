"""A token-level engine driver: the Past-Future paper's Table-1 protocol on our engine model.

Owns: running one `EngineModel` (the same pure engine and step policy the live system runs) with
an infinite backlog and no clock, counting decode steps, preemptions and KV use, as the authors'
artifact simulator does (WuSiYu/lightllm-ae `behavior-analysis/`, research/seed-pastfuture-alise.md
§A.9). Time is the step index; a step costs one unit whatever it runs, and only steps that decode
count as decode steps (prefill and recompute ride along in the same step, so evictions cost no
decode steps, as in the artifact).

The backlog is fed lazily: the engine holds at most `backlog` waiting requests, topped up in
arrival order, which is equivalent for FCFS admission (only the head can be admitted) and keeps a
step's view small. Truth stays on the request (`max_tokens` = the true output length, stop
tokens never match), so a policy that must not know lengths must not read it (Past-Future's
`max_output_tokens`).

Invariants tested (tests/unit/sim/test_repro_pastfuture.py): every request finishes; blocks
are all free at the end; the metrics are deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from splitserve.core.ids import RequestId
from splitserve.core.kv import BlockManager
from splitserve.core.request import Request, SamplingSpec
from splitserve.policy.batching.base import BatchingPolicy
from splitserve.policy.batching.engine import EngineModel, RequestMode


@dataclass(frozen=True, slots=True)
class TokenRun:
    num_requests: int
    decode_steps: int
    preemptions: int
    mean_used_fraction: float
    """Mean over decode steps of KV slots held / capacity (the paper's "current consumed")."""

    @property
    def evicted_per_finished(self) -> float:
        return self.preemptions / self.num_requests if self.num_requests else 0.0


def run_token_level(
    policy: BatchingPolicy,
    lengths: Sequence[tuple[int, int]],
    capacity_tokens: int,
    block_size: int = 1,
    backlog: int = 16,
) -> TokenRun:
    """Run (prompt, output) requests to completion under `policy`; see the module docstring."""
    blocks = BlockManager(-(-capacity_tokens // block_size), block_size)
    engine = EngineModel(policy, blocks, None)
    fed = 0
    fresh: set[RequestId] = set()
    """Fed and never scheduled yet: the backlog window."""
    finished = 0
    decode_steps = 0
    used_sum = 0.0
    now = 0.0
    total = blocks.num_blocks
    while finished < len(lengths):
        while len(fresh) < backlog and fed < len(lengths):
            prompt, output = lengths[fed]
            request = Request(
                RequestId(f"r{fed}"),
                (0,) * prompt,
                SamplingSpec(max_tokens=output, ignore_eos=True),
                arrival_s=float(fed),
            )
            engine.add(request, RequestMode.GENERATE)
            fresh.add(request.id)
            fed += 1
        step = engine.schedule(now)
        if step is None:
            raise RuntimeError("the policy left the engine idle with work pending")
        fresh.difference_update(rid for rid, _ in step.decision.chunks)
        if step.batch.decode_contexts:
            decode_steps += 1
            used_sum += (total - blocks.num_free) / total
        now += 1.0
        result = engine.complete(step, now)
        finished += len(result.finished)
    if blocks.num_free != blocks.num_blocks:
        raise RuntimeError("blocks still held after every request finished")
    return TokenRun(
        len(lengths),
        decode_steps,
        engine.num_preemptions,
        used_sum / decode_steps if decode_steps else 0.0,
    )
