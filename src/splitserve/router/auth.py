"""Client authentication at the router: bearer API keys mapped to tenants (docs/security.md).

`KeyStore` holds SHA-256 digests of the keys (never a key in clear) and each tenant's limits
(`policy.tenancy`); a key file is re-read when its modification time changes, so keys rotate
without a restart (a Kubernetes Secret mounted as a volume is updated in place by the kubelet).

`AuthApp` wraps the router's ASGI app: every path except `OPEN_PATHS` needs
`Authorization: Bearer <key>` (401 without one or with an unknown one, OpenAI's bodies); then
the tenant's SLO class (403; a request without `x-slo-class` runs in the tenant's first class),
model (403) and rate / token limits (429 with `Retry-After`) apply (to the completions, and
to `/tokenize` / `/detokenize` as one request of no tokens). `RouterAuthInterceptor` does
the same for the gRPC `Router` service with the key in the `authorization` metadata.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
from collections.abc import Collection
from pathlib import Path
from typing import Any, Final

import grpc
import orjson
import pydantic
import yaml
from grpc import aio

from splitserve.api.auth import SECRET_KEYS, AuthSettings, KeyFile, TenantSpec
from splitserve.api.validation import utf8_problem, validation_lines, yaml_problem
from splitserve.core.clock import Clock
from splitserve.policy.tenancy import Refusal, TenantLimits, TenantRules
from splitserve.router.openai_errors import error_body
from splitserve.security.guard import guarded, refused

log = logging.getLogger(__name__)

OPEN_PATHS: Final = frozenset({"/health", "/ready", "/metrics"})
"""Answered without a key: probes and Prometheus (they carry no prompt or user data)."""
_METERED_PATHS: Final = frozenset({"/v1/completions", "/v1/chat/completions"})
_TOKENIZER_PATHS: Final = frozenset({"/tokenize", "/detokenize"})
"""Charged one request and no tokens; the model is the served one when the body names none."""
_SLO_HEADER: Final = b"x-slo-class"
DEFAULT_TENANT: Final = "default"


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def key_sha256_hex(key: str) -> str:
    """What `--api-key` becomes in the configuration."""
    return hashlib.sha256(key.encode()).hexdigest()


def load_key_file(path: Path) -> KeyFile:
    """Parse a key file (YAML or JSON).

    Raises:
        ValueError: not UTF-8 text, not YAML (the line named), not a mapping, or an invalid
            tenant (named). (yaml's own errors were a traceback at start-up.)
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: {utf8_problem(err)}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: {yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a mapping with `tenants`")
    try:
        return KeyFile.model_validate(data)
    except pydantic.ValidationError as err:  # one line per problem (was pydantic's block)
        raise ValueError(validation_lines(path, err, secret=SECRET_KEYS)) from None


def tenant_specs(
    settings: AuthSettings, file: KeyFile | None, slo_classes: Collection[str]
) -> list[TenantSpec]:
    """The tenants a `KeyStore` serves: `default` for the `--api-key` keys, then the file's.

    Raises:
        ValueError: next to `--api-key` keys, a tenant of the file named `default` or holding
            one of those keys (the tenant named, never the key); a tenant's `sloClasses` not
            among the service's `slo_classes` (its requests would all be 400s).
    """
    given = frozenset(settings.key_sha256)
    specs = [TenantSpec(name=DEFAULT_TENANT, key_sha256=settings.key_sha256)] if given else []
    for spec in file.tenants if file is not None else ():
        if given and spec.name == DEFAULT_TENANT:
            raise ValueError(
                f"tenant {DEFAULT_TENANT!r} is reserved for the --api-key / SPLITSERVE_API_KEY "
                "keys: rename it"
            )
        if spec.digests() & given:
            raise ValueError(
                f"tenant {spec.name!r} holds a key also given with --api-key / SPLITSERVE_API_KEY"
            )
        if unknown := [c for c in spec.slo_classes if c not in slo_classes]:
            raise ValueError(
                f"tenant {spec.name!r}: sloClasses {', '.join(map(repr, unknown))} not among "
                f"the service's SLO classes ({', '.join(slo_classes)})"
            )
        specs.append(spec)
    return specs


class KeyStore:
    """Key digests -> tenants, reloaded from the key file when it changes."""

    def __init__(
        self, settings: AuthSettings, clock: Clock, *, slo_classes: Collection[str]
    ) -> None:
        """`slo_classes`: the service's (a tenant's `sloClasses` must be among them)."""
        self.settings = settings
        self.clock = clock
        self.slo_classes = tuple(slo_classes)
        self._digests: dict[bytes, TenantLimits] = {}
        self._tenants: dict[str, TenantLimits] = {}
        self._file = None if settings.key_file is None else Path(settings.key_file)
        self._mtime: float | None = None
        self._checked = -math.inf
        self.reloads = 0
        self._rebuild(self._read() if self._file is not None else None)

    @property
    def tenants(self) -> dict[str, TenantLimits]:
        return dict(self._tenants)

    def _read(self) -> KeyFile:
        assert self._file is not None
        self._mtime = self._file.stat().st_mtime_ns
        return load_key_file(self._file)

    def _rebuild(self, file: KeyFile | None) -> None:
        now = self.clock.now_s()
        specs = tenant_specs(self.settings, file, self.slo_classes)
        digests: dict[bytes, TenantLimits] = {}
        tenants: dict[str, TenantLimits] = {}
        for spec in specs:
            rules = TenantRules(
                name=spec.name,
                slo_classes=spec.slo_classes,
                models=spec.models,
                requests_per_minute=spec.requests_per_minute,
                tokens_per_minute=spec.tokens_per_minute,
            )
            old = self._tenants.get(spec.name)
            if old is not None and old.same_limits(rules):
                old.spec = rules  # keep its buckets: a reload is no way around a limit
                limits = old
            else:
                limits = TenantLimits(rules, now)
            tenants[spec.name] = limits
            for digest in spec.digests():  # unique across tenants (`tenant_specs`, `KeyFile`)
                digests[bytes.fromhex(digest)] = limits
        self._digests = digests
        self._tenants = tenants

    def maybe_reload(self) -> None:
        """Re-read the key file if its modification time changed (checked at most every
        `reload_interval_s`). A file that fails to parse keeps the keys loaded before."""
        if self._file is None:
            return
        now = self.clock.now_s()
        if now - self._checked < self.settings.reload_interval_s:
            return
        self._checked = now
        try:
            mtime = self._file.stat().st_mtime_ns
        except OSError as err:
            log.error("key file %s: %s; keeping the keys loaded before", self._file, err)
            return
        if mtime == self._mtime:
            return
        try:
            self._rebuild(self._read())
        except (OSError, ValueError, yaml.YAMLError) as err:
            log.error(
                "key file %s not reloaded, keeping the keys loaded before: %s", self._file, err
            )
            return
        self.reloads += 1
        log.info("key file %s reloaded: %d tenants", self._file, len(self._tenants))

    def authenticate(self, authorization: str | None) -> TenantLimits | None:
        """The tenant of an `Authorization: Bearer <key>` value, None for none / unknown."""
        self.maybe_reload()
        if not authorization:
            return None
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        digest = key_digest(key.strip())
        found = self._digests.get(digest)
        if found is None:
            return None
        # The dict finds a candidate by the digest; compare it in constant time regardless.
        for known, tenant in self._digests.items():
            if tenant is found and hmac.compare_digest(known, digest):
                return found
        return None


def warn_if_open(settings: AuthSettings | None) -> None:
    if settings is None or not settings.enabled:
        log.warning(
            "no API keys configured: the router answers every client (give --api-key, "
            "SPLITSERVE_API_KEY or --api-key-file; docs/security.md)"
        )


# -- HTTP --------------------------------------------------------------------------------------


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


async def _answer(
    send: Any, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]
) -> None:
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def _refuse(send: Any, refusal: Refusal) -> None:
    # OpenAI types a 429 by the limit (`requests` or `tokens`); other refusals are invalid requests
    kind = (refusal.limit or "requests") if refusal.status == 429 else "invalid_request_error"
    headers = []
    if refusal.retry_after_s is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(refusal.retry_after_s))).encode()))
    await _answer(
        send, refusal.status, error_body(refusal.message, kind, None, refusal.code), headers
    )


ALLOWED_MODELS_SCOPE: Final = "splitserve.allowed_models"
"""The ASGI scope key under which a request of a tenant limited to some `models` carries them
(absent: every model): `/v1/models` lists, and `/v1/models/{id}` finds, only those."""

_MISSING = Refusal(
    401,
    "missing_api_key",
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
)
_WRONG = Refusal(401, "invalid_api_key", "Incorrect API key provided.")


class AuthApp:
    """The router's ASGI app behind API-key authentication and tenant rules."""

    def __init__(
        self,
        app: Any,
        store: KeyStore,
        *,
        model_name: str,
        default_max_tokens: int,
        max_body_bytes: int,
        open_paths: frozenset[str] = OPEN_PATHS,
    ) -> None:
        """`open_paths`: answered without a key (`/metrics` leaves it when the router serves
        metrics on their own port)."""
        self.app = app
        self.open_paths = open_paths
        self.store = store
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        authorization = _header(scope, b"authorization")
        tenant = self.store.authenticate(authorization)
        if tenant is None:
            missing = _MISSING if not authorization else _WRONG
            client = scope.get("client") or ("?", 0)
            log.info(  # %r: the path is the client's (a %0a in it wrote a line of its own)
                "refused %s %r from %s: %s", scope["method"], scope["path"], client[0], missing.code
            )
            await _answer(
                send,
                401,
                error_body(missing.message, "invalid_request_error", None, missing.code),
                [(b"www-authenticate", b'Bearer realm="splitserve"')],
            )
            return
        header = _header(scope, _SLO_HEADER)
        asked = (header or "").strip()  # as the app reads it: whitespace around it is not it
        slo_class, refusal = tenant.slo_class(asked)
        if refusal is not None:
            await _refuse(send, refusal)
            return
        if slo_class != asked and (header is None or header.strip()):
            # (an empty header is kept: the app refuses it, 400, rather than run the request
            # in the tenant's class)
            scope = dict(scope)
            scope["headers"] = [
                *(h for h in scope["headers"] if h[0].lower() != _SLO_HEADER),
                (_SLO_HEADER, slo_class.encode()),
            ]
        tokenizer = scope["path"] in _TOKENIZER_PATHS
        if scope["method"] != "POST" or not (tokenizer or scope["path"] in _METERED_PATHS):
            if tenant.spec.models and scope["path"].startswith("/v1/models"):
                scope = {**scope, ALLOWED_MODELS_SCOPE: tenant.spec.models}
            await self.app(scope, receive, send)
            return
        messages, body = await self._read_body(receive)
        model, tokens = self._model_and_tokens(body)
        if tokenizer:
            model, tokens = model or self.model_name, 0
        refusal = None if model is None else tenant.model(model)
        if refusal is None:
            refusal = tenant.admit(tokens, self.store.clock.now_s())
        if refusal is not None:
            await _refuse(send, refusal)
            return
        await self.app(scope, _replay(messages, receive), send)

    async def _read_body(self, receive: Any) -> tuple[list[Any], bytes | None]:
        """The body's messages as received (to replay) and the body, None when it is larger
        than `edge.max_body_bytes` (the app answers that 413) or the client left."""
        messages: list[Any] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages, None
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                return messages, None
            if not message.get("more_body", False):
                break
        return messages, b"".join(m.get("body", b"") for m in messages)

    def _model_and_tokens(self, body: bytes | None) -> tuple[str | None, int]:
        """The body's `model` and completion budget; (None, default) when the body does not
        parse (the app answers that 400, after the rate limit charged the default budget); no
        tokens for a budget that is not a positive int (the app's 400 names it)."""
        if body is None:
            return None, self.default_max_tokens
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None, self.default_max_tokens
        if not isinstance(data, dict):
            return None, self.default_max_tokens
        model = data.get("model")
        budgets = [data.get(k) for k in ("max_completion_tokens", "max_tokens")]
        if any(b is not None and not _positive_int(b) for b in budgets):
            tokens = 0
        else:
            tokens = budgets[0] or budgets[1] or self.default_max_tokens
        return (model if isinstance(model, str) else None), tokens


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _replay(messages: list[Any], receive: Any) -> Any:
    pending = list(messages)

    async def replayed() -> Any:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


# -- gRPC --------------------------------------------------------------------------------------

_GRPC_STATUS: Final = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class RouterAuthInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """API keys on the gRPC `Router` service: `authorization: Bearer <key>` metadata, then the
    tenant's SLO class (the request's `slo_class`), model (a request names none: the served
    one, `model_name`) and limits (`sampling.max_tokens`)."""

    def __init__(self, store: KeyStore, *, model_name: str, default_max_tokens: int) -> None:
        self.store = store
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        metadata = dict(details.invocation_metadata or ())
        authorization = metadata.get("authorization")
        tenant = self.store.authenticate(authorization)
        if tenant is None:
            refusal = _MISSING if not authorization else _WRONG
            log.info("refused gRPC %r: %s", details.method, refusal.code)
            return refused(handler, grpc.StatusCode.UNAUTHENTICATED, refusal.message)
        store = self.store
        model_name = self.model_name
        default_tokens = self.default_max_tokens

        async def check(request: Any, context: Any) -> None:
            if request is None or not hasattr(request, "slo_class"):
                return
            slo_class, refusal = tenant.slo_class(request.slo_class)
            if refusal is None:
                refusal = tenant.model(model_name)
            if refusal is None:
                request.slo_class = slo_class
                asked = request.sampling.max_tokens if request.HasField("sampling") else 0
                refusal = tenant.admit(asked or default_tokens, store.clock.now_s())
            if refusal is not None:
                if refusal.retry_after_s is not None:
                    context.set_trailing_metadata(
                        (("retry-after", str(max(1, math.ceil(refusal.retry_after_s)))),)
                    )
                await context.abort(_GRPC_STATUS[refusal.status], refusal.message)

        return guarded(handler, check)
