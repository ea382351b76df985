"""The project's error hierarchy. Edges map these to HTTP / gRPC / kopf errors."""

from __future__ import annotations


class SplitserveError(Exception):
    """Base of every error splitserve raises on purpose."""


class ConfigError(SplitserveError):
    """A configuration or input that cannot be used as given."""


class PlacementError(SplitserveError):
    """No placement could be made for a request."""


class NoEligibleEndpoint(PlacementError):  # noqa: N818 - reads as a condition, as in the design
    """Every endpoint was filtered out."""


class EngineError(SplitserveError):
    """An engine failed to run a request."""


class CapacityError(EngineError):
    """A request can never fit this engine (e.g. more KV blocks than the engine has)."""


class KvTransferError(SplitserveError):
    """A KV cache could not be moved from a prefill worker to a decode worker."""
