"""Stock `vllm serve` OpenAI servers as router workers (`--backend`, `backends:` in router.yaml).

A backend is reached over vLLM's OpenAI HTTP API instead of the `splitserve.v1.Worker` gRPC
service (`splitserve.router.http_backend`); its role is fixed here, since a stock server does
not report one (docs/engines.md, "Stock vllm serve servers as workers").
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from splitserve.core.roles import Role


class HttpBackend(BaseModel):
    """One stock `vllm serve` server."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

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
