"""The HTTP side of a remote MCP server's client (host/mcp_remote.py says what it enforces):
the transport that is its only way out, and the client around it. A module of its own so that
``httpx2`` (~20 ms of imports) loads when a remote server is first opened, not at the daemon's
start (issue 17)."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx2

from ironclawd.domain.addresses import IPAddress
from ironclawd.domain.codings import IDENTITY, refused_coding
from ironclawd.domain.mcp_url import McpEndpoint


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(
        self, inner: Any, limit: int, on_close: Callable[[int], None], on_cut: Callable[[str], None]
    ) -> None:
        self._inner = inner
        self._limit = limit
        self._seen = 0
        self._on_close = on_close
        self._on_cut = on_cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._seen += len(chunk)
            if self._seen > self._limit:
                why = (
                    f"the server sent a response over {self._limit} bytes ([mcp] max_message_bytes)"
                )
                self._on_cut(why)
                raise httpx2.ReadError(why)
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._on_close(self._seen)


class PinnedTransport(httpx2.AsyncBaseTransport):
    """Every request of one remote server's client: to the checked address only."""

    def __init__(
        self,
        endpoint: McpEndpoint,
        address: IPAddress,
        context: ssl.SSLContext,
        max_bytes: int,
        audit: Callable[..., None],
    ) -> None:
        self._endpoint = endpoint
        self._address = address
        self._max_bytes = max_bytes
        self._audit = audit
        self.reason = ""  # why the last response was cut, for the supervisor's message
        # The JSON-RPC id of the first request whose response was cut at the cap (a POST's
        # response answers that request only), for the supervisor to know whose call it was.
        self.cut_id: str | None = None
        self._inner = httpx2.AsyncHTTPTransport(
            verify=context, trust_env=False, http1=True, http2=False, retries=0,
            limits=httpx2.Limits(max_connections=4, max_keepalive_connections=2),
        )  # fmt: skip

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        if (url.scheme, url.host, port) != ("https", self._endpoint.host, self._endpoint.port):
            self._audit(method=request.method, url=str(url), refused="not the registered server")
            raise httpx2.ConnectError(
                f"refused: {url.scheme}://{url.host}:{port} is not the registered server "
                f"{self._endpoint.authority}", request=request,
            )  # fmt: skip
        request.url = url.copy_with(host=str(self._address))
        # Bodies as sent: the cap counts what reaches the SDK. With gzip it counted the wire,
        # and 520 KB unpacked to 512 MiB in the daemon, or to a stream of newlines that held
        # the event loop for seconds (found by a review).
        request.headers.update(IDENTITY)
        if self._endpoint.address is None:
            request.extensions = {**request.extensions, "sni_hostname": self._endpoint.host}
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.HTTPError as exc:
            self._audit(method=request.method, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            request.url = url

        encoding = refused_coding(response.headers.multi_items())
        if encoding is not None:
            await response.aclose()
            self.reason = f"the server answered in Content-Encoding {encoding}, not as sent"
            self._audit(method=request.method, status=response.status_code,
                        refused=self.reason)  # fmt: skip
            raise httpx2.RemoteProtocolError(f"refused: {self.reason}", request=request)

        def done(size: int) -> None:
            self._audit(method=request.method, status=response.status_code, bytes_in=size)

        def cut(why: str) -> None:
            self.reason = why
            if self.cut_id is None:
                self.cut_id = _request_id(request)

        response.stream = _CappedStream(response.stream, self._max_bytes, done, cut)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _request_id(request: httpx2.Request) -> str | None:
    """The id of the JSON-RPC request the SDK posted in ``request`` (its own JSON), as text."""
    try:
        message = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError):  # a GET has no body; a body is always JSON
        return None
    rid = message.get("id") if isinstance(message, dict) else None
    return str(rid) if isinstance(rid, int | str) and not isinstance(rid, bool) else None


def pinned_client(
    transport: PinnedTransport, headers: Mapping[str, str], wait: float, connect: float
) -> httpx2.AsyncClient:
    """The SDK's client: only ``transport``, no redirects followed, nothing from the
    environment (proxies, .netrc)."""
    return httpx2.AsyncClient(
        transport=transport, headers=dict(headers), follow_redirects=False, trust_env=False,
        timeout=httpx2.Timeout(wait, connect=connect),
    )  # fmt: skip
