"""`GrammarCatchUp`: a decode's grammar is advanced past the prefill's first token (a takeover's
past the tokens already sent) before the scheduler builds the first token bitmask, once vLLM has
compiled the grammar (fake scheduler), keyed by vLLM's internal request id."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from splitserve.core.ids import RequestId
from splitserve.core.request import Request, SamplingSpec
from splitserve.router import messages
from splitserve.worker.server import sampling_from_pb
from splitserve.worker.vllm_adapter.guided import (
    GENERATED_KEY,
    GrammarCatchUp,
    accepted_tokens,
    structured_params,
)


@dataclass
class _Grammar:
    accepted: list[tuple[str, list[int]]] = field(default_factory=list)

    def accept_tokens(self, rid: str, tokens: list[int]) -> bool:
        self.accepted.append((rid, tokens))
        return True


@dataclass
class _SoRequest:
    grammar: Any = None


@dataclass
class _Req:
    structured_output_request: _SoRequest | None


class _Sched:
    def __init__(self) -> None:
        self.requests: dict[str, _Req] = {}
        self.calls: list[list[tuple[str, list[int]]]] = []
        self.grammar = _Grammar()

    def get_grammar_bitmask(self, _out: Any) -> str:
        self.calls.append(list(self.grammar.accepted))  # what was accepted when it ran
        return "bitmask"


def test_the_first_token_is_accepted_before_the_first_bitmask() -> None:
    sched = _Sched()
    catch_up = GrammarCatchUp.install(sched)
    so = _SoRequest()
    sched.requests["r"] = _Req(so)
    sched.requests["plain"] = _Req(None)
    catch_up.expect("r", [42])
    catch_up.expect("plain", [1])
    catch_up.expect("gone", [2])
    assert sched.get_grammar_bitmask(None) == "bitmask"
    assert sched.calls == [[]]  # grammar still compiling: nothing yet, still pending
    assert catch_up.num_pending == 1
    so.grammar = sched.grammar
    sched.get_grammar_bitmask(None)
    assert sched.calls[-1] == [("r", [42])]  # accepted before the bitmask was built
    sched.get_grammar_bitmask(None)
    assert sched.grammar.accepted == [("r", [42])]  # once
    assert catch_up.num_pending == 0


def test_no_structured_outputs_is_none() -> None:
    assert structured_params("") is None


class _Engine:
    """vLLM's `LLMEngine.add_request`: the scheduler gets the id plus a random suffix."""

    def __init__(self, sched: _Sched) -> None:
        self.sched = sched

    def add_request(self, request_id: str, _prompt: Any, _params: Any) -> str:
        internal = f"{request_id}-1a2b3c4d"
        self.sched.requests[internal] = _Req(_SoRequest(self.sched.grammar))
        return internal


def test_the_catch_up_is_keyed_by_vllms_internal_request_id() -> None:
    """The cause of the P/D grammar restarting: keyed by our id, the catch-up found no request
    in the scheduler and dropped it as aborted."""
    sched = _Sched()
    catch_up = GrammarCatchUp.install(sched)
    engine = _Engine(sched)
    assert catch_up.add_request(engine, "req", {}, None, [7]) == "req-1a2b3c4d"
    assert catch_up.add_request(engine, "plain", {}, None, ()) == "plain-1a2b3c4d"
    assert catch_up.num_pending == 1  # nothing to accept for a request that does not continue
    sched.get_grammar_bitmask(None)
    assert sched.calls == [[("req-1a2b3c4d", [7])]]
    assert catch_up.num_pending == 0


def _request(spec: str, prompt: tuple[int, ...] = (5, 6, 7, 8)) -> Request:
    return Request(RequestId("r"), prompt, SamplingSpec(max_tokens=4, structured_outputs=spec), 0)


def test_tokens_the_grammar_accepts_before_sampling() -> None:
    guide = json.dumps({"regex": "[a-z]+"})
    assert accepted_tokens(_request(guide), "prefill") == ()
    assert accepted_tokens(_request(guide), "generate") == ()
    assert accepted_tokens(_request(guide), "decode") == (8,)  # the prefill's first token
    assert accepted_tokens(_request(""), "decode") == ()  # no grammar
    # A takeover after a failed decode: the router's generate message says how many it sent.
    req = Request(RequestId("r"), (1, 2), SamplingSpec(max_tokens=6, structured_outputs=guide), 0)
    takeover = messages.generate(req, [3, 4])
    assert json.loads(takeover.sampling.structured_outputs) == {
        "regex": "[a-z]+",
        GENERATED_KEY: 2,
    }
    continued = sampling_from_pb(takeover.sampling)
    again = Request(RequestId("r"), tuple(takeover.prompt_token_ids), continued, 0)
    assert accepted_tokens(again, "generate") == (3, 4)
    assert messages.generate(req).sampling.structured_outputs == guide  # not a takeover
    plain = Request(RequestId("p"), (1, 2), SamplingSpec(max_tokens=6), 0)
    assert messages.generate(plain, [3]).sampling.structured_outputs == ""
    assert messages.GUIDE_GENERATED_KEY == GENERATED_KEY


@pytest.mark.parametrize("n", [4, -1, "2", True])
def test_a_bad_takeover_count_is_a_value_error(n: object) -> None:
    with pytest.raises(ValueError, match=GENERATED_KEY):
        accepted_tokens(_request(json.dumps({"regex": "a", GENERATED_KEY: n})), "generate")
