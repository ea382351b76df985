"""The router's count of KV pulls not finished per decode worker (`Ledger.pull_tokens`, the
placement view's `pending_pull_tokens`): a split request's decode share counts from placement
until the decode worker's first token, moves with a re-balanced share, and stops counting when
its prefill failed (it runs whole there) or the request left."""

from __future__ import annotations

from splitserve.core.ids import EndpointId
from splitserve.router.ledger import Ledger

D1, D2, P = EndpointId("d1"), EndpointId("d2"), EndpointId("p")


def _split(ledger: Ledger, rid: str, prompt: int, on: EndpointId = D1) -> None:
    ledger.reserve(
        P, rid, prefill=True, num_prompt_tokens=prompt, predicted_output_tokens=8, block_size=16
    )
    ledger.reserve(on, rid, prefill=False, num_prompt_tokens=prompt, predicted_output_tokens=8,
                   block_size=16, movable=True, pulls=True)  # fmt: skip


def test_a_split_share_counts_until_the_decode_workers_first_token() -> None:
    ledger = Ledger()
    _split(ledger, "a", 1000)
    _split(ledger, "b", 300)
    ledger.reserve(D1, "c", prefill=False, num_prompt_tokens=500, predicted_output_tokens=8,
                   block_size=16)  # fmt: skip
    assert ledger.pull_tokens(D1) == 1300  # the aggregated "c" pulls nothing
    assert ledger.pull_tokens(P) == 0  # a prefill share is never a pull
    ledger.start(D1, "a")
    ledger.progress(D1, "a", 1)  # token 1 came from the prefill worker: still pulling
    assert ledger.pull_tokens(D1) == 1300
    ledger.progress(D1, "a", 2)  # the decode worker's first token: its KV is in
    assert ledger.pull_tokens(D1) == 300
    ledger.drop(D1, "b")  # the request left before its pull
    assert ledger.pull_tokens(D1) == 0


def test_a_moved_share_moves_its_pull_and_a_failed_prefill_ends_it() -> None:
    ledger = Ledger()
    _split(ledger, "a", 1000)
    assert ledger.move("a", D1, D2, 16)
    assert (ledger.pull_tokens(D1), ledger.pull_tokens(D2)) == (0, 1000)
    ledger.no_pull(D2, "a")  # every prefill failed: it runs whole on D2
    assert ledger.pull_tokens(D2) == 0
    ledger.no_pull(D1, "gone")  # unknown: nothing
