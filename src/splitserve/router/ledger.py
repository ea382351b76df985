"""The router's own view of the work it has placed on each worker (reservations and requests).

A placement *reserves* its share on the chosen prefill and decode workers at decision time, so
requests placed in the same instant see each other (no herding onto the worker that looked
emptiest in the last load report). A reservation counts as one more request in flight, its
prompt as pending prefill tokens (prefill side) and its prompt + predicted output as KV blocks
(decode side) until the call to that worker starts; from then on the worker's own load reports
count it. The entry stays until the request leaves the worker, feeding the placement plugins'
per-worker inputs: TetriInfer's heavy/light mix, Splitwise's reserved KV, Aladdin's and
Past-Future's ongoing requests. This is also the fallback view when load reports go stale.

`revision(eid)` changes whenever what the pool view reads of a worker here changes
(`reserved`, `prefill_tokens`, `pull_tokens`): the pool view keeps each worker's snapshot until
it, or the worker's own state, changes (issue 17: the snapshot is taken several times per
request, for every worker).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from splitserve.core.ids import EndpointId
from splitserve.core.kv import blocks_for
from splitserve.policy.placement.aladdin import OngoingRequest, WorkerLoad
from splitserve.policy.placement.tetriinfer import HeavyLightMix


@dataclass(slots=True)
class LedgerEntry:
    request_id: str
    prefill: bool
    """A prefill-only share (disaggregated P); else decode or aggregated (the KV stays)."""
    num_prompt_tokens: int
    predicted_output_tokens: int
    kv_blocks: int
    started: bool = False
    """The call to the worker has started (its load reports count it from then on)."""
    num_generated_tokens: int = 0
    movable: bool = False
    """A disaggregated request's decode share, placed while its prefill runs elsewhere: Aladdin's
    re-balancing (Alg. 2) may move it to another decode worker until its decode call starts."""
    pulling: bool = False
    """A disaggregated request's decode share whose KV pull has not finished: counted in
    `pull_tokens` until the decode worker's first token (`progress` past token 1)."""


@dataclass(frozen=True, slots=True)
class Reserved:
    """What not-yet-started reservations add to a worker's reported load."""

    requests: int = 0
    prefill_tokens: int = 0
    kv_blocks: int = 0


_NONE = Reserved()


class Ledger:
    def __init__(self, heavy_threshold_tokens: int = 128) -> None:
        self.heavy_threshold_tokens = heavy_threshold_tokens
        self._by_ep: dict[EndpointId, dict[str, LedgerEntry]] = {}
        self._moved: dict[str, EndpointId] = {}
        self._tick = 0
        self._rev: dict[EndpointId, int] = {}

    def _touch(self, eid: EndpointId) -> None:
        self._tick += 1
        self._rev[eid] = self._tick

    def revision(self, eid: EndpointId) -> int:
        """A number that changes whenever `reserved`, `prefill_tokens` or `pull_tokens` of `eid`
        may have changed (never back to an earlier value)."""
        return self._rev.get(eid, 0)

    def reserve(
        self,
        eid: EndpointId,
        request_id: str,
        *,
        prefill: bool,
        num_prompt_tokens: int,
        predicted_output_tokens: int,
        block_size: int,
        movable: bool = False,
        pulls: bool = False,
    ) -> None:
        """`pulls`: a disaggregated request's decode share (its KV will be pulled here)."""
        tokens = num_prompt_tokens + (1 if prefill else max(1, predicted_output_tokens))
        self._by_ep.setdefault(eid, {})[request_id] = LedgerEntry(
            request_id,
            prefill,
            num_prompt_tokens,
            predicted_output_tokens,
            blocks_for(tokens, max(1, block_size)),
            movable=movable and not prefill,
            pulling=pulls and not prefill,
        )
        self._touch(eid)

    def move(self, request_id: str, src: EndpointId, dst: EndpointId, block_size: int) -> bool:
        """Move a movable decode share that has not started from `src` to `dst` (re-balancing);
        False when it is gone, started or not movable. The request's dispatch reads the new
        worker with `moved_to` before it starts its decode call."""
        e = self._by_ep.get(src, {}).get(request_id)
        if e is None or e.started or not e.movable or e.prefill:
            return False
        self.drop(src, request_id)
        tokens = e.num_prompt_tokens + max(1, e.predicted_output_tokens)
        e.kv_blocks = blocks_for(tokens, max(1, block_size))
        self._by_ep.setdefault(dst, {})[request_id] = e
        self._touch(dst)
        self._moved[request_id] = dst
        return True

    def moved_to(self, request_id: str) -> EndpointId | None:
        """Where re-balancing moved the request's decode share (once; then forgotten)."""
        return self._moved.pop(request_id, None)

    def start(self, eid: EndpointId, request_id: str) -> None:
        e = self._by_ep.get(eid, {}).get(request_id)
        if e is not None:
            e.started = True
            e.movable = False
            self._touch(eid)

    def progress(self, eid: EndpointId, request_id: str, num_generated_tokens: int) -> None:
        e = self._by_ep.get(eid, {}).get(request_id)
        if e is not None:
            e.num_generated_tokens = num_generated_tokens
            if num_generated_tokens > 1 and e.pulling:
                e.pulling = False  # the decode worker's first token: its KV is in
                self._touch(eid)

    def no_pull(self, eid: EndpointId, request_id: str) -> None:
        """The request's KV will not be pulled into `eid` (its prefill failed: it runs whole
        there instead)."""
        e = self._by_ep.get(eid, {}).get(request_id)
        if e is not None and e.pulling:
            e.pulling = False
            self._touch(eid)

    def drop(self, eid: EndpointId, request_id: str) -> None:
        entries = self._by_ep.get(eid)
        if entries is not None:
            if entries.pop(request_id, None) is not None:
                self._touch(eid)
            if not entries:
                del self._by_ep[eid]

    def forget(self, eid: EndpointId) -> None:
        self._by_ep.pop(eid, None)
        self._touch(eid)

    def entries(self, eid: EndpointId) -> Iterator[LedgerEntry]:
        return iter(list(self._by_ep.get(eid, {}).values()))

    def reserved(self, eid: EndpointId) -> Reserved:
        entries = self._by_ep.get(eid)
        if not entries:
            return _NONE
        n = tokens = blocks = 0
        for e in entries.values():
            if e.started:
                continue
            n += 1
            if e.prefill:
                tokens += e.num_prompt_tokens
            else:
                blocks += e.kv_blocks
        return Reserved(n, tokens, blocks)

    def prefill_tokens(self, eid: EndpointId) -> int:
        """Prompt tokens of the prefills the router has placed on `eid` and not seen return
        (reserved or running): a floor for the worker's pending prefill tokens, which its load
        reports only show a report later."""
        return sum(e.num_prompt_tokens for e in self._by_ep.get(eid, {}).values() if e.prefill)

    def pull_tokens(self, eid: EndpointId) -> int:
        """Prompt tokens of the disaggregated requests placed on `eid` whose KV pull has not
        finished (reserved, prefilling elsewhere, or pulling): the placement view's
        `pending_pull_tokens`, as the simulator counts them (`sim.cluster`). Approximation: a
        pull counts as finished at the decode worker's first token, one decode step after
        its KV is in."""
        return sum(e.num_prompt_tokens for e in self._by_ep.get(eid, {}).values() if e.pulling)

    # -- the placement plugins' per-worker inputs --------------------------------------------

    def mix_of(self, eid: EndpointId) -> HeavyLightMix:
        """TetriInfer: decodes placed here and not finished, heavy (long predicted) or light."""
        heavy = light = 0
        for e in self._by_ep.get(eid, {}).values():
            if e.prefill:
                continue
            if e.predicted_output_tokens >= self.heavy_threshold_tokens:
                heavy += 1
            else:
                light += 1
        return HeavyLightMix(heavy, light)

    def reserved_of(self, eid: EndpointId) -> int:
        """Splitwise: KV blocks reserved for the prompt + output of decodes placed here."""
        return sum(e.kv_blocks for e in self._by_ep.get(eid, {}).values() if not e.prefill)

    def load_of(self, eid: EndpointId) -> WorkerLoad:
        """Aladdin / Past-Future: the requests decoding (or queued to decode) here."""
        return WorkerLoad(
            tuple(
                OngoingRequest(
                    e.num_prompt_tokens,
                    e.num_generated_tokens,
                    max(1, e.predicted_output_tokens),
                    prefilled=e.started,
                )
                for e in self._by_ep.get(eid, {}).values()
                if not e.prefill
            )
        )
