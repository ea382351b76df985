"""OpenTelemetry traces: off unless the standard `OTEL_*` environment variables turn them on.

On when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`, or both comma-separated)
or an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`),
and not `OTEL_SDK_DISABLED=true`. The OTLP exporter speaks HTTP/protobuf, or gRPC when
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` says `grpc` and
opentelemetry-exporter-otlp-proto-grpc is installed (otherwise refused, as is any other value),
and reads the rest of its `OTEL_EXPORTER_OTLP_*` settings itself; `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES` name the process. Off (the default), the SDK is never imported and
every hook costs one attribute read: `span()` returns a shared do-nothing context manager and no
tracer is called.

Context crosses processes as W3C `traceparent` (`inject` into gRPC metadata or HTTP headers,
`extract` from them); the router accepts a client's `traceparent` header as the parent.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Final

_state: dict[str, Any] = {"tracer": None}

Attributes = Mapping[str, str | int | float | bool]


class TracingConfigError(ValueError):
    """An `OTEL_*` setting splitserve cannot honour; the message is one line naming the variable."""


_EXPORTERS: Final = ("otlp", "console")
_HTTP: Final = "http/protobuf"
_GRPC: Final = "grpc"


def _names(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return [n.strip() for n in raw.split(",") if n.strip()]


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the OTEL_* environment asks for traces."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    names = _names(env)
    if names:
        return any(n != "none" for n in names)
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def exporters(env: Mapping[str, str] | None = None) -> list[str]:
    """The span exporters `OTEL_TRACES_EXPORTER` names (the spec's comma-separated list; `none`
    dropped; unset: `otlp`). Raises `TracingConfigError` for a name with no exporter here."""
    env = os.environ if env is None else env
    names = _names(env) or ["otlp"]
    for name in names:
        if name not in (*_EXPORTERS, "none"):
            raise TracingConfigError(
                f"OTEL_TRACES_EXPORTER={env.get('OTEL_TRACES_EXPORTER', '').strip()!r}: "
                f"no exporter {name!r}; splitserve supports otlp, console, none "
                "(comma-separated for several)"
            )
    return list(dict.fromkeys(n for n in names if n != "none"))


def _grpc_exporter() -> type[Any] | None:
    """The OTLP gRPC span exporter class, if its package is installed."""
    try:  # optional package, typed or not: imported by name
        module = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    except ImportError:
        return None
    exporter: type[Any] = module.OTLPSpanExporter
    return exporter


def otlp_protocol(env: Mapping[str, str] | None = None) -> str:
    """`http/protobuf` (the default) or `grpc`, from `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
    `OTEL_EXPORTER_OTLP_PROTOCOL`. Raises `TracingConfigError` for any other value, and for `grpc`
    without the gRPC exporter installed (the HTTP exporter would send to a gRPC port in vain)."""
    env = os.environ if env is None else env
    for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(var, "").strip().lower()
        if not value:
            continue
        if value == _HTTP:
            return value
        if value == _GRPC:
            if _grpc_exporter() is None:
                raise TracingConfigError(
                    f"{var}=grpc: the OTLP gRPC exporter is not installed "
                    "(pip install opentelemetry-exporter-otlp-proto-grpc), or use http/protobuf"
                )
            return value
        raise TracingConfigError(
            f"{var}={value!r}: splitserve supports http/protobuf, and grpc with "
            "opentelemetry-exporter-otlp-proto-grpc installed"
        )
    return _HTTP


def check(env: Mapping[str, str] | None = None) -> None:
    """Raise `TracingConfigError` for `OTEL_*` settings that `configure` would refuse (imports
    nothing else): a CLI calls it before starting anything."""
    env = os.environ if env is None else env
    if wanted(env) and "otlp" in exporters(env):
        otlp_protocol(env)


def configure(service_name: str, exporter: Any = None) -> bool:
    """Start tracing for this process if `OTEL_*` asks for it (or `exporter` is given: tests).

    Returns whether tracing is on.
    """
    if exporter is None and not wanted():
        return False
    if exporter is None:
        check()  # refuse unusable settings before building anything
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError as err:
        raise RuntimeError(
            "OTEL_* asks for traces but opentelemetry-sdk is not installed "
            "(pip install 'splitserve[obs]')"
        ) from err

    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME") or f"splitserve-{service_name}"}
    )
    provider = TracerProvider(resource=resource)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        for kind in exporters():
            if kind == "console":
                from opentelemetry.sdk.trace.export import ConsoleSpanExporter

                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            elif otlp_protocol() == _GRPC:
                grpc_exporter = _grpc_exporter()
                assert grpc_exporter is not None  # otlp_protocol() checked
                provider.add_span_processor(BatchSpanProcessor(grpc_exporter()))
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _state["provider"] = provider
    _state["tracer"] = provider.get_tracer("splitserve")
    return True


def shutdown() -> None:
    """Flush and stop the exporter (at process exit)."""
    provider = _state.pop("provider", None)
    _state["tracer"] = None
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _state["tracer"] is not None


_NOOP = contextlib.nullcontext()


def span(
    name: str, attributes: Attributes | None = None, carrier: Mapping[str, str] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """A span (current for its duration) under the current one, or under `carrier`'s context
    (W3C `traceparent` from another process). Off: a shared no-op."""
    if _state["tracer"] is None:
        return _NOOP
    return _span(name, attributes, carrier)


@contextlib.contextmanager
def _span(
    name: str, attributes: Attributes | None, carrier: Mapping[str, str] | None
) -> Iterator[Any]:
    from opentelemetry.propagate import extract

    context = extract(dict(carrier)) if carrier else None
    with _state["tracer"].start_as_current_span(name, context=context) as s:
        if attributes:
            s.set_attributes(dict(attributes))
        yield s


def set_attributes(attributes: Attributes) -> None:
    """Add attributes to the current span (no-op when off)."""
    if _state["tracer"] is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(dict(attributes))


def event(name: str, attributes: Attributes | None = None) -> None:
    """An event on the current span (no-op when off)."""
    if _state["tracer"] is None:
        return
    from opentelemetry import trace

    trace.get_current_span().add_event(name, dict(attributes or {}))


def inject() -> list[tuple[str, str]]:
    """The current context as metadata pairs (`traceparent`, ...); empty when off."""
    if _state["tracer"] is None:
        return []
    from opentelemetry.propagate import inject as otel_inject

    carrier: dict[str, str] = {}
    otel_inject(carrier)
    return list(carrier.items())


def carrier_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """The W3C trace headers among gRPC metadata (or HTTP headers) pairs."""
    if _state["tracer"] is None or metadata is None:
        return {}
    return {
        k: v if isinstance(v, str) else v.decode("latin-1")
        for k, v in metadata
        if k in ("traceparent", "tracestate")
    }


def current_trace_id() -> str:
    """The current trace id as 32 hex digits; empty when off or outside a span."""
    if _state["tracer"] is None:
        return ""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


# -- one request's spans, held explicitly (they outlive `await`s and `yield`s) ------------------

client_carrier: ContextVar[dict[str, str] | None] = ContextVar("client_carrier", default=None)
"""The client's W3C trace headers of the request being handled (set by the HTTP edge)."""


class RequestTrace:
    """The router's spans of one request: `router.request` and its children (admission,
    prefill, decode calls), with events for placement and fallbacks. `NOOP` when off."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._open: dict[str, Any] = {}

    @property
    def trace_id(self) -> str:
        """32 hex digits; empty when off."""
        return "" if self.root is None else format(self.root.get_span_context().trace_id, "032x")

    @staticmethod
    def start(request_id: str, slo_class: str) -> RequestTrace:
        tracer = _state["tracer"]
        if tracer is None:
            return NOOP_TRACE
        from opentelemetry.propagate import extract

        carrier = client_carrier.get()
        parent = extract(carrier) if carrier else None
        root = tracer.start_span(
            "router.request",
            context=parent,
            attributes={"splitserve.request_id": request_id, "splitserve.slo_class": slo_class},
        )
        return RequestTrace(root)

    def begin(
        self, name: str, attributes: Attributes | None = None
    ) -> list[tuple[str, str]] | None:
        """Open child span `router.<name>`; returns gRPC metadata carrying its context."""
        from opentelemetry import trace
        from opentelemetry.propagate import inject as otel_inject

        parent = trace.set_span_in_context(self.root)
        child = _state["tracer"].start_span(
            f"router.{name}", context=parent, attributes=dict(attributes or {})
        )
        self.end(name)
        self._open[name] = child
        carrier: dict[str, str] = {}
        otel_inject(carrier, context=trace.set_span_in_context(child))
        return list(carrier.items())

    def end(self, name: str, attributes: Attributes | None = None) -> None:
        child = self._open.pop(name, None)
        if child is not None:
            if attributes:
                child.set_attributes(dict(attributes))
            child.end()

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        self.root.add_event(name, dict(attributes or {}))

    def finish(self, attributes: Attributes) -> None:
        for name in list(self._open):
            self.end(name)
        self.root.set_attributes(dict(attributes))
        self.root.end()


class _NoopTrace(RequestTrace):
    def begin(
        self, name: str, attributes: Attributes | None = None
    ) -> list[tuple[str, str]] | None:
        return None

    def end(self, name: str, attributes: Attributes | None = None) -> None:
        return

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        return

    def finish(self, attributes: Attributes) -> None:
        return


NOOP_TRACE: Final = _NoopTrace(None)


class WorkerSpan:
    """A worker's span of one call, parented by the router's (gRPC metadata); `None` when off."""

    @staticmethod
    def start(name: str, context: Any, request: Any, attributes: Attributes | None = None) -> Any:
        """`context`: the gRPC servicer context; `request`: the worker's `Request`."""
        tracer = _state["tracer"]
        if tracer is None:
            return None
        from opentelemetry.propagate import extract

        attrs = {
            "splitserve.request_id": str(request.id),
            "splitserve.prompt_tokens": int(request.num_prompt_tokens),
            **(attributes or {}),
        }
        parent = extract(carrier_of(context.invocation_metadata()))
        return tracer.start_span(name, context=parent, attributes=attrs)


def placement_attributes(placement: Any) -> dict[str, str]:
    """A router placement (path, reason, candidate workers) as span attributes; {} when off."""
    if _state["tracer"] is None:
        return {}
    return {
        "splitserve.path": str(placement.path.value),
        "splitserve.placement_reason": str(placement.reason),
        "splitserve.prefill_workers": ",".join(placement.prefill),
        "splitserve.decode_workers": ",".join(placement.decode),
    }


def end_span(span: Any, attributes: Attributes | None = None) -> None:
    """End a span from `WorkerSpan.start` (no-op for None: tracing off)."""
    if span is None:
        return
    if attributes:
        span.set_attributes(dict(attributes))
    span.end()


def span_event(span: Any, name: str, attributes: Attributes | None = None) -> None:
    if span is not None:
        span.add_event(name, dict(attributes or {}))


def child_span(
    parent: Any, name: str, seconds: float, attributes: Attributes | None = None
) -> None:
    """A finished child of `parent` (a span from `WorkerSpan.start`) that ended now and lasted
    `seconds`: for work measured elsewhere (a KV pull inside the engine). No-op for None."""
    if parent is None or _state["tracer"] is None:
        return
    import time

    from opentelemetry import trace

    end_ns = time.time_ns()
    start_ns = end_ns - max(0, int(seconds * 1e9))
    span = _state["tracer"].start_span(
        name,
        context=trace.set_span_in_context(parent),
        start_time=start_ns,
        attributes=dict(attributes or {}),
    )
    span.end(end_time=end_ns)
