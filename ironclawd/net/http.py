"""HTTP/1.1 (and TLS) to one address the broker already validated.

The connection goes to ``request.address`` and nowhere else: httpcore is handed the IP literal,
so nothing resolves the name again (no DNS rebinding between check and connect). TLS verifies
the certificate against ``request.host`` and sends it as SNI (httpcore's ``sni_hostname``
extension); the Host header is the broker's. One connection per request, never pooled: a pooled
TLS connection verified for one name must not carry a request for another name that happens to
resolve to the same address. Redirects are never followed here; the broker returns them.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ironclawd.errors import UpstreamFailed
from ironclawd.ports import UpstreamRequest

if TYPE_CHECKING:  # httpx loads at the first egress request or model call (not at start)
    import httpx


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Verification on, hostname checked, TLS 1.2 at least; trust anchors from ``ca_file`` when
    the operator names one (an internal CA), else the system store.

    One context is shared while its trust anchors are unchanged: loading the system store took
    ~30 ms here, paid by every egress request and MCP connection before (issue 17). The key is
    the identity of the files the anchors come from (device, inode, size, mtime), so a new
    ``ca-certificates`` or a rewritten CA file is loaded at the next request. Nothing changes a
    context once made (``check_hostname`` and the SNI name are per connection)."""
    identity = _anchors_identity(ca_file)
    kept = _CONTEXTS.get(str(ca_file))
    if kept is not None and kept[0] == identity:
        return kept[1]
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _CONTEXTS[str(ca_file)] = (identity, context)  # an older store is never used again
    return context


# Per trust-anchor source (a CA file's path, or "None" for the system store).
_CONTEXTS: dict[str, tuple[tuple[tuple[int, ...], ...], ssl.SSLContext]] = {}


def _anchors_identity(ca_file: Path | None) -> tuple[tuple[int, ...], ...]:
    if ca_file is not None:
        paths = [str(ca_file)]
    else:
        found = ssl.get_default_verify_paths()
        paths = [p for p in (found.cafile, found.capath) if p]
    return tuple(_identity(p) for p in paths)


def _identity(path: str) -> tuple[int, ...]:
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


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
        import httpx  # noqa: PLC0415 (loaded by then: see the module's TYPE_CHECKING)

        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        self._chunks: AsyncIterator[bytes] = stream.__aiter__()
        self._http_error = httpx.HTTPError  # kept: read_chunk runs once per body chunk

    async def read_chunk(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return b""
        except self._http_error as exc:
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
        import httpx  # noqa: PLC0415 (at the first egress request, not at the daemon's start)

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
            # The agent is told the host it asked for, never the address (the operator may have
            # opened internal ranges): the audit keeps both.
            said = _describe(exc)  # an OSError's text may quote the address: withheld too
            told = said.replace(request.address, "[address withheld]")
            raise UpstreamFailed(
                f"{request.host}: {told}", audit=f"{request.host} ({request.address}): {said}"
            ) from exc
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


class LazyAsyncClient:
    """Stands for ``httpx.AsyncClient(**options)``, made at its first use: making one loads a
    trust store (~20-40 ms here), which the daemon's start need not wait for (issue 17). The
    client is the same as before in every other way (environment proxies included)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._client: httpx.AsyncClient | None = None

    def _made(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx  # noqa: PLC0415 (httpx itself loads here too, ~20 ms)

            self._client = httpx.AsyncClient(**self._options)
        return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._made(), name)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def as_client(self) -> httpx.AsyncClient:
        """For code typed against httpx.AsyncClient (the providers): every attribute is the
        real client's."""
        return cast("httpx.AsyncClient", self)
