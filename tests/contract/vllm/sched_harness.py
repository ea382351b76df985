"""Build vLLM's real V1 scheduler on CPU without a model runner, and drive it step by step.

Mirrors vLLM's own `tests/v1/core/utils.py:create_scheduler` (not shipped in the wheel). The
model's work is faked: a request that reached the end of its known tokens samples one token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StepOut:
    """What one `schedule()` call scheduled, in comparable form."""

    tokens: tuple[tuple[str, int], ...]
    new: tuple[str, ...]
    resumed: tuple[str, ...]
    preempted: tuple[str, ...]
    finished: tuple[str, ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.tokens)


def make_scheduler(
    model_dir: Path,
    scheduler_cls: type[Any] | None = None,
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    num_blocks: int = 64,
    block_size: int = 16,
    max_model_len: int = 512,
    enable_prefix_caching: bool = False,
    additional_config: dict[str, Any] | None = None,
) -> Any:
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(
        model=str(model_dir),
        dtype="float32",
        seed=0,
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        additional_config=additional_config or {},
    )
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    cache_config.num_gpu_blocks = num_blocks
    cls = scheduler_cls or Scheduler
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=True,
    )


def make_request(
    rid: str,
    num_prompt_tokens: int,
    max_tokens: int = 4,
    *,
    arrival: float = 0.0,
    priority: int = 0,
    kv_transfer_params: dict[str, Any] | None = None,
    block_size: int = 16,
    shared_prefix: int = 0,
) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    if kv_transfer_params is not None:
        params.extra_args = {"kv_transfer_params": kv_transfer_params}
    base = 3 + (sum(map(ord, rid)) % 50)
    return Request(
        request_id=rid,
        prompt_token_ids=[2] * shared_prefix + [base + (i % 7) for i in range(num_prompt_tokens)],
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival,
        priority=priority,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


@dataclass
class _Scheduled:
    out: Any
    runner_out: Any


def _schedule(sched: Any) -> _Scheduled:
    from vllm.v1.outputs import ModelRunnerOutput

    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in ids:
        req = sched.requests[rid]
        # schedule() already advanced num_computed_tokens by the scheduled chunk: a chunk that
        # reaches the end of the known tokens samples one.
        done = req.num_computed_tokens >= req.num_tokens
        sampled.append([10 + (len(req.output_token_ids) % 5)] if done else [])
    runner_out = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
    )
    return _Scheduled(out, runner_out)


def _finish(sched: Any, step: _Scheduled) -> StepOut:
    out = step.out
    engine_outs = sched.update_from_output(out, step.runner_out)
    finished = tuple(
        o.request_id
        for eco in engine_outs.values()
        for o in eco.outputs
        if o.finish_reason is not None
    )
    resumed = getattr(out.scheduled_cached_reqs, "resumed_req_ids", ())
    return StepOut(
        tokens=tuple(out.num_scheduled_tokens.items()),
        new=tuple(r.req_id for r in out.scheduled_new_reqs),
        resumed=tuple(sorted(resumed)),
        preempted=tuple(sorted(out.preempted_req_ids or ())),
        finished=finished,
    )


def step(sched: Any) -> StepOut:
    """One `schedule()` + fake model output + `update_from_output()`."""
    return _finish(sched, _schedule(sched))


def run(
    sched: Any,
    arrivals: Sequence[tuple[int, Any]],
    max_steps: int = 200,
    *,
    overlap: bool = False,
) -> list[StepOut]:
    """Add each request at its step number, step until everything finished.

    `overlap`: schedule step N+1 before step N's output is applied, as vLLM's engine core does
    with async scheduling (batch queue of 2), so output placeholders are in play.
    """
    pending = sorted(arrivals, key=lambda a: a[0])
    outs: list[StepOut] = []
    in_flight: _Scheduled | None = None
    for i in range(max_steps):
        while pending and pending[0][0] <= i:
            sched.add_request(pending.pop(0)[1])
        if not pending and not sched.has_requests() and in_flight is None:
            return outs
        scheduled = _schedule(sched)
        if not overlap:
            outs.append(_finish(sched, scheduled))
            continue
        if in_flight is not None:
            outs.append(_finish(sched, in_flight))
        in_flight = scheduled if scheduled.out.total_num_scheduled_tokens else None
        if in_flight is None and scheduled.out.total_num_scheduled_tokens == 0:
            outs.append(_finish(sched, scheduled))
    raise AssertionError(f"not finished after {max_steps} steps")
