"""`FirstTokenAsOutput`: a decode's first token (the prefill's, its last prompt token) moves from
the prompt to the output of the model runner's request state before the persistent batch takes
it in, once, keyed by vLLM's internal id; `min_tokens` is restored on the runner's copy only.
Fakes stand in for vLLM's engine core, model runner and `CachedRequestState`."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from splitserve.worker.vllm_adapter.output_history import (
    MAX_PENDING,
    FirstTokenAsOutput,
    model_runner,
)


@dataclass
class _Params:
    min_tokens: int = 0
    presence_penalty: float = 0.0


@dataclass
class _State:  # the fields of vLLM's CachedRequestState this touches
    req_id: str
    prompt_token_ids: list[int] | None
    sampling_params: _Params | None
    output_token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_token_ids or ())


@dataclass
class _Batch:
    added: list[tuple[str, list[int], list[int], int]] = field(default_factory=list)

    def add_request(self, state: _State) -> int:
        prompt = list(state.prompt_token_ids or ())
        self.added.append(
            (state.req_id, prompt, list(state.output_token_ids), state.num_prompt_tokens)
        )
        return len(self.added) - 1


@dataclass
class _Runner:
    input_batch: _Batch
    seen: list[list[int]] = field(default_factory=list)

    def _update_states(self, scheduler_output: Any) -> None:
        self.seen.append(list(scheduler_output.scheduled_cached_reqs.num_output_tokens))


def _step(cached: dict[str, int], finished: tuple[str, ...] = ()) -> Any:
    """A SchedulerOutput's fields this reads: cached requests' output counts, finished ids."""
    reqs = SimpleNamespace(req_ids=list(cached), num_output_tokens=list(cached.values()))
    return SimpleNamespace(scheduled_cached_reqs=reqs, finished_req_ids=set(finished))


def _core(batch: Any) -> Any:
    runner = _Runner(batch)
    worker = SimpleNamespace(model_runner=runner)
    return SimpleNamespace(
        model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=worker))
    )


def test_the_first_token_becomes_output_once() -> None:
    batch = _Batch()
    seeded = FirstTokenAsOutput.install(_core(batch))
    assert seeded is not None
    seeded.expect("d-1abcdefgh")
    state = _State("d-1abcdefgh", [1, 2, 3, 42], _Params())
    assert batch.add_request(state) == 0  # through the wrapper
    assert batch.added == [("d-1abcdefgh", [1, 2, 3], [42], 3)]
    assert seeded.num_pending == 0
    # Re-added after a preemption: the same state, not moved again.
    state.output_token_ids.append(7)
    batch.add_request(state)
    assert batch.added[-1] == ("d-1abcdefgh", [1, 2, 3], [42, 7], 3)


def test_other_requests_are_untouched() -> None:
    batch = _Batch()
    seeded = FirstTokenAsOutput.install(_core(batch))
    assert seeded is not None
    seeded.expect("decode-x")
    batch.add_request(_State("generate-y", [5, 6], _Params()))
    assert batch.added == [("generate-y", [5, 6], [], 2)]
    assert seeded.num_pending == 1


def test_min_tokens_is_restored_on_the_runners_copy_only() -> None:
    batch = _Batch()
    seeded = FirstTokenAsOutput.install(_core(batch))
    assert seeded is not None
    scheduler_params = _Params(min_tokens=3)  # the decode's: one fewer than the request's 4
    state = _State("r", [1, 2, 9], scheduler_params)
    seeded.expect("r")
    batch.add_request(state)
    assert state.sampling_params is not scheduler_params
    assert state.sampling_params == _Params(min_tokens=4)
    assert scheduler_params.min_tokens == 3
    # Without min_tokens the params object is the scheduler's own.
    plain = _Params(presence_penalty=2.0)
    other = _State("s", [1, 9], plain)
    seeded.expect("s")
    batch.add_request(other)
    assert other.sampling_params is plain


def test_a_prompt_that_would_be_left_empty_is_not_moved() -> None:
    batch = _Batch()
    seeded = FirstTokenAsOutput.install(_core(batch))
    assert seeded is not None
    seeded.expect("one")
    batch.add_request(_State("one", [9], _Params()))
    assert batch.added == [("one", [9], [], 1)]


def test_pending_entries_are_bounded() -> None:
    seeded = FirstTokenAsOutput()
    for i in range(MAX_PENDING + 5):
        seeded.expect(f"r{i}")
    seeded.expect("none", 0)
    assert seeded.num_pending == MAX_PENDING
    state = _State("r0", [1, 2], _Params())  # among the oldest: dropped
    seeded.apply(copy.copy(state))
    assert state.output_token_ids == []


def test_the_runner_is_handed_the_moved_token_in_the_output_count_until_finished() -> None:
    """vLLM's runner trims a request's output list to the scheduler's count each step; the
    scheduler does not count the moved token, so the count handed to the runner includes it."""
    batch = _Batch()
    core = _core(batch)
    runner = core.model_executor.driver_worker.worker.model_runner
    seeded = FirstTokenAsOutput.install(core)
    assert seeded is not None
    runner._update_states(_step({"d": 1}))  # nothing moved yet: untouched
    seeded.expect("d")
    batch.add_request(_State("d", [1, 2, 42], _Params()))
    assert seeded.num_moved == 1
    runner._update_states(_step({"d": 1, "g": 3}))  # after token 2: [42, t2] in the runner
    runner._update_states(_step({"d": 2, "g": 4}))
    runner._update_states(_step({"g": 5}, finished=("d",)))
    assert runner.seen == [[1], [2, 3], [3, 4], [5]]
    assert seeded.num_moved == 0


def test_no_runner_in_this_process_installs_nothing() -> None:
    assert FirstTokenAsOutput.install(SimpleNamespace()) is None
    assert model_runner(SimpleNamespace(model_executor=None)) is None
