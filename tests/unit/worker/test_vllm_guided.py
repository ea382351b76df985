"""`GrammarCatchUp`: a decode's grammar is advanced past the prefill's first token before the
scheduler builds the first token bitmask, once vLLM has compiled the grammar (fake scheduler)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from splitserve.worker.vllm_adapter.guided import GrammarCatchUp, structured_params


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
