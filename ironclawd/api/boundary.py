"""The one boundary for bad input on every gRPC method (admin and sandbox sockets).

Before domain code runs, :func:`check_request` walks the request: strings have bounded length,
no NUL (outside message text) and, in ``*_json`` fields, JSON of bounded depth with finite
numbers, int64 integers and no lone surrogates; integers fit SQLite's int64; enums are known;
repeated fields are bounded, each and all of them together. :func:`guard` runs a handler:
domain errors keep their status (api/status.py), anything unexpected becomes INTERNAL with a
fixed message and an error id that the journal records with the traceback. Every message sent
back is clipped (:func:`clip`).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import secrets
from collections.abc import Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from ironclawd.api.status import code_for, trailer_for
from ironclawd.errors import InvalidArgument, IronclawError

log = logging.getLogger("ironclawd.api")

ECHO_CHARS = 64  # an echoed value, escaped
DETAILS_CHARS = 1024  # a whole status message; gRPC's metadata limit is 8 KiB
MAX_ID_CHARS = 256  # sid, id, agent, name, kind, hash, state, client_id
MAX_TEXT_CHARS = 16 * 1024 * 1024
MAX_JSON_DEPTH = 32
MAX_REPEATED = 10_000
# Items of repeated fields in one request, all fields together. Each field under MAX_REPEATED
# still let 4 MiB hold 2M empty tool calls, whose walk and conversion held the event loop ~3 s
# a call (found by a review); the walk stops before it goes past this many.
MAX_ITEMS = 10_000
INT64_MAX = 2**63 - 1
# Free text: NUL is data there (a message may carry anything the operator typed).
_TEXT_FIELDS = frozenset({"text", "persona", "description", "body"})
_ID_FIELDS = frozenset({"sid", "id", "agent", "name", "kind", "hash", "state", "client_id"})
INTERNAL_MESSAGE = "internal error; the daemon's journal has the details under error id {}"


def clip(value: object, limit: int = ECHO_CHARS) -> str:
    """``value`` for an error message: control characters and surrogates escaped, cut."""
    text = value if isinstance(value, str) else repr(value)
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_request(request: Message) -> None:
    """InvalidArgument naming the first field that is out of shape (see the module doc)."""
    _check_message(request, "", 0, [MAX_ITEMS])


def _check_message(msg: Message, prefix: str, depth: int, items_left: list[int]) -> None:
    """``items_left``: how many more repeated items the request may hold (one counter for the
    whole walk, taken from before a field's items are looked at)."""
    if depth > 8:
        raise InvalidArgument(f"{prefix or 'request'}: nested too deeply")
    for field, value in msg.ListFields():
        name = f"{prefix}{field.name}"
        if field.is_repeated:
            if len(value) > MAX_REPEATED:
                raise InvalidArgument(f"{name}: at most {MAX_REPEATED} items")
            items_left[0] -= len(value)
            if items_left[0] < 0:
                raise InvalidArgument(
                    f"{name}: more than {MAX_ITEMS} items in the request's repeated fields"
                )
            for index, item in enumerate(value):
                _check_value(field, item, f"{name}[{index}]", depth, items_left)
        else:
            _check_value(field, value, name, depth, items_left)


def _check_value(
    field: FieldDescriptor, value: Any, name: str, depth: int, items_left: list[int]
) -> None:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        _check_message(value, f"{name}.", depth + 1, items_left)
    elif kind == FieldDescriptor.TYPE_STRING:
        _check_string(field.name, value, name)
    elif kind == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type
        if enum is not None and enum.values_by_number.get(value) is None:
            raise InvalidArgument(f"{name}: unknown value {clip(value)}")
    elif isinstance(value, int) and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise InvalidArgument(f"{name}: expected an integer up to {INT64_MAX}")


def _check_string(field: str, value: str, name: str) -> None:
    if field in _ID_FIELDS and len(value) > MAX_ID_CHARS:
        raise InvalidArgument(f"{name}: at most {MAX_ID_CHARS} characters, got {len(value)}")
    if len(value) > MAX_TEXT_CHARS:
        raise InvalidArgument(f"{name}: at most {MAX_TEXT_CHARS} characters")
    if "\x00" in value and field not in _TEXT_FIELDS:
        raise InvalidArgument(f"{name}: NUL characters are not allowed, got {clip(value)}")
    if field.endswith("_json") and value:
        check_json(value, name, schema=field in _SCHEMA_FIELDS)


def check_json(text: str, name: str, *, schema: bool = False) -> None:
    """Refuse JSON that the domain could only choke on: too deep, non-finite or out-of-int64
    numbers, lone surrogates (escaped as ``\\ud800``; the wire's UTF-8 cannot carry them).
    ``schema``: a tool's JSON Schema, whose verdict is kept (below)."""
    kept = schema and len(text) <= CACHED_JSON_CHARS
    problem = _schema_verdict(text) if kept else _json_problem(text)
    if problem is not None:
        raise InvalidArgument(f"{name}: {problem}")


# The agent sends its tool definitions (JSON Schema texts) with every model call: the same texts
# each time, 44 us of parsing per call for six tools (the built-in ones are 109-276 characters).
# The verdict is a function of the text alone, so for tool schemas only it is kept: the last 256
# of at most 8 Ki characters (2 MiB of ASCII at most). Other JSON (a tool call's arguments, a
# change's payload) differs every time and may be anything a caller sent: never kept.
_SCHEMA_FIELDS = frozenset({"parameters_json", "input_schema_json"})
CACHED_JSON_CHARS = 8 * 1024


@functools.lru_cache(maxsize=256)
def _schema_verdict(text: str) -> str | None:
    return _json_problem(text)


def _json_problem(text: str) -> str | None:
    """What is wrong with ``text`` as JSON for the domain, or None."""
    depth = 0
    in_string = escaped = False
    # A depth scan before the recursive parser sees it, unless there are too few brackets to
    # nest that deep (str.count is C; the scan is a Python loop over every character).
    shallow = text.count("[") + text.count("{") <= MAX_JSON_DEPTH
    for ch in "" if shallow else text:
        if in_string:
            escaped = not escaped and ch == "\\"
            in_string = escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return f"JSON nested deeper than {MAX_JSON_DEPTH}"
        elif ch in "]}":
            depth -= 1
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=_int64, parse_float=_finite)
    except ValueError as exc:
        return f"not valid JSON: {clip(str(exc), 120)}"
    if _has_lone_surrogate(value):
        return "a string holds a lone surrogate"
    return None


def _no_constant(token: str) -> NoReturn:
    raise ValueError(f"{token} is not a JSON number")


def _finite(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"number {clip(token, 24)} is out of the float range")
    return value


def _int64(token: str) -> int:
    if len(token) > 20 or not -INT64_MAX - 1 <= int(token) <= INT64_MAX:
        raise ValueError(f"integer {clip(token, 24)} is out of the int64 range")
    return int(token)


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings = [item]
        elif isinstance(item, dict):
            strings = list(item)
            stack.extend(item.values())
        else:
            strings = []
            if isinstance(item, list):
                stack.extend(item)
        for s in strings:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


class Undecodable:
    """A request that did not parse (e.g. a string field that is not UTF-8). grpc answers a
    deserializer's exception with UNKNOWN and a Python class name; parsing leniently and
    refusing in the handler, after the caller is known, gives INVALID_ARGUMENT and the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserializer`` returning :class:`Undecodable` instead of raising."""
    if deserializer is None:
        return None
    parse = deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, ValueError, RecursionError) as exc:
            return Undecodable(f"malformed request: {clip(str(exc), 200)}")

    return deserialize


Context = grpc.aio.ServicerContext[Any, Any]


async def admit_request(request: Any, context: Context) -> None:
    """Abort with INVALID_ARGUMENT unless ``request`` parsed and is in shape."""
    if isinstance(request, Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
    if isinstance(request, Message):
        try:
            check_request(request)
        except InvalidArgument as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, clip(str(exc), DETAILS_CHARS))


async def refuse(exc: BaseException, method: str, context: Context) -> NoReturn:
    """Abort with the status ``exc`` stands for: a domain error's own, or INTERNAL with an id
    (an abort already under way passes through)."""
    if isinstance(exc, grpc.aio.AbortError):
        raise exc
    if isinstance(exc, IronclawError):
        trailer = trailer_for(exc)  # (none: the trailer set when the call was let in stays)
        if trailer:
            await context.abort(code_for(exc), clip(str(exc), DETAILS_CHARS), trailer)
        await context.abort(code_for(exc), clip(str(exc), DETAILS_CHARS))
    error_id = secrets.token_hex(6)
    log.error(
        "%s failed unexpectedly (error id %s)",
        method,
        error_id,
        exc_info=exc,
        extra={"IRONCLAW_ERROR_ID": error_id, "IRONCLAW_METHOD": method},
    )
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE.format(error_id))
    raise AssertionError("unreachable")
