"""`spec.observability.tracing` as the standard `OTEL_*` variables of the router and workers.

The processes read them themselves (`splitserve.obs.tracing`: on when an OTLP endpoint is set;
the SDK's sampler from `OTEL_TRACES_SAMPLER` / `_ARG`). Parent-based, so a request a client or
the router sampled is traced through every process whatever the ratio.
"""

from __future__ import annotations

from typing import Any

from splitserve.api import v1alpha1 as v1


def tracing_env(spec: v1.LLMServiceSpec) -> list[dict[str, Any]]:
    """The container env for traces; [] when `observability.tracing` is left out."""
    tracing = spec.observability.tracing
    if tracing is None:
        return []
    values = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": tracing.endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": f"{tracing.sampler_ratio:g}",
    }
    assert tuple(values) == v1.TRACING_ENV
    return [{"name": k, "value": v} for k, v in values.items()]
