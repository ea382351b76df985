"""Stock `vllm serve` OpenAI servers as router workers (`--backend`, `backends:` in router.yaml).

A backend is reached over vLLM's OpenAI HTTP API instead of the `splitserve.v1.Worker` gRPC
service (`splitserve.router.http_backend`); its role is fixed here, since a stock server does
not report one (docs/engines.md, "Stock vllm serve servers as workers").
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from splitserve.core.roles import Role


class HttpBackend(BaseModel):
    """One stock `vllm serve` server."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
    )

    url: str = Field(min_length=1)
    """Base URL of the server's OpenAI API, e.g. `http://10.0.0.5:8000` (no path)."""
    role: Role = Role.MIXED
    """What the router places there: `prefill` (prompts, KV handed to a decode server over
    NIXL), `decode` (continues from pulled KV; aggregated requests too) or `mixed` (both).
    P/D on a server needs vLLM's NIXL `--kv-transfer-config` with `kv_role: kv_both`."""
    metrics_interval_s: float = Field(0.5, ge=0.05, le=60)
    """How often the router reads the server's `/metrics` for its load."""
    request_timeout_s: float = Field(600.0, gt=0)
    """Longest a single HTTP call to the server may take (the request's own deadline applies
    on top)."""

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"backend url {url!r}: give the server's base URL, without a path")
        return url.rstrip("/")


def parse_backend_flag(value: str) -> HttpBackend:
    """`--backend [ROLE=]URL` (ROLE: prefill, decode or mixed; default mixed).

    Raises:
        ValueError: an unknown role or a bad URL (the message names it).
    """
    role, sep, url = value.partition("=")
    if not sep or "://" in role:
        role, url = Role.MIXED.value, value
    try:
        parsed_role = Role(role.strip())
    except ValueError:
        known = ", ".join(r.value for r in Role)
        raise ValueError(f"--backend {value!r}: unknown role {role!r} (known: {known})") from None
    return HttpBackend(url=url.strip(), role=parsed_role)


class PodWatchSettings(BaseModel):
    """What every pod watch of the router shares (`discovery` of our workers,
    `backend_discovery` of stock servers): how long one watch lasts and how it backs off.

    Keys are camelCase in the file (`watchTimeoutS`); snake_case names are accepted too.
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        allow_inf_nan=False,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
    )

    watch_timeout_s: int = Field(300, ge=1)
    """Server-side timeout of one watch request; the router re-lists when it ends."""
    backoff_min_s: float = Field(0.5, gt=0)
    """First delay after a failed list or watch."""
    backoff_max_s: float = Field(30.0, gt=0)
    """Longest delay between attempts."""

    @model_validator(mode="after")
    def _check_backoff(self) -> PodWatchSettings:
        if self.backoff_max_s < self.backoff_min_s:
            raise ValueError("backoff_max_s must be >= backoff_min_s")
        return self


class BackendDiscoverySettings(PodWatchSettings):
    """Find stock `vllm serve` pods in Kubernetes by their labels (`backend_discovery` in
    router.yaml): every matching pod with an IP and a role label is a backend at
    `scheme://podIP:httpPort`, fenced while not Ready or while its fenced label is `"true"`.

    Keys are camelCase in the file (`roleLabel`); snake_case names are accepted too.
    """

    namespace: str = Field(min_length=1, max_length=253)
    """Namespace of the `vllm serve` pods."""
    selector: str = Field(min_length=1)
    """Label selector of the pods (`app=vllm,tier=serve`; `!=`, `in (...)`, ... too)."""
    role_label: str = Field(min_length=1)
    """Label holding the pod's role (`prefill`, `decode` or `mixed`); pods without it, or with
    another value, are not backends. Unlike our workers, a stock server reports no role: a
    change of this label changes where the router places."""
    fenced_label: str = "splitserve.io/fenced"
    """Label that is `"true"` while the pod should get no new work."""
    http_port: int = Field(8000, ge=1, le=65535)
    """Port of every pod's OpenAI API (`vllm serve --port`)."""
    scheme: Literal["http", "https"] = "http"
    """URL scheme of the servers."""
    metrics_interval_s: float = Field(0.5, ge=0.05, le=60)
    """How often the router reads each server's `/metrics`."""
    request_timeout_s: float = Field(600.0, gt=0)
    """Longest a single HTTP call to a server may take."""
