"""A stock `vllm serve` server behind the Worker service's call shapes.

`HttpWorker` answers the calls the router makes on a worker stub (`Prefill`, `Decode`,
`Generate`, `Cancel`, `WatchLoad`, `WatchSteps`, `WarmKv`) over vLLM's OpenAI HTTP API, so the
pool, the SLO placement, admission, the fallbacks and the OpenAI response path treat it like any
worker. Failures come back as `grpc.aio.AioRpcError`s with the codes the dispatcher already acts
on:

- connect errors, 429 and 503: UNAVAILABLE (the next worker; a decode keeps the KV handle);
- 400 / 422 (vLLM refused the request itself): INVALID_ARGUMENT (a 400 to the client);
- the call ran out of time: DEADLINE_EXCEEDED;
- other HTTP errors: INTERNAL (the next worker);
- a decode that fails before its first token (vLLM could not pull the KV; its default
  `kv_load_failure_policy: fail` ends the request with an error) or whose first token differs
  from the prefill's: ABORTED (the dispatcher re-runs the request there from prompt + first token,
  without the KV).

The decode server samples the first token again (vLLM's protocol): the worker drops it from the
stream after checking it equals the prefill's, so the client sees each token once. Sampled
requests without a seed get one derived from the request id on both halves
(`protocol.pd_seed`) so that the two samples agree.

Cancel: a stock server has no cancel call; closing the HTTP stream aborts the request there
(vLLM does that on disconnect). KV a prefill server holds for a decode that never comes is
freed when vLLM's lease runs out (`kv_lease_duration` in the connector's extra config,
30 s by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, NoReturn

import grpc
import httpx
from grpc import aio

from splitserve._gen.v1 import common_pb2, worker_pb2
from splitserve.api.backends import HttpBackend
from splitserve.router.http_backend import protocol

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S = 5.0


def rpc_error(code: grpc.StatusCode, details: str) -> aio.AioRpcError:
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details=details)


def _status_error(url: str, status: int, text: str) -> aio.AioRpcError:
    detail = _error_message(text) or f"HTTP {status}"
    if status in (400, 422):
        return rpc_error(grpc.StatusCode.INVALID_ARGUMENT, detail)
    if status in (429, 503):
        return rpc_error(grpc.StatusCode.UNAVAILABLE, f"{url}: HTTP {status}: {detail}")
    return rpc_error(grpc.StatusCode.INTERNAL, f"{url}: HTTP {status}: {detail}")


def _error_message(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:500]
        return str(err)[:500]
    return text[:500]


def _transport_error(url: str, err: httpx.HTTPError) -> aio.AioRpcError:
    if isinstance(err, httpx.ConnectError | httpx.ConnectTimeout | httpx.RemoteProtocolError):
        return rpc_error(grpc.StatusCode.UNAVAILABLE, f"{url}: {type(err).__name__}: {err}")
    if isinstance(err, httpx.TimeoutException):
        return rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"{url}: {type(err).__name__}")
    return rpc_error(grpc.StatusCode.UNAVAILABLE, f"{url}: {type(err).__name__}: {err}")


class HttpStream:
    """A streamed completion as a `UnaryStreamCall`-like object: iterate it for `TokenChunk`s,
    `cancel()` closes the HTTP stream (vLLM aborts the request)."""

    def __init__(self, chunks: AsyncGenerator[common_pb2.TokenChunk, None]) -> None:
        self._chunks = chunks
        self._closing: asyncio.Task[None] | None = None

    def __aiter__(self) -> AsyncIterator[common_pb2.TokenChunk]:
        return self._chunks

    async def read(self) -> Any:
        """The next chunk, or `grpc.aio.EOF` at the end (what the router's dispatch reads)."""
        return await anext(self._chunks, aio.EOF)

    def cancel(self) -> bool:
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        return True

    async def _close(self) -> None:
        with contextlib.suppress(RuntimeError):  # still running: it ends on its own
            await self._chunks.aclose()


class HttpWorker:
    """One stock vLLM server; use as the pool's stub and channel for that endpoint."""

    def __init__(self, backend: HttpBackend, *, client: httpx.AsyncClient | None = None) -> None:
        self.backend = backend
        self.url = backend.url
        self._client = client or httpx.AsyncClient(
            base_url=backend.url,
            timeout=httpx.Timeout(backend.request_timeout_s, connect=_CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        self.role = backend.role
        """Where the router places (a discovered pod's role label may change it)."""
        self.model: str | None = None
        """The served model name, read from `/v1/models` before the first load report."""
        self._seq = 0

    async def close(self) -> None:
        await self._client.aclose()

    # -- requests ----------------------------------------------------------------------------

    async def Prefill(  # noqa: N802 - the Worker service's method name
        self,
        msg: worker_pb2.PrefillRequest,
        timeout: float | None = None,  # noqa: ASYNC109 - grpc's call signature
        metadata: Any = None,
    ) -> worker_pb2.PrefillResponse:
        """`max_tokens: 1`, no stream, `do_remote_decode`. A request that ends at its first
        token anyway (`max_tokens` 1) runs as a plain completion: no KV to hand over."""
        s = msg.sampling
        whole = s.max_tokens <= 1
        body = protocol.completion_body(
            self._model(),
            list(msg.prompt_token_ids),
            s,
            max_tokens=1,
            stream=False,
            kv_transfer_params=None if whole else protocol.PREFILL_KV_PARAMS,
            seed=protocol.pd_seed(msg.request_id),
        )
        start_s = time.monotonic()
        out = await self._post_json(msg.request_id, body, timeout)
        # A stock server reports no engine time: the call's round trip stands in for it
        # (approximate: it includes the server's queue and HTTP), feeding the prefill rate.
        elapsed_s = time.monotonic() - start_s
        choice = (out.get("choices") or [{}])[0]
        token_ids = choice.get("token_ids") or []
        if len(token_ids) != 1:
            raise rpc_error(
                grpc.StatusCode.INTERNAL,
                f"{self.url}: prefill returned {len(token_ids)} token ids, expected 1 "
                "(a vLLM without `return_token_ids`?)",
            )
        reason = protocol.finish_reason(choice.get("finish_reason"))
        resp = worker_pb2.PrefillResponse(
            request_id=msg.request_id,
            first_token_id=int(token_ids[0]),
            num_prompt_tokens=int((out.get("usage") or {}).get("prompt_tokens") or 0),
            prefill_s=elapsed_s,
        )
        if reason == common_pb2.FINISH_REASON_STOP or whole:
            resp.finish_reason = reason  # type: ignore[assignment]
            return resp
        params = out.get("kv_transfer_params")
        if not isinstance(params, dict):
            log.warning(
                "prefill of %s on %s returned no kv_transfer_params: is the server started "
                "with a NIXL --kv-transfer-config?",
                msg.request_id,
                self.url,
            )
            resp.finish_reason = common_pb2.FINISH_REASON_ERROR
            return resp
        resp.kv.CopyFrom(
            common_pb2.KvHandle(
                transport="nixl-http",
                source_address=self.url,
                source_request_id=str(params.get("remote_request_id") or msg.request_id),
                num_tokens=len(msg.prompt_token_ids),
                params_json=json.dumps(params),
            )
        )
        return resp

    def Decode(  # noqa: N802
        self,
        msg: worker_pb2.DecodeRequest,
        timeout: float | None = None,
        metadata: Any = None,
    ) -> HttpStream:
        """The prompt with the prefill's `kv_transfer_params`, streamed; the decode server's
        first token (a re-sample of the prefill's) is checked and dropped."""
        try:
            params = json.loads(msg.kv.params_json) if msg.kv.params_json else None
        except ValueError:
            params = None
        if not isinstance(params, dict) or msg.kv.transport != "nixl-http":
            return HttpStream(
                _fail(
                    rpc_error(
                        grpc.StatusCode.ABORTED,
                        f"{self.url}: KV handle of transport {msg.kv.transport!r} is not a "
                        "stock vLLM server's: generating from the prompt instead",
                    )
                )
            )
        body = protocol.completion_body(
            self._model(),
            list(msg.prompt_token_ids),
            msg.sampling,
            max_tokens=msg.sampling.max_tokens,
            stream=True,
            kv_transfer_params=params,
            seed=protocol.pd_seed(msg.request_id),
        )
        return HttpStream(self._stream(msg.request_id, body, timeout, msg.first_token_id))

    def Generate(  # noqa: N802
        self,
        msg: worker_pb2.GenerateRequest,
        timeout: float | None = None,
        metadata: Any = None,
    ) -> HttpStream:
        """A whole request (or the rest of one: prompt + tokens already emitted), streamed."""
        body = protocol.completion_body(
            self._model(),
            list(msg.prompt_token_ids),
            msg.sampling,
            max_tokens=msg.sampling.max_tokens,
            stream=True,
        )
        return HttpStream(self._stream(msg.request_id, body, timeout, None))

    async def Cancel(  # noqa: N802
        self,
        msg: worker_pb2.CancelRequest,
        timeout: float | None = None,  # noqa: ASYNC109 - grpc's call signature
        metadata: Any = None,
    ) -> worker_pb2.CancelResponse:
        """Nothing to send: the request's HTTP stream was closed, which aborts it in vLLM."""
        return worker_pb2.CancelResponse()

    async def WarmKv(  # noqa: N802
        self,
        msg: worker_pb2.WarmKvRequest,
        timeout: float | None = None,  # noqa: ASYNC109 - grpc's call signature
        metadata: Any = None,
    ) -> NoReturn:
        raise rpc_error(
            grpc.StatusCode.UNIMPLEMENTED,
            "a stock vLLM server makes its NIXL handshake on the first pull",
        )

    # -- watching ----------------------------------------------------------------------------

    def WatchLoad(  # noqa: N802
        self,
        request: worker_pb2.WatchLoadRequest,
        wait_for_ready: bool | None = None,
        timeout: float | None = None,
    ) -> AsyncGenerator[common_pb2.LoadReport, None]:
        """Load reports from the server's `/metrics`, every `metrics_interval_s` (at least the
        interval asked for). A failed read ends the stream with UNAVAILABLE (the pool marks the
        endpoint not ready and re-opens it with back-off)."""
        interval_s = max(self.backend.metrics_interval_s, request.interval_s)
        return self._watch_load(interval_s)

    def WatchSteps(  # noqa: N802
        self,
        request: worker_pb2.WatchStepsRequest,
        wait_for_ready: bool | None = None,
        timeout: float | None = None,
    ) -> AsyncGenerator[worker_pb2.StepSample, None]:
        """UNIMPLEMENTED: the latency model is fitted from request timings instead."""
        return _fail(rpc_error(grpc.StatusCode.UNIMPLEMENTED, "stock vLLM reports no steps"))

    async def _watch_load(self, interval_s: float) -> AsyncGenerator[common_pb2.LoadReport, None]:
        while True:
            try:
                if self.model is None:
                    self.model = await self._served_model()
                resp = await self._client.get("/metrics", timeout=max(interval_s * 4, 2.0))
            except httpx.HTTPError as err:
                raise _transport_error(self.url, err) from err
            except ValueError as err:  # /v1/models answered something that is not JSON
                raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, f"{self.url}: {err}") from err
            if resp.status_code != 200:
                raise _status_error(self.url, resp.status_code, resp.text)
            self._seq += 1
            try:
                report = protocol.load_report(
                    resp.text,
                    worker_id=self.url,
                    role=self.role,
                    seq=self._seq,
                    model=self.model,
                )
            except ValueError as err:
                raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, f"{self.url}: {err}") from err
            yield report
            await asyncio.sleep(interval_s)

    async def _served_model(self) -> str:
        resp = await self._client.get("/v1/models", timeout=5.0)
        if resp.status_code != 200:
            raise _status_error(self.url, resp.status_code, resp.text)
        body = resp.json()
        data = (body.get("data") if isinstance(body, dict) else None) or []
        if not data or not isinstance(data[0], dict) or not data[0].get("id"):
            raise rpc_error(grpc.StatusCode.FAILED_PRECONDITION, f"{self.url}: serves no model")
        return str(data[0]["id"])

    # -- HTTP --------------------------------------------------------------------------------

    def _model(self) -> str:
        if self.model is None:  # no load report yet, so the pool never placed work here
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.url}: not read yet")
        return self.model

    def _timeout(self, timeout: float | None) -> httpx.Timeout:
        total = self.backend.request_timeout_s
        if timeout is not None:
            total = max(0.001, min(total, timeout))
        return httpx.Timeout(total, connect=min(_CONNECT_TIMEOUT_S, total))

    async def _post_json(
        self, request_id: str, body: Mapping[str, Any], timeout_s: float | None
    ) -> dict[str, Any]:
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self._client.post(
                    "/v1/completions",
                    json=body,
                    headers={"X-Request-Id": request_id},
                    timeout=self._timeout(timeout_s),
                )
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"{self.url}: timed out") from None
        except httpx.HTTPError as err:
            raise _transport_error(self.url, err) from err
        if resp.status_code != 200:
            raise _status_error(self.url, resp.status_code, resp.text)
        out = resp.json()
        if not isinstance(out, dict):
            raise rpc_error(grpc.StatusCode.INTERNAL, f"{self.url}: not a completion: {out!r}")
        return out

    async def _stream(
        self,
        request_id: str,
        body: Mapping[str, Any],
        timeout_s: float | None,
        resampled_first: int | None,
    ) -> AsyncGenerator[common_pb2.TokenChunk, None]:
        """Token chunks of a streamed completion; with `resampled_first`, the first token must
        equal it and is not passed on."""
        skip = resampled_first is not None
        try:
            async with self._client.stream(
                "POST",
                "/v1/completions",
                json=body,
                headers={"X-Request-Id": request_id},
                timeout=self._timeout(timeout_s),
            ) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    raise _status_error(self.url, resp.status_code, text)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    event = json.loads(data)
                    if "error" in event:
                        if skip:  # a decode that failed before its first token: the KV pull
                            raise rpc_error(
                                grpc.StatusCode.ABORTED,
                                f"{self.url}: decode failed before its first token (KV pull?): "
                                f"{_error_message(data)}",
                            )
                        yield common_pb2.TokenChunk(
                            request_id=request_id,
                            finish_reason=common_pb2.FINISH_REASON_ERROR,
                            error=_error_message(data),
                        )
                        return
                    for choice in event.get("choices") or ():
                        tokens = [int(t) for t in choice.get("token_ids") or ()]
                        if skip and tokens:
                            if tokens[0] != resampled_first:
                                raise rpc_error(
                                    grpc.StatusCode.ABORTED,
                                    f"{self.url}: the decode's first token {tokens[0]} is not "
                                    f"the prefill's {resampled_first}",
                                )
                            tokens, skip = tokens[1:], False
                        reason = protocol.finish_reason(choice.get("finish_reason"))
                        if skip and reason == common_pb2.FINISH_REASON_ERROR:
                            # vLLM's `kv_load_failure_policy: fail` (its default): the pull
                            # failed and the request ends with an error before any token.
                            raise rpc_error(
                                grpc.StatusCode.ABORTED,
                                f"{self.url}: decode ended with an error before its first "
                                "token (KV pull failed)",
                            )
                        if tokens or reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                            yield common_pb2.TokenChunk(
                                request_id=request_id,
                                token_ids=tokens,
                                finish_reason=reason,  # type: ignore[arg-type]
                            )
        except httpx.HTTPError as err:
            raise _transport_error(self.url, err) from err


async def _fail(err: aio.AioRpcError) -> AsyncGenerator[Any, None]:
    raise err
    yield  # an async generator that raises on its first step
