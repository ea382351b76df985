"""The router's configuration: one typed model per concern (C5).

Pure data. Building a `RouterConfig` has no side effects; the CLI reads flags and environment
variables (`SPLITSERVE_*`) and passes the values in.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PlacementSettings(BaseModel):
    """How the router places requests on prefill and decode workers."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    min_prompt_tokens_for_pd: int = Field(1, ge=0)
    """Prompts shorter than this run aggregated on one decode (or mixed) worker."""


class PoolSettings(BaseModel):
    """How the router watches its workers."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    load_interval_s: float = Field(0.1, gt=0)
    """Interval the router asks workers to push load reports at."""
    stale_after_s: float = Field(2.0, gt=0)
    """An endpoint whose last load report is older than this counts as not ready."""
    reconnect_min_s: float = Field(0.05, gt=0)
    """First back-off delay after a load stream breaks."""
    reconnect_max_s: float = Field(2.0, gt=0)
    """Longest back-off delay between reconnection attempts."""

    @model_validator(mode="after")
    def _check_backoff(self) -> PoolSettings:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        return self


class DispatchSettings(BaseModel):
    """Timeouts of the P/D flow."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    request_timeout_s: float = Field(600.0, gt=0)
    """Longest a request may run end to end before the router gives up and cancels it."""
    cancel_timeout_s: float = Field(1.0, gt=0)
    """How long a best-effort `Cancel` to a worker may take."""


class RouterConfig(BaseModel):
    """Everything `splitserve router serve` needs."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    model_name: str = Field(min_length=1)
    """The served model name; requests naming another model get 404."""
    tokenizer_dir: str = Field(min_length=1)
    """Directory holding the Hugging Face tokenizer files of the model."""
    worker_addresses: tuple[str, ...] = ()
    """gRPC addresses (host:port) of the workers; more can be added at run time."""
    http_host: str = "0.0.0.0"
    """Interface the OpenAI-compatible HTTP API listens on."""
    http_port: int = Field(8000, ge=0, le=65535)
    """Port of the HTTP API (0 picks a free one)."""
    grpc_host: str = "0.0.0.0"
    """Interface the `splitserve.v1.Router` gRPC service listens on."""
    grpc_port: int | None = Field(50050, ge=0, le=65535)
    """Port of the gRPC service (0 picks a free one, None disables it)."""
    max_model_len: int = Field(4096, ge=2)
    """Longest prompt plus completion, in tokens."""
    default_max_tokens: int = Field(256, ge=1)
    """Completion length when a request names none (capped by what fits in max_model_len)."""
    placement: PlacementSettings = PlacementSettings()
    """Placement settings."""
    pool: PoolSettings = PoolSettings()
    """Worker pool watching."""
    dispatch: DispatchSettings = DispatchSettings()
    """Dispatch timeouts."""
