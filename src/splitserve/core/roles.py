"""Worker roles. A role is a run-time setting of a worker, never part of its identity."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    PREFILL = "prefill"
    """Runs prompts and hands the KV cache to a decode worker."""
    DECODE = "decode"
    """Pulls KV caches and generates tokens."""
    MIXED = "mixed"
    """Runs whole requests (aggregated serving); can also take either half."""

    @property
    def can_prefill(self) -> bool:
        return self in (Role.PREFILL, Role.MIXED)

    @property
    def can_decode(self) -> bool:
        return self in (Role.DECODE, Role.MIXED)

    @property
    def can_generate(self) -> bool:
        """Whether a whole request (prefill and decode) may run here."""
        return self in (Role.DECODE, Role.MIXED)


def parse_role(text: str) -> Role:
    """Parse a role name, case-insensitively, with a clear error."""
    try:
        return Role(text.strip().lower())
    except ValueError:
        valid = ", ".join(r.value for r in Role)
        raise ValueError(f"unknown role {text!r}; expected one of: {valid}") from None
