"""ironctl's gRPC client: the admin API's unary and server-streaming calls, as HTTP/2 on the
admin socket, spoken with h2.

Why not grpcio here: importing its client costs ~35 ms on these machines (its Cython core imports
asyncio), about a third of every ``ironctl`` command. h2 is the HTTP/2 state machine httpx uses
(frames, HPACK, flow control, settings); what is left for this module is gRPC's own layer over
HTTP/2: the request headers, the five-byte prefix of each message, the deadline
(``grpc-timeout``) and the status in the trailers. The daemon still serves with grpcio, so
every call is checked against a real gRPC server, in the unit tier (tests/unit/test_ctl_wire.py)
and in every real tier that runs ironctl.

Only what ironctl needs: one connection, one call at a time (a stream left unfinished is
cancelled when its iterator is closed), no compression, no metadata.
"""

from __future__ import annotations

import enum
import math
import os
import socket
import struct
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

# grpcio's client refuses a received message over 4 MiB unless told otherwise; so does this one.
MAX_RECEIVE_BYTES = 4 * 1024 * 1024
# What the daemon may send before this side acknowledges it: one largest message and its prefix.
_WINDOW = 2 * MAX_RECEIVE_BYTES
_PREFIX = struct.Struct(">BI")  # compressed flag, length
_READ_BYTES = 256 * 1024
# Between calls on a kept connection, what the server sent meanwhile is applied first (pings,
# a GOAWAY): a few frames. A server that keeps sending (pings without end) or stops reading the
# answers gets the connection dropped past either bound, and the call a new connection.
_DRAIN_BYTES = 1024 * 1024
# What housekeeping may take, on top of or before a call's deadline: that drain, a cancel.
_GRACE_SECONDS = 1.0


class StatusCode(enum.IntEnum):
    """gRPC's status codes, by the names grpcio gives them (``exitcodes`` maps the names)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """A call that did not end OK: ``code()`` and ``details()`` as grpcio's errors have them.
    ``transport``: the connection failed (the connect, or the connection lost or broken), as
    this side found it; not a status the server sent (its own UNAVAILABLE, say, for a channel
    it cannot reach), which ironctl must not report as a daemon it cannot reach."""

    def __init__(self, code: StatusCode, details: str, *, transport: bool = False) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self.transport = transport

    def code(self) -> StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


# What an HTTP status other than 200 means to a gRPC client (the gRPC HTTP/2 spec's table).
_HTTP_STATUS = {
    400: StatusCode.INTERNAL, 401: StatusCode.UNAUTHENTICATED, 403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED, 429: StatusCode.UNAVAILABLE, 502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE, 504: StatusCode.UNAVAILABLE,
}  # fmt: skip
# What a stream reset by the peer means (grpc's own mapping of HTTP/2 error codes).
_RESET = {
    h2.errors.ErrorCodes.CANCEL: StatusCode.CANCELLED,
    h2.errors.ErrorCodes.REFUSED_STREAM: StatusCode.UNAVAILABLE,
    h2.errors.ErrorCodes.ENHANCE_YOUR_CALM: StatusCode.RESOURCE_EXHAUSTED,
    h2.errors.ErrorCodes.INADEQUATE_SECURITY: StatusCode.PERMISSION_DENIED,
}


def timeout_header(seconds: float) -> str:
    """``grpc-timeout``: at most 8 digits and a unit; milliseconds, rounded up, while they fit."""
    millis = max(1, math.ceil(seconds * 1000))
    if millis < 10**8:
        return f"{millis}m"
    return f"{min(math.ceil(seconds), 10**8 - 1)}S"


def percent_decoded(value: str) -> str:
    """``grpc-message`` is percent-encoded UTF-8 (``%XX`` for bytes outside printable ASCII)."""
    if "%" not in value:
        return value
    from urllib.parse import unquote  # noqa: PLC0415 (only for a message that needs it)

    return unquote(value, errors="replace")


class _Call:
    """One stream's received state."""

    def __init__(self) -> None:
        self.headers: dict[str, str] | None = None
        self.trailers: dict[str, str] | None = None
        self.buffer = bytearray()
        self.ended = False
        self.error: RpcError | None = None


class Channel:
    """One HTTP/2 connection to a gRPC server on a Unix socket, opened at the first call."""

    def __init__(self, path: str, *, user_agent: str = "ironctl") -> None:
        self.path = path
        self._user_agent = user_agent
        self._sock: socket.socket | None = None
        self._conn: h2.connection.H2Connection | None = None
        self._calls: dict[int, _Call] = {}

    def close(self) -> None:
        self._drop_connection()
        self._calls.clear()

    def _drop_connection(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._conn = None

    # -- calls ------------------------------------------------------------------------------

    def unary_unary(self, path: str, request: bytes, timeout: float | None) -> bytes:
        messages = self.unary_stream(path, request, timeout)
        try:
            first = next(messages, None)
            if first is None:
                raise RpcError(StatusCode.INTERNAL, f"{path}: the server sent no response message")
            if next(messages, None) is not None:
                raise RpcError(
                    StatusCode.INTERNAL, f"{path}: the server sent more than one message"
                )
            return first
        finally:
            messages.close()

    def unary_stream(
        self, path: str, request: bytes, timeout: float | None
    ) -> Generator[bytes, None, None]:
        """Send the request now; the iterator yields each response message's bytes, then raises
        RpcError unless the call ended OK. Closing it early cancels the call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        stream_id = self._start(path, request, timeout, deadline)
        return self._messages(stream_id, path, deadline)

    def _start(
        self, path: str, request: bytes, timeout: float | None, deadline: float | None
    ) -> int:
        conn = self._connected(deadline)
        stream_id = conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers"),
            ("user-agent", self._user_agent),
        ]  # fmt: skip
        if timeout is not None:
            headers.append(("grpc-timeout", timeout_header(timeout)))
        conn.send_headers(stream_id, headers)
        call = self._calls[stream_id] = _Call()
        try:
            self._send_data(stream_id, _PREFIX.pack(0, len(request)) + request, deadline)
        except RpcError:
            self._calls.pop(stream_id, None)
            if not call.ended and call.error is None:
                self._cancel(stream_id)
            raise
        return stream_id

    def _messages(
        self, stream_id: int, path: str, deadline: float | None
    ) -> Generator[bytes, None, None]:
        call = self._calls[stream_id]
        try:
            while True:
                message = _take_message(call, path)
                if message is not None:
                    yield message
                elif call.error is not None:
                    raise call.error
                elif call.ended:
                    _check_end(call, path)
                    return
                else:
                    self._receive(deadline)
        finally:
            self._calls.pop(stream_id, None)
            if not call.ended and call.error is None:
                self._cancel(stream_id)  # left early, timed out or refused: the server stops

    # -- the connection ---------------------------------------------------------------------

    def _connected(self, deadline: float | None) -> h2.connection.H2Connection:
        if self._conn is not None and not self._went_away(deadline):
            return self._conn
        # Every connection, a reconnect after a GOAWAY too, is checked on itself: the name is
        # looked up again (a restarted ironclawd is found), and who holds what it names is asked.
        sock = open_admin_socket(self.path, deadline)
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        codes = h2.settings.SettingCodes
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={codes.INITIAL_WINDOW_SIZE: _WINDOW, codes.ENABLE_PUSH: 0},
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(_WINDOW - 65_535)
        self._sock, self._conn = sock, conn
        self._flush(deadline)
        return conn

    def _went_away(self, deadline: float | None) -> bool:
        """Before a call on a kept connection: apply what the server sent while nobody read (its
        pings, a GOAWAY, the end of the connection), and say whether the connection is gone.
        grpcio's client reads in a thread of its own; this one reads only during calls, so an
        ``ironctl chat`` left at its prompt longer than the server's keepalive (a ping not
        answered) or idle limit finds its connection closed and makes a new one, as grpcio
        does. Bounded by the call's deadline, _GRACE_SECONDS and _DRAIN_BYTES: past any of
        them the connection is dropped as gone, and the call opens a new one."""
        bound = time.monotonic() + _GRACE_SECONDS
        if deadline is not None:
            bound = min(bound, deadline)
        drained = 0
        while self._sock is not None:
            try:
                self._sock.settimeout(0.0)
                pending = self._sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                pending = b""
            if not pending or drained > _DRAIN_BYTES:
                self.close()
                return True
            try:
                drained += self._receive(bound)  # readable: returns at once with what came
            except RpcError:  # its answers could not be sent in time: a connection in doubt
                self.close()
                return True
        return True

    def _send_data(self, stream_id: int, data: bytes, deadline: float | None) -> None:
        view = memoryview(data)
        call = self._calls[stream_id]
        while self._conn is not None:
            room = min(
                self._conn.local_flow_control_window(stream_id), self._conn.max_outbound_frame_size
            )
            if room <= 0 and view:
                self._flush(deadline)
                self._receive(deadline)  # until the server opens its window
                if call.ended or call.error is not None:
                    return  # it answered (an error, say) before reading the whole request
                continue
            chunk, view = view[:room], view[room:]
            self._conn.send_data(stream_id, bytes(chunk), end_stream=not view)
            if not view:
                self._flush(deadline)
                return

    def _cancel(self, stream_id: int) -> None:
        if self._conn is None:
            return
        try:
            self._conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            self._flush(time.monotonic() + _GRACE_SECONDS)  # (a server not reading: dropped)
        except (h2.exceptions.ProtocolError, OSError, RpcError):
            self.close()  # a connection in doubt is not reused

    def _flush(self, deadline: float | None) -> None:
        assert self._sock is not None
        assert self._conn is not None
        data = self._conn.data_to_send()
        if not data:
            return
        try:
            self._sock.settimeout(_remaining(deadline))
            self._sock.sendall(data)
        except TimeoutError:
            self.close()
            raise _deadline_exceeded() from None
        except OSError as err:
            self.close()
            raise RpcError(
                StatusCode.UNAVAILABLE, f"unix:{self.path}: {err}", transport=True
            ) from None

    def _receive(self, deadline: float | None) -> int:
        """Read once from the socket and apply what came to the calls; the bytes read."""
        assert self._sock is not None
        assert self._conn is not None
        try:
            self._sock.settimeout(_remaining(deadline))
            data = self._sock.recv(_READ_BYTES)
        except TimeoutError:
            raise _deadline_exceeded() from None
        except OSError as err:
            self._fail_all(StatusCode.UNAVAILABLE, f"unix:{self.path}: {err}")
            return 0
        if not data:
            self._fail_all(StatusCode.UNAVAILABLE, "Socket closed")
            return 0
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError as err:
            if self._conn.state_machine.state == h2.connection.ConnectionState.CLOSED:
                # Frames after its GOAWAY (a server shutting down): it went away.
                self._fail_all(StatusCode.UNAVAILABLE, "the server closed the connection")
            else:
                self._fail_all(StatusCode.INTERNAL, f"HTTP/2 protocol error from the server: {err}")
            return len(data)
        for event in events:
            self._apply(event)
        if self._sock is not None:  # (a GOAWAY among the events ended the connection)
            self._flush(deadline)
        return len(data)

    def _apply(self, event: Any) -> None:
        assert self._conn is not None
        if isinstance(event, h2.events.DataReceived):
            # Acknowledged at once: a message is bounded by MAX_RECEIVE_BYTES, not the window.
            self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            call = self._calls.get(event.stream_id)
            if call is not None:
                call.buffer += event.data
        elif isinstance(event, h2.events.ResponseReceived):
            self._on_headers(event.stream_id, event.headers, trailers=False)
        elif isinstance(event, h2.events.TrailersReceived):
            self._on_headers(event.stream_id, event.headers, trailers=True)
        elif isinstance(event, h2.events.StreamEnded):
            call = self._calls.get(event.stream_id)
            if call is not None:
                call.ended = True
        elif isinstance(event, h2.events.StreamReset):
            call = self._calls.get(event.stream_id)
            if call is not None and not call.ended:
                code = _RESET.get(event.error_code, StatusCode.INTERNAL)  # type: ignore[call-overload]
                call.error = RpcError(code, f"the server reset the stream ({event.error_code!s})")
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._fail_all(StatusCode.UNAVAILABLE, "the server closed the connection (GOAWAY)")

    def _on_headers(self, stream_id: int, headers: Any, *, trailers: bool) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        fields = {str(k): str(v) for k, v in headers}
        if trailers or call.headers is not None:
            call.trailers = fields
        else:
            call.headers = fields
            if "grpc-status" in fields:  # trailers-only: the status in the one HEADERS frame
                call.trailers = fields

    def _fail_all(self, code: StatusCode, details: str) -> None:
        for call in self._calls.values():
            if call.error is None and not call.ended:
                call.error = RpcError(code, details, transport=True)
        self._drop_connection()


# struct ucred, as getsockopt(SO_PEERCRED) fills it (socket(7), unix(7)): pid, uid, gid.
_UCRED = struct.Struct("3i")


def open_admin_socket(
    path: str, deadline: float | None, *, shown: str | None = None
) -> socket.socket:
    """A connection to the admin socket at ``path``, once the kernel says root or this user
    holds the other end. ironctl sends what the operator types (personas, skill files,
    ``mcp add --env`` values) and acts on the answers: a socket another user bound (a --socket
    or IRONCLAW_ADMIN_SOCKET under /tmp or a home, kept through sudo) must get nothing.
    Errors name ``shown`` (the --socket path, when ``path`` is /proc/self/fd/N of it)."""
    shown = path if shown is None else shown
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(_remaining(deadline))
        sock.connect(path)
        _, uid, _ = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
    except TimeoutError:
        sock.close()
        raise _deadline_exceeded() from None
    except OSError as err:
        sock.close()
        raise RpcError(
            StatusCode.UNAVAILABLE,
            f"connect to unix:{shown}: {err.strerror or err}",
            transport=True,
        ) from None
    except BaseException:
        sock.close()
        raise
    me = os.geteuid()
    if uid not in (0, me):  # ironclawd runs as root; a daemon of one's own, for development
        sock.close()
        raise RpcError(
            StatusCode.PERMISSION_DENIED,
            f"unix:{shown} is served by uid {uid}, neither root (ironclawd) nor you (uid {me}): "
            "nothing was sent to it; check --socket and IRONCLAW_ADMIN_SOCKET",
        )
    return sock


def _deadline_exceeded() -> RpcError:
    return RpcError(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")  # grpcio's words


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise _deadline_exceeded()
    return left


def _take_message(call: _Call, path: str) -> bytes | None:
    if call.headers is not None:
        status = call.headers.get(":status", "")
        if status != "200":
            code = _HTTP_STATUS.get(int(status) if status.isdigit() else 0, StatusCode.UNKNOWN)
            raise RpcError(code, f"{path}: HTTP status {status or 'missing'} from the server")
    if len(call.buffer) < _PREFIX.size:
        return None
    compressed, length = _PREFIX.unpack_from(call.buffer)
    if length > MAX_RECEIVE_BYTES:
        raise RpcError(
            StatusCode.RESOURCE_EXHAUSTED,
            f"Received message larger than max ({length} vs. {MAX_RECEIVE_BYTES})",
        )
    if compressed:
        raise RpcError(StatusCode.INTERNAL, f"{path}: a compressed message (none was offered)")
    if len(call.buffer) < _PREFIX.size + length:
        return None
    message = bytes(call.buffer[_PREFIX.size : _PREFIX.size + length])
    del call.buffer[: _PREFIX.size + length]
    return message


def _check_end(call: _Call, path: str) -> None:
    if call.buffer:
        raise RpcError(StatusCode.INTERNAL, f"{path}: the stream ended inside a message")
    fields = call.trailers or {}
    raw = fields.get("grpc-status")
    if raw is None:
        raise RpcError(StatusCode.UNKNOWN, f"{path}: the stream ended without a gRPC status")
    try:
        code = StatusCode(int(raw))
    except ValueError:
        code = StatusCode.UNKNOWN
    if code != StatusCode.OK:
        raise RpcError(code, percent_decoded(fields.get("grpc-message", "")))


class Stub:
    """A service's methods as callables, built from its descriptor: ``stub.Method(request,
    timeout=...)`` returns the response (unary) or an iterator of responses (server streaming),
    as grpcio's generated stubs do."""

    def __init__(self, channel: Channel, service: ServiceDescriptor) -> None:
        from google.protobuf import message_factory  # noqa: PLC0415 (only with a stub)

        for method in service.methods:
            if method.client_streaming:
                continue  # ironctl makes no client-streaming calls
            path = f"/{service.full_name}/{method.name}"
            response = message_factory.GetMessageClass(method.output_type)
            if method.server_streaming:
                setattr(self, method.name, _streaming(channel, path, response))
            else:
                setattr(self, method.name, _unary(channel, path, response))


def _unary(channel: Channel, path: str, response: type[Message]) -> Callable[..., Message]:
    def call(request: Message, timeout: float | None = None) -> Message:
        return _parsed(response, channel.unary_unary(path, request.SerializeToString(), timeout))

    return call


def _streaming(
    channel: Channel, path: str, response: type[Message]
) -> Callable[..., Iterator[Message]]:
    def call(request: Message, timeout: float | None = None) -> Iterator[Message]:
        messages = channel.unary_stream(path, request.SerializeToString(), timeout)
        return _parsed_each(response, messages)

    return call


def _parsed_each(
    response: type[Message], messages: Generator[bytes, None, None]
) -> Iterator[Message]:
    try:
        for data in messages:
            yield _parsed(response, data)
    finally:
        messages.close()


def _parsed(response: type[Message], data: bytes) -> Message:
    from google.protobuf.message import DecodeError  # noqa: PLC0415

    try:
        return response.FromString(data)
    except DecodeError as err:
        raise RpcError(StatusCode.INTERNAL, f"a response that does not parse: {err}") from None
