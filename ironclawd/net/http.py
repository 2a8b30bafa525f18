"""HTTP/1.1 (and TLS) to one address the broker already validated.

The connection goes to ``request.address`` and nowhere else: httpcore is handed the IP literal,
so nothing resolves the name again (no DNS rebinding between check and connect). TLS verifies
the certificate against ``request.host`` and sends it as SNI (httpcore's ``sni_hostname``
extension); the Host header is the broker's. One connection per request, never pooled: a pooled
TLS connection verified for one name must not carry a request for another name that happens to
resolve to the same address. Redirects are never followed here; the broker returns them.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from ironclawd.errors import UpstreamFailed
from ironclawd.ports import UpstreamRequest


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Verification on, hostname checked, TLS 1.2 at least; trust anchors from ``ca_file`` when
    the operator names one (an internal CA), else the system store."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class _Response:
    def __init__(
        self, transport: httpx.AsyncHTTPTransport, response: httpx.Response, host: str
    ) -> None:
        self._transport = transport
        self._response = response
        self._host = host
        self.status = response.status_code
        self.reason = response.reason_phrase
        self.headers = tuple(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw
        )
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        self._chunks: AsyncIterator[bytes] = stream.__aiter__()

    async def read_chunk(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return b""
        except httpx.HTTPError as exc:
            raise UpstreamFailed(f"{self._host}: reading the body: {_describe(exc)}") from exc

    async def close(self) -> None:
        try:
            await self._response.aclose()
        finally:
            await self._transport.aclose()


class PinnedHttpClient:
    def __init__(self, ca_file: Path | None = None) -> None:
        self._ca_file = ca_file

    async def send(self, request: UpstreamRequest) -> _Response:
        transport = httpx.AsyncHTTPTransport(
            verify=tls_context(self._ca_file),
            trust_env=False,  # no HTTP(S)_PROXY, no .netrc: the broker is the only way out
            http1=True,
            http2=False,
            retries=0,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=0),
        )
        address = f"[{request.address}]" if ":" in request.address else request.address
        url = f"{request.scheme}://{address}:{request.port}{request.target}"
        outgoing = httpx.Request(
            request.method,
            url,
            headers=list(request.headers),
            content=request.body or None,
            extensions={
                "sni_hostname": request.host,
                "timeout": {"connect": request.connect_timeout, "read": None, "write": None,
                            "pool": request.connect_timeout},
            },
        )  # fmt: skip
        try:
            response = await transport.handle_async_request(outgoing)
        except httpx.HTTPError as exc:
            await transport.aclose()
            raise UpstreamFailed(f"{request.host} ({request.address}): {_describe(exc)}") from exc
        except BaseException:
            await transport.aclose()
            raise
        return _Response(transport, response, request.host)


def _describe(exc: Exception) -> str:
    cause = exc.__context__ or exc.__cause__
    text = str(exc) or type(exc).__name__
    if isinstance(cause, ssl.SSLError):
        text = f"TLS: {cause.reason or cause}"
    return f"{type(exc).__name__}: {text}"
