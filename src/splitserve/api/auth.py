"""API keys and tenants: the router's key file (docs/security.md, "API keys and tenants").

Pure data. The file is YAML or JSON (a Kubernetes Secret mounted into the router, or a local
file); the router hashes every key as it loads the file and keeps only the hashes:

```yaml
tenants:
  - name: team-a
    keys: ["sk-team-a-1", "sk-team-a-2"]     # or keySha256: [<hex sha256 of a key>]
    sloClasses: [interactive, batch]         # empty: every class
    models: [llama-3-8b]                     # empty: every model
    requestsPerMinute: 600                   # None: no limit
    tokensPerMinute: 200000                  # None: no limit
```
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
API_KEY: Final = re.compile(r"[!-~]{8,}")
"""A bearer key: visible ASCII (an HTTP header is read as latin-1, a key hashed as UTF-8: any
other character could never match)."""
API_KEY_RULE: Final = "a key must be 8 or more visible ASCII characters (no spaces)"


SECRET_KEYS = frozenset({"keys", "keySha256", "key_sha256"})
"""Keys whose values (keys in clear, their digests) a validation error never echoes
(`api.validation.validation_lines`); both spellings, as pydantic names the one the file used."""


class FileModel(BaseModel):
    """Base of the router's file models (`router.yaml`, the API-key file): frozen, strict about
    unknown keys, camelCase keys (snake_case accepted too)."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
    )


class TenantSpec(FileModel):
    """One tenant: its keys and what they may do."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """The tenant's name (logs; never a secret)."""
    keys: tuple[str, ...] = ()
    """Bearer keys in clear (the file is a Secret); hashed when loaded, never kept."""
    key_sha256: tuple[str, ...] = ()
    """Bearer keys as lower-case hex SHA-256 digests (a file that holds no key in clear)."""
    slo_classes: tuple[str, ...] = ()
    """SLO classes the tenant may ask for with `x-slo-class`; empty: every class. A request
    without the header runs in the first of them (else the service's default class)."""
    models: tuple[str, ...] = ()
    """Model names the tenant may call; empty: every model the router serves."""
    requests_per_minute: float | None = Field(None, gt=0)
    """Sustained request rate (a token bucket holding one minute's worth); None: no limit."""
    tokens_per_minute: float | None = Field(None, gt=0)
    """Sustained completion-token budget: each request is charged its `max_tokens` (or the
    router's default) when admitted, before it runs; None: no limit."""

    @model_validator(mode="after")
    def _check(self) -> TenantSpec:
        if not self.keys and not self.key_sha256:
            raise ValueError(f"tenant {self.name!r}: give keys or keySha256")
        for digest in self.key_sha256:
            if not SHA256_HEX.fullmatch(digest):
                raise ValueError(f"tenant {self.name!r}: keySha256 entries are 64 hex digits")
        if not all(API_KEY.fullmatch(key) for key in self.keys):
            raise ValueError(f"tenant {self.name!r}: keys: {API_KEY_RULE}")
        return self

    def digests(self) -> frozenset[str]:
        """The hex SHA-256 digests of the tenant's keys, given in clear or as digests."""
        return frozenset(
            (*(hashlib.sha256(k.encode()).hexdigest() for k in self.keys), *self.key_sha256)
        )


class KeyFile(FileModel):
    """The whole key file."""

    tenants: tuple[TenantSpec, ...]
    """The tenants (one at least); names and key digests must be unique across them."""

    @field_validator("tenants")
    @classmethod
    def _unique(cls, tenants: tuple[TenantSpec, ...]) -> tuple[TenantSpec, ...]:
        # checked once every tenant is valid (`Field(min_length=1)` added a false "not 0" line
        # to a bad tenant's)
        if not tenants:
            raise ValueError("at least one tenant")
        names = [t.name for t in tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        owners: dict[str, str] = {}
        for tenant in tenants:
            for digest in tenant.digests():
                owner = owners.setdefault(digest, tenant.name)
                if owner != tenant.name:
                    raise ValueError(f"tenants {owner!r} and {tenant.name!r} share a key")
        return tenants


class AuthSettings(BaseModel):
    """How the router authenticates clients (`RouterConfig.auth`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    key_sha256: tuple[str, ...] = ()
    """SHA-256 digests of keys given with `--api-key` / `SPLITSERVE_API_KEY` (the CLI hashes
    them; the clear key is never in the configuration): tenant `default`, no limits."""
    key_file: str | None = None
    """A key file (`KeyFile`, YAML or JSON); re-read when its modification time changes."""
    reload_interval_s: float = Field(2.0, gt=0)
    """How often the key file's modification time is checked."""

    @model_validator(mode="after")
    def _check(self) -> AuthSettings:
        for digest in self.key_sha256:
            if not SHA256_HEX.fullmatch(digest):
                raise ValueError("auth.key_sha256: entries are 64 lower-case hex digits")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.key_sha256) or self.key_file is not None
