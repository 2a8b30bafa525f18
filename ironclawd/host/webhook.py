"""The signed-webhook channel: ``POST /hooks/<endpoint>`` on a TCP address or a Unix socket.

Every request is hostile until proven otherwise, and the checks run cheapest-first, each
refusal answered with its own status and a JSON body ``{"error": …, "expected": …}``: unknown
endpoint 404, body over the cap 413 (never read past it), signature missing, malformed, not
matching or outside the replay window 401 (``formats/webhook_sig.py``), the same signed request
again 409, over the endpoint's or the channel's rate 429 with ``Retry-After``, a body that is
not the JSON envelope 400. Only a request that passed all of these reaches
``InboxSink.receive``, and it is answered 2xx only after ``receive`` returned (the message is
durably queued or held); an error there is a 503 and nothing is acknowledged, so the sender
retries (the queue de-duplicates on the envelope's ``event_id``). Buckets count authenticated
requests only: a stranger who knows the URL cannot use up the sender's rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from ironclawd import ratelog
from ironclawd.domain.channels import (
    ChannelConfig,
    WebhookEndpoint,
    endpoint_event_id,
    sender_event_id,
)
from ironclawd.domain.webhook_inbound import (
    ENVELOPE,
    Listen,
    ReplayCache,
    TokenBucket,
    parse_envelope,
    parse_listen,
)
from ironclawd.errors import ChannelFailed, InvalidArgument, IronclawError, SignatureError
from ironclawd.formats.webhook_sig import EXPECTED, HEADER, verify
from ironclawd.ports import Clock
from ironclawd.ports.channels import (
    Admission,
    ChannelStatus,
    InboundEvent,
    InboxSink,
    OutboundReply,
    Receipt,
    WebhookSender,
)

log = logging.getLogger("ironclawd.channels.webhook")
ENVELOPE_SLACK = 4096  # bytes of JSON around the text: keys, event id, thread, escapes
MIN_SECRET_BYTES = 32
BODY_SECONDS = 30.0
STATUS: dict[Admission, int] = {
    Admission.QUEUED: 200, Admission.DUPLICATE: 200, Admission.NOT_ENGAGED: 200,
    Admission.HELD: 202, Admission.DROPPED: 403, Admission.NOT_WIRED: 404, Admission.REFUSED: 400,
}  # fmt: skip


class _Refused(Exception):
    def __init__(self, status: int, error: str, expected: str, **extra: Any) -> None:
        super().__init__(error)
        self.status, self.error, self.expected, self.extra = status, error, expected, extra


# A listener holds at most this many connections; one past it is closed at once. Any local user
# can reach a loopback listener, and each connection held a descriptor of the daemon's for up
# to an hour: enough of them left admin.sock and every session socket unable to accept
# (found by a review). With the cap a flood can keep webhooks out, never the daemon's other
# sockets; put the listener on a Unix socket behind a proxy to keep local users off it.
MAX_CONNECTIONS = 128
IDLE_SECONDS = 15.0


class _Refuse(asyncio.Protocol):
    """A connection past the cap: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.abort()


class _CappedSite(web.SockSite):
    """aiohttp's site on a bound socket, with the listener's connections capped: the protocol
    factory hands a connection past ``MAX_CONNECTIONS`` to ``_Refuse`` (the aiohttp server
    counts the connections it holds)."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket, channel: str) -> None:
        super().__init__(runner, sock)
        self._channel = channel

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) >= MAX_CONNECTIONS:
                ratelog.warning(log, self._channel, "webhook connections full",
                                "webhook %s: %d connections held: refusing another",
                                self._channel, MAX_CONNECTIONS)  # fmt: skip
                return _Refuse()
            return server()

        self._server = await asyncio.get_running_loop().create_server(
            protocol, sock=self._sock, backlog=self._backlog
        )


class WebhookChannel:
    """``ports.channels.ChannelAdapter`` for one ``[[channels]]`` entry of type webhook."""

    kind = "webhook"

    def __init__(
        self,
        config: ChannelConfig,
        secret: Callable[[str], str],
        clock: Clock,
        deliver_http: WebhookSender,
    ) -> None:
        self.name = config.name
        self._config = config
        self._secret = secret
        self._clock = clock
        self._sender = deliver_http
        self._listen = parse_listen(config.listen)
        self._endpoints = {e.name: e for e in config.endpoints}
        self._cap = config.max_message_bytes + ENVELOPE_SLACK
        self._replays = ReplayCache(clock.monotonic, config.replay_window_seconds)
        per_sender = config.sender_messages_per_minute
        self._senders = {e.name: TokenBucket(clock.monotonic, per_sender) for e in config.endpoints}
        self._channel_bucket = TokenBucket(clock.monotonic, config.channel_messages_per_minute)
        self._counters: dict[str, int] = {}
        self._last_error, self._last_error_at = "", 0.0
        self._runner: web.AppRunner | None = None
        self._bound = ""
        self._sink: InboxSink | None = None

    @property
    def bound(self) -> str:
        """Where the listener is bound (the real port when ``listen`` asked for port 0)."""
        return self._bound

    async def start(self, sink: InboxSink) -> None:
        if self._runner is not None:
            return
        self._sink = sink
        app = web.Application(client_max_size=self._cap)
        app.router.add_post("/hooks/{endpoint}", self._handle)
        app.router.add_route("*", "/{tail:.*}", self._elsewhere)
        # shutdown_timeout: stop() waits this long for requests being handed to the sink.
        # keepalive_timeout: a connection that has not sent a whole request by then, or sits
        # idle that long after one, is closed (aiohttp's default was an hour).
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=30.0,
                               keepalive_timeout=IDLE_SECONDS)  # fmt: skip
        await runner.setup()
        sock: socket.socket | None = None
        try:
            sock = self._bind()
            await _CappedSite(runner, sock, self.name).start()
        except BaseException:
            if sock is not None:
                sock.close()
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("webhook %s: listening on %s", self.name, self._bound)

    def _bind(self) -> socket.socket:
        if self._listen.path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            path = Path(self._listen.path)
            try:
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISSOCK(path.lstat().st_mode):
                        path.unlink()  # a stale socket of a previous run
                sock.bind(str(path))
                # Before listen(): until then a connect is refused, so nobody else gets in
                # through the umask's mode in between. Root only (a reverse proxy as root).
                os.chmod(path, 0o600)
            except OSError as exc:
                sock.close()
                raise ChannelFailed(f"webhook {self.name}: binding {path}: {exc}") from exc
            self._bound = str(self._listen)
            return sock
        family = socket.AF_INET6 if ":" in self._listen.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._listen.host, self._listen.port))
        except OSError as exc:
            sock.close()
            raise ChannelFailed(f"webhook {self.name}: binding {self._listen}: {exc}") from exc
        port = sock.getsockname()[1]
        self._bound = str(Listen(host=self._listen.host, port=port))
        return sock

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()  # lets requests being handed to the sink finish
            if self._listen.path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._listen.path)
            self._bound = ""

    async def _handle(self, request: web.Request) -> web.Response:
        endpoint_name = request.match_info["endpoint"]
        try:
            answer = await self._check_and_receive(request, endpoint_name)
        except _Refused as refused:
            self._count(f"refused_{refused.status}")
            ratelog.warning(log, self.name, f"webhook refused {refused.status}",
                            "webhook %s: refused %s (%d): %s", self.name, endpoint_name[:64],
                            refused.status, refused.error)  # fmt: skip
            headers = {}
            if "retry_after" in refused.extra:
                headers["Retry-After"] = str(refused.extra.pop("retry_after"))
            return web.json_response(
                {"error": refused.error, "expected": refused.expected, **refused.extra},
                status=refused.status, headers=headers,
            )  # fmt: skip
        return answer

    async def _elsewhere(self, request: web.Request) -> web.Response:
        """Anything but ``POST /hooks/<endpoint>``: a JSON refusal like every other."""
        self._count("refused_other")
        if request.path.startswith("/hooks/") and request.path.count("/") == 2:
            return web.json_response({"error": f"method {request.method[:16]} is not served",
                                      "expected": "POST"}, status=405,
                                     headers={"Allow": "POST"})  # fmt: skip
        return web.json_response({"error": "no such path", "expected": "POST /hooks/<endpoint>"},
                                 status=404)  # fmt: skip

    async def _check_and_receive(self, request: web.Request, name: str) -> web.Response:
        endpoint = self._endpoints.get(name)
        if endpoint is None:
            raise _Refused(
                404, "no such endpoint on this channel", "POST /hooks/<a configured endpoint>"
            )
        if request.content_length is not None and request.content_length > self._cap:
            raise self._too_large(request.content_length)
        try:
            # A sender trickling its body would hold a connection for ever: it has a deadline.
            body = await asyncio.wait_for(request.read(), BODY_SECONDS)
        except web.HTTPRequestEntityTooLarge:
            raise self._too_large(None) from None
        except TimeoutError:
            raise _Refused(408, f"the body did not arrive within {BODY_SECONDS:g} s",
                           "the whole body at once") from None  # fmt: skip
        key = self._authenticate(endpoint, request.headers.get(HEADER), body)
        self._take_tokens(endpoint)
        event = self._parse(body, endpoint)
        self._replays.add(key)  # taken: the same signed request again is a replay (409)
        try:
            receipt = await self._receive(event)
        except BaseException:
            self._replays.discard(key)  # nothing acknowledged: the sender may send it again
            raise
        return self._answer(receipt)

    def _too_large(self, length: int | None) -> _Refused:
        said = f"{length} bytes" if length is not None else "more than the cap"
        cap = f"{self._config.max_message_bytes} + {ENVELOPE_SLACK} of envelope"
        return _Refused(413, f"body is {said}", f"at most {self._cap} bytes ({cap})")

    def _authenticate(self, endpoint: WebhookEndpoint, header: str | None, body: bytes) -> str:
        """The replay key of an authentic request; _Refused 401 or 409 otherwise."""
        secret = self._secret_of(endpoint)
        try:
            timestamp = verify(secret, header, body, self._clock.time(),
                               self._config.replay_window_seconds)  # fmt: skip
        except SignatureError as exc:
            expected = EXPECTED
            if exc.reason == "stale":
                expected = (
                    f"t within {self._config.replay_window_seconds:g} s of the receiver's clock"
                )
            raise _Refused(401, str(exc), expected, reason=exc.reason) from None
        key = f"{endpoint.name}\0{timestamp}\0{hashlib.sha256(body).hexdigest()}"
        if key in self._replays:
            raise _Refused(409, "replay: this signed request was already taken",
                           "a new event signed with a new timestamp")  # fmt: skip
        return key

    def _secret_of(self, endpoint: WebhookEndpoint) -> bytes:
        try:
            return self._key(endpoint)
        except ChannelFailed as exc:
            self._error(str(exc))
            raise _Refused(
                503, "the endpoint's secret is not available", "try again later"
            ) from None

    def _key(self, endpoint: WebhookEndpoint) -> bytes:
        """The endpoint's HMAC key, read each time (a rotated credential is picked up); a short
        one is refused, never used: an empty or guessable key would let anyone sign. Retryable:
        the operator may put the right credential in place."""
        try:
            value = self._secret(endpoint.secret_credential).encode()
        except IronclawError as exc:
            raise ChannelFailed(f"webhook {self.name}: endpoint {endpoint.name}: its secret "
                                f"cannot be read: {exc}") from exc  # fmt: skip
        if len(value) < MIN_SECRET_BYTES:
            raise ChannelFailed(
                f"webhook {self.name}: endpoint {endpoint.name}: secret "
                f"{endpoint.secret_credential} is {len(value)} bytes; expected {MIN_SECRET_BYTES}+"
            )
        return value

    def _take_tokens(self, endpoint: WebhookEndpoint) -> None:
        sender = self._senders[endpoint.name]
        wait = max(sender.wait(), self._channel_bucket.wait())
        if wait > 0:
            which = "endpoint" if sender.wait() > 0 else "channel"
            rate = (self._config.sender_messages_per_minute if which == "endpoint"
                    else self._config.channel_messages_per_minute)  # fmt: skip
            raise _Refused(429, f"the {which}'s rate of {rate} messages per minute is used up",
                           "retry after Retry-After seconds",
                           retry_after=max(1, math.ceil(wait)))  # fmt: skip
        sender.take()
        self._channel_bucket.take()

    def _parse(self, body: bytes, endpoint: WebhookEndpoint) -> InboundEvent:
        """The envelope as an event; _Refused 400 naming the field, 413 for too long a text."""
        try:
            envelope = parse_envelope(body)
        except InvalidArgument as exc:
            raise _Refused(400, str(exc), ENVELOPE) from None
        size = len(envelope.text.encode())
        if size > self._config.max_message_bytes:
            raise _Refused(413, f"text is {size} bytes of UTF-8",
                           f"at most {self._config.max_message_bytes}")  # fmt: skip
        # The sender's event id names its event among its own: kept under its endpoint's name,
        # so that two endpoints (two senders) using the same id are two events, not one taken
        # for a duplicate of the other and never queued.
        return InboundEvent(channel=self.name, event_id=endpoint_event_id(endpoint.name,
                                                                          envelope.event_id),
                            sender=endpoint.name, where=endpoint.name, text=envelope.text,
                            thread=envelope.thread, received_at=self._clock.time())  # fmt: skip

    async def _receive(self, event: InboundEvent) -> Receipt:
        assert self._sink is not None
        self._count("received")  # passed every check: handed to the inbox
        try:
            receipt = await self._sink.receive(event)
        except IronclawError as exc:
            self._error(f"the inbox could not take {event.event_id}: {exc}")
            raise _Refused(503, f"not taken: {exc}", "retry later: nothing was queued") from None
        self._count(receipt.admission.value)
        return receipt

    def _answer(self, receipt: Receipt) -> web.Response:
        admission = receipt.admission
        if admission in (Admission.QUEUED, Admission.DUPLICATE):
            return web.json_response({"status": admission.value, "seq": receipt.seq})
        if admission is Admission.NOT_ENGAGED:
            return web.json_response({"status": "ignored"})
        if admission is Admission.HELD:
            return web.json_response({"status": "held"}, status=202)
        reason = receipt.reason or admission.value
        return web.json_response({"status": admission.value, "error": reason},
                                 status=STATUS[admission])  # fmt: skip

    async def deliver(self, reply: OutboundReply) -> None:
        if not reply.reply_url:
            return  # the route sends replies nowhere: nothing to accept
        endpoint = self._endpoints.get(reply.where)
        if endpoint is None:
            raise ChannelFailed(f"webhook {self.name}: no endpoint {reply.where!r} to sign with",
                                retryable=False)  # fmt: skip
        body = json.dumps({"delivery_id": reply.delivery_id,
                           "in_reply_to_event": sender_event_id(reply.where,
                                                                reply.in_reply_to_event),
                           "thread": reply.thread, "text": reply.text}).encode()  # fmt: skip
        try:
            await self._sender.post(channel=self.name, url=reply.reply_url, body=body,
                                    secret=self._key(endpoint),
                                    delivery_id=reply.delivery_id)  # fmt: skip
        except ChannelFailed as exc:
            self._count("delivery_failed")
            self._error(str(exc))
            raise
        self._count("delivered")

    def status(self) -> ChannelStatus:
        return ChannelStatus(
            name=self.name, kind=self.kind, connected=self._runner is not None,
            detail=f"listening on {self._bound or self._listen}; endpoints "
                   f"{', '.join(sorted(self._endpoints)) or '(none)'}",
            last_error=self._last_error, last_error_at=self._last_error_at,
            counters=dict(self._counters),
        )  # fmt: skip

    async def test(self) -> str:
        if self._runner is None:
            raise ChannelFailed(f"webhook {self.name}: not listening ({self._listen})")
        for endpoint in self._endpoints.values():
            self._key(endpoint)
        return (f"listening on {self._bound}; {len(self._endpoints)} endpoint(s), each with a "
                "readable secret")  # fmt: skip

    def _count(self, name: str) -> None:
        self._counters[name] = self._counters.get(name, 0) + 1

    def _error(self, text: str) -> None:
        self._last_error, self._last_error_at = text, self._clock.time()
