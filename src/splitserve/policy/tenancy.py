"""Tenant rules: which SLO class and model a tenant may use, and its rate and token limits.

Pure: the caller passes the time (`now`, seconds on the injected clock). Limits are token
buckets holding one minute's worth (`per_minute`), refilled continuously; a request that does
not fit is refused with the time until it would (`Retry-After`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TenantRules:
    """What a tenant may do (the router builds it from the key file's `TenantSpec`)."""

    name: str
    slo_classes: tuple[str, ...] = ()
    """Allowed SLO classes; empty: every class."""
    models: tuple[str, ...] = ()
    """Allowed models; empty: every model."""
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


class TokenBucket:
    """`per_minute` units a minute, bursts up to one minute's worth."""

    __slots__ = ("capacity", "level", "rate_s", "updated")

    def __init__(self, per_minute: float, now: float) -> None:
        self.capacity = per_minute
        self.rate_s = per_minute / 60.0
        self.level = per_minute
        self.updated = now

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate_s)
            self.updated = now

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until `amount` fits (0: now; inf: never, it exceeds the capacity)."""
        self._refill(now)
        if amount > self.capacity:
            return math.inf
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.rate_s

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level -= amount


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a tenant's request is refused: HTTP status, OpenAI error code, message."""

    status: int
    code: str
    message: str
    retry_after_s: float | None = None
    limit: str = ""
    """For a 429, the limit that refused it as OpenAI's error `type` names it: `requests`
    (requestsPerMinute) or `tokens` (tokensPerMinute); '' otherwise."""


class TenantLimits:
    """One tenant's live state: its spec and its buckets (kept across key-file reloads while
    the limits stay the same)."""

    def __init__(self, spec: TenantRules, now: float) -> None:
        self.spec = spec
        self.requests = (
            None if spec.requests_per_minute is None else TokenBucket(spec.requests_per_minute, now)
        )
        self.tokens = (
            None if spec.tokens_per_minute is None else TokenBucket(spec.tokens_per_minute, now)
        )

    def same_limits(self, spec: TenantRules) -> bool:
        return (
            spec.requests_per_minute == self.spec.requests_per_minute
            and spec.tokens_per_minute == self.spec.tokens_per_minute
        )

    def slo_class(self, asked: str) -> tuple[str, Refusal | None]:
        """The class a request runs in (`asked`, or the tenant's first class when it asked for
        none), or a 403 when the tenant may not use it."""
        allowed = self.spec.slo_classes
        if not asked:
            return (allowed[0] if allowed else ""), None
        if allowed and asked not in allowed:
            return asked, Refusal(
                403,
                "slo_class_not_allowed",
                f"SLO class {asked!r} is not allowed for this API key; allowed: "
                + ", ".join(allowed),
            )
        return asked, None

    def model(self, name: str) -> Refusal | None:
        allowed = self.spec.models
        if allowed and name not in allowed:
            return Refusal(
                403,
                "model_not_allowed",
                f"the model `{name}` is not allowed for this API key",
            )
        return None

    def admit(self, tokens: int, now: float) -> Refusal | None:
        """Charge one request and `tokens` completion tokens, or refuse (429) without charging."""
        waits = []  # named as the key file writes the limits
        if self.requests is not None:
            waits.append(("requestsPerMinute", self.requests.wait_s(1, now)))
        if self.tokens is not None:
            waits.append(("tokensPerMinute", self.tokens.wait_s(tokens, now)))
        for name, wait in waits:
            if math.isinf(wait):
                return Refusal(
                    429,
                    "rate_limit_exceeded",
                    f"the request asks for {tokens} tokens, more than the tenant's {name} "
                    f"({self.spec.tokens_per_minute:g}); lower max_tokens",
                    limit="tokens",
                )
        wait = max((w for _, w in waits), default=0.0)
        if wait > 0:
            which = ", ".join(n for n, w in waits if w > 0)
            longest = max(waits, key=lambda nw: nw[1])[0]
            return Refusal(
                429,
                "rate_limit_exceeded",
                f"rate limit reached for this API key ({which}); retry after {wait:.1f} s",
                retry_after_s=wait,
                limit="tokens" if longest == "tokensPerMinute" else "requests",
            )
        if self.requests is not None:
            self.requests.take(1, now)
        if self.tokens is not None:
            self.tokens.take(tokens, now)
        return None
