"""Which KV handles the router hands to a decode worker: only those of a current pool member.

A prefill worker's answer names where its KV lives (`KvHandle.source_address`); the router passes
the handle on in a `Decode`, and the decode worker connects there to pull (and to release). So
the router passes a handle only when it names the very worker that prefilled the request and that
worker is still a member of the pool (discovery removes workers that left; the operator's fenced
workers stay members until they are gone). Anything else — a handle naming another address, or a
source that left the pool since — is dropped: the request is prefilled elsewhere or generated
from the prompt (docs/security.md, "KV handles"). Stock `vllm serve` backends name themselves by
URL, as their pool ids do, so the same check covers their `kv_transfer_params`; clients never
supply a handle (the OpenAI API refuses an unknown `kv_transfer_params` field).
"""

from __future__ import annotations

from splitserve._gen.v1 import common_pb2
from splitserve.router.pool_view import PoolView, UnknownEndpoint


def is_member(pool: PoolView, address: str) -> bool:
    """Whether `address` is (still) an endpoint of the pool."""
    try:
        pool.view(address)
    except UnknownEndpoint:
        return False
    return True


def kv_source_problem(kv: common_pb2.KvHandle, prefilled_by: str, pool: PoolView) -> str | None:
    """Why the handle `prefilled_by` returned must not reach a decode worker, or None."""
    if kv.source_address != prefilled_by:
        return (
            f"its KV handle names {kv.source_address!r}, not the worker that prefilled it "
            f"({prefilled_by})"
        )
    if not is_member(pool, kv.source_address):
        return f"the KV source {kv.source_address} is no longer a member of the pool"
    return None
