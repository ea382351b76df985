"""Tenant rules: SLO classes, models, request and token buckets (pure, a manual clock)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from splitserve.api.auth import KeyFile, TenantSpec
from splitserve.policy.tenancy import Refusal, TenantLimits, TenantRules, TokenBucket


def _tenant(**kw: Any) -> TenantLimits:
    return TenantLimits(TenantRules(name="t", **kw), now=0.0)


def _refused(refusal: Refusal | None, status: int) -> Refusal:
    assert refusal is not None
    assert refusal.status == status
    return refusal


def test_bucket_refills_at_its_rate_and_caps_at_a_minute() -> None:
    bucket = TokenBucket(60, now=0.0)
    bucket.take(60, 0.0)
    assert bucket.wait_s(1, 0.0) == pytest.approx(1.0)
    assert bucket.wait_s(1, 1.0) == 0.0
    assert bucket.wait_s(61, 1000.0) == math.inf
    assert bucket.level == 60


def test_slo_class_outside_the_set_is_403_and_none_takes_the_first() -> None:
    t = _tenant(slo_classes=("batch", "interactive"))
    assert t.slo_class("") == ("batch", None)
    assert t.slo_class("interactive") == ("interactive", None)
    assert _refused(t.slo_class("premium")[1], 403).code == "slo_class_not_allowed"
    assert _tenant().slo_class("anything") == ("anything", None)


def test_model_outside_the_set_is_403() -> None:
    t = _tenant(models=("m1",))
    assert t.model("m1") is None
    _refused(t.model("m2"), 403)


def test_request_rate_limit_is_429_with_retry_after_and_refills() -> None:
    t = _tenant(requests_per_minute=2)
    assert t.admit(10, 0.0) is None
    assert t.admit(10, 0.0) is None
    refusal = _refused(t.admit(10, 0.0), 429)
    assert refusal.retry_after_s == pytest.approx(30.0)
    assert t.admit(10, 30.0) is None


def test_token_limit_charges_the_budget_and_refuses_what_never_fits() -> None:
    t = _tenant(tokens_per_minute=100)
    assert t.admit(80, 0.0) is None
    assert _refused(t.admit(80, 0.0), 429).retry_after_s == pytest.approx(36.0)
    never = _refused(t.admit(500, 0.0), 429)
    assert never.retry_after_s is None
    assert "lower max_tokens" in never.message


def test_a_refused_request_is_not_charged() -> None:
    t = _tenant(requests_per_minute=60, tokens_per_minute=100)
    assert t.admit(100, 0.0) is None
    assert t.admit(50, 0.0) is not None  # tokens short
    assert t.requests is not None
    assert t.requests.level == 59


def test_key_file_validation_names_the_problem() -> None:
    with pytest.raises(ValueError, match="keys or keySha256"):
        TenantSpec(name="a")
    with pytest.raises(ValueError, match="64 hex"):
        TenantSpec(name="a", key_sha256=("abc",))
    with pytest.raises(ValueError, match="unique"):
        KeyFile(
            tenants=(TenantSpec(name="a", keys=("k" * 8,)), TenantSpec(name="a", keys=("j" * 8,)))
        )


def test_a_429_says_which_limit_as_openai_types_it() -> None:
    """OpenAI's 429 body types a request-rate limit `requests` and a token-rate limit `tokens`
    (user20b: a tokens_per_minute refusal said `requests`). Both short: the longer wait."""
    t = _tenant(requests_per_minute=1)
    assert t.admit(10, 0.0) is None
    assert _refused(t.admit(10, 0.0), 429).limit == "requests"
    t = _tenant(tokens_per_minute=100)
    assert _refused(t.admit(500, 0.0), 429).limit == "tokens"  # never fits
    assert t.admit(80, 0.0) is None
    assert _refused(t.admit(80, 0.0), 429).limit == "tokens"
    t = _tenant(requests_per_minute=60, tokens_per_minute=100)
    assert t.admit(90, 0.0) is None
    refusal = _refused(t.admit(90, 0.0), 429)  # tokens wait 48 s; requests have room
    assert refusal.limit == "tokens"
    assert _tenant().model("m") is None
    assert _refused(_tenant(models=("m1",)).model("m2"), 403).limit == ""


def test_a_429_names_the_limit_as_the_key_file_writes_it() -> None:
    # it said requests_per_minute / tokens_per_minute; the file's keys are camelCase
    t = _tenant(requests_per_minute=1, tokens_per_minute=100)
    assert "tokensPerMinute (100)" in _refused(t.admit(500, 0.0), 429).message
    assert t.admit(10, 0.0) is None
    message = _refused(t.admit(10, 0.0), 429).message
    assert "(requestsPerMinute)" in message
    assert "_per_minute" not in message
