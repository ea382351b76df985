"""The two completion routes served without the ASGI entry (issue 17, the router's HTTP front).

uvicorn serves each request through `RequestResponseCycle.run_asgi`, which calls the app it was
given: `ProxyHeadersMiddleware` (a scan of the headers for `X-Forwarded-*`), then `EdgeApp`
(which finds the hot handler by path), three coroutine frames and a dispatch per request before
the handler runs. `front_protocol` is the edge protocol (`http_edge`) that, for a request it
fully understands, starts the handler itself (`openai_api.serve_hot`, what `EdgeApp` runs for
it) on the same uvicorn cycle:

- `POST` of exactly `/v1/chat/completions` or `/v1/completions` (no query string, no
  percent-encoding), streamed or not;
- HTTP/1.1, no `Expect: 100-continue`, no upgrade, no request of the connection still being
  answered (a pipelined one takes uvicorn's queue);
- no `X-Forwarded-For` / `X-Forwarded-Proto` header (the proxy middleware would act on them).

Everything else goes through uvicorn's path unchanged (`super()`), and so does every request when
the app is not a bare `EdgeApp` (API keys: `AuthApp` in front), a root path or a concurrency
limit is set (`front_for`). What the front keeps is uvicorn's: the scope (built by uvicorn's
parser callbacks), the cycle (body reading, flow control, `send`, keep-alive, disconnects), the
task kept in the server's task set (graceful shutdown waits for it), and `run_asgi`'s answers to
a crash (a 500, or the connection closed once the answer has started); the edge's timers,
`ClientLink` and `EdgeStream` are set as for any request. So the bytes on the wire are the same
(`tests/unit/router/test_http_front.py` compares both paths byte for byte).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from splitserve.router.http_sse import STREAM_KEY, EdgeStream
from splitserve.router.openai_api import EdgeApp, Handler, serve_hot

_FORWARDED: Final = frozenset((b"x-forwarded-for", b"x-forwarded-proto"))


def front_for(config: Any, edge: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """`edge` with the front when uvicorn's `config` (loaded) serves a bare `EdgeApp` (at most
    behind the proxy-headers middleware, which the front stands in for) with no root path and
    no concurrency limit; else `edge` itself."""
    app = config.app
    loaded = config.loaded_app
    if isinstance(loaded, ProxyHeadersMiddleware):
        loaded = loaded.app
    if (
        not isinstance(app, EdgeApp)
        or loaded is not app
        or config.root_path
        or config.limit_concurrency is not None
        or getattr(config, "reset_contextvars", False)
    ):
        return edge
    return front_protocol(edge, app.hot_routes)


def front_protocol(edge: type[asyncio.Protocol], hot: dict[str, Handler]) -> type[asyncio.Protocol]:
    """`edge` (`http_edge.edge_protocol`'s class) serving `hot`'s routes directly."""
    handlers = {path.encode("ascii"): handler for path, handler in hot.items()}

    class FrontProtocol(edge):  # type: ignore[valid-type,misc]
        def on_headers_complete(self) -> None:
            handler = handlers.get(self.url)
            if handler is None or not self._front_takes():
                super().on_headers_complete()  # (its head checks included)
                return
            self._edge_check_head()
            self._edge_headers_read()
            scope = self.scope
            scope["method"] = "POST"
            scope["path"] = self.url.decode("ascii")
            scope["raw_path"] = self.url
            scope["query_string"] = b""
            self.cycle = cycle = RequestResponseCycle(
                scope=scope,
                transport=self.transport,
                flow=self.flow,
                logger=self.logger,
                access_logger=self.access_logger,
                access_log=self.access_log,
                default_headers=self.server_state.default_headers,
                message_event=asyncio.Event(),
                expect_100_continue=False,
                keep_alive=self.parser.should_keep_alive(),
                on_response=self.on_response_complete,
            )
            scope[STREAM_KEY] = EdgeStream(cycle)
            task = self.loop.create_task(_run(cycle, handler))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        def _front_takes(self) -> bool:
            parser = self.parser
            cycle = self.cycle
            return (
                parser.get_method() == b"POST"
                and parser.get_http_version() == "1.1"
                and not self.expect_100_continue
                and not parser.should_upgrade()
                and (cycle is None or cycle.response_complete)
                and not any(name in _FORWARDED for name, _ in self.headers)
            )

    FrontProtocol.__name__ = FrontProtocol.__qualname__ = f"Front{edge.__name__}"
    return FrontProtocol


async def _run(cycle: Any, handler: Handler) -> None:
    """`RequestResponseCycle.run_asgi` with the hot route's handler as the app."""
    try:
        await serve_hot(handler, cycle.scope, cycle.receive, cycle.send)
    except BaseException as exc:
        cycle.logger.error("Exception in ASGI application\n", exc_info=exc)
        if not cycle.response_started:
            await cycle.send_500_response()
        else:
            cycle.transport.close()
    else:
        if not cycle.response_started and not cycle.disconnected:
            cycle.logger.error("ASGI callable returned without starting response.")
            await cycle.send_500_response()
        elif not cycle.response_complete and not cycle.disconnected:
            cycle.logger.error("ASGI callable returned without completing response.")
            cycle.transport.close()
    finally:
        cycle.on_response = _nothing


def _nothing() -> None:
    pass
