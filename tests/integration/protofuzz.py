"""Hypothesis strategies for hostile gRPC requests, encoded by hand so that field values can be
what no generated class would allow (tests/integration/test_api_fuzz.py)."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

from ironclawd.domain.changes import KINDS

AGENT = "fuzzbox"  # the agent the fuzzer's session runs (its config grants egress)


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    head = _varint(number << 3 | wire)
    return head + (_varint(len(payload)) + payload if wire == 2 else payload)


_JSON_HOSTILE = st.sampled_from(
    [
        "[" * 5000 + "]" * 5000,
        '{"a": ' * 200 + "1" + "}" * 200,
        '{"persona": "\\ud800"}',
        '{"tools": ["\\udfff"]}',
        '{"n": 123456789012345678901234567890}',
        '{"n": 1e999}',
        '{"n": NaN}',
        '{"persona": 5}',
        '{"tools": "read_file"}',
        '{"tools": [1, null]}',
        '{"rules": [{"host": "example.com", "methods": 5}]}',
        '{"rules": [{"host": "example.com", "scheme": [1]}]}',
        '{"rules": [{"host": "example.com", "path_prefixes": 7}]}',
        '{"rules": [{"host": ["a"]}]}',
        '{"rules": {"host": "a.com"}}',
        '{"mounts": [{"name": 1, "source": [], "read_only": "no"}]}',
        '{"mounts": 5}',
        '{"persona": "p", "provider": ["mock"], "model": {"a": 1}}',
        "[]",
        "5",
        '"text"',
        "",
    ]
)
_JSON_RANDOM = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
).map(json.dumps)
_TEXT = st.one_of(
    st.text(max_size=40).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [
            b"x" * 10_000,
            b"a\x00b",
            b"\xed\xa0\x80",  # a lone surrogate, UTF-8-encoded: not valid UTF-8
            b"\xff\xfe",
            b"\x1b[31mred\x1b[0m\r\n",
            b"demo",
            AGENT.encode(),
            b"../../etc/passwd",
        ]
        + [k.encode() for k in KINDS]
    ),
)
# Values that pass the boundary, so that the domain code behind it is reached too.
_PLAUSIBLE_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=20).map(str.encode),
    st.sampled_from([b"", b"demo", AGENT.encode(), b"pending", b"GET",
                     b"http://192.0.2.1/", b"https://example.com/"] + [k.encode() for k in KINDS]),
)  # fmt: skip
_PLAUSIBLE_BY_FIELD = {
    "sid": st.sampled_from([b"nosuchsid01", b"abcdefgh", b"z" * 32]),  # valid, unknown
    "kind": st.sampled_from([k.encode() for k in KINDS]),
    "agent": st.sampled_from([b"demo", AGENT.encode(), b"newagent-1"]),
    "name": st.sampled_from([b"demo", AGENT.encode(), b"x", b"accept"]),
    "method": st.sampled_from([b"GET", b"POST", b"get", b"TRACE"]),
    "url": st.sampled_from([b"http://192.0.2.1/", b"http://192.0.2.1:99999/", b"ftp://x",
                            b"http://[::1]/", b"http://192.0.2.1/" + b"a" * 5000]),
    "role": st.sampled_from([b"user"]),
}  # fmt: skip
_INTS = st.one_of(
    st.integers(0, 2**64 - 1),
    st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1, -1, 99]),
)


@st.composite
def _hostile(draw: Any, message: Descriptor, depth: int = 0, plausible: bool = False) -> bytes:
    """Fields of ``message`` with hostile values of the right wire type (some repeated); if
    ``plausible``, strings and integers that pass the boundary and JSON typed wrongly."""
    out = b""
    for field in message.fields:
        if not (plausible or draw(st.booleans())):
            continue
        for _ in range(draw(st.integers(1, 3)) if field.is_repeated else 1):
            kind = field.type
            if kind == FieldDescriptor.TYPE_MESSAGE:
                sub = field.message_type
                assert sub is not None  # a TYPE_MESSAGE field always names its message
                inner = b"" if depth > 2 else draw(_hostile(sub, depth + 1, plausible))
                out += _field(field.number, 2, inner)
            elif kind == FieldDescriptor.TYPE_STRING and field.name.endswith("_json"):
                text = draw(st.one_of(_JSON_HOSTILE, _JSON_RANDOM))
                out += _field(field.number, 2, text.encode("utf-8", "surrogatepass"))
            elif kind in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
                pick = _PLAUSIBLE_BY_FIELD.get(field.name, _PLAUSIBLE_TEXT)
                out += _field(field.number, 2, draw(pick if plausible else _TEXT))
            elif kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FIXED64):
                out += _field(field.number, 1, draw(st.binary(min_size=8, max_size=8)))
            elif kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_FIXED32):
                out += _field(field.number, 5, draw(st.binary(min_size=4, max_size=4)))
            elif plausible and kind == FieldDescriptor.TYPE_ENUM:
                assert field.enum_type is not None  # a TYPE_ENUM field always names its enum
                numbers = [v.number for v in field.enum_type.values]
                out += _field(field.number, 0, _varint(draw(st.sampled_from(numbers))))
            elif plausible:
                out += _field(field.number, 0, _varint(draw(st.integers(0, 1000))))
            else:  # varints: ints, bools, enums
                out += _field(field.number, 0, _varint(draw(_INTS)))
    return out


def _garbled(message: Descriptor) -> st.SearchStrategy[bytes]:
    def mutate(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
        buf = bytearray(data[: max(0, len(data) - cut)])
        for pos, value in flips:
            if buf:
                buf[pos % len(buf)] = value
        return bytes(buf)

    return st.builds(
        mutate,
        _hostile(message),
        st.integers(0, 4),
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    )


def requests_for(message: Descriptor) -> st.SearchStrategy[bytes]:
    """Random bytes, hostile valid encodings and garbled ones, in one strategy."""
    return st.one_of(
        st.binary(max_size=300),
        _hostile(message),
        _hostile(message, plausible=True),
        _hostile(message, plausible=True),
        _garbled(message),
        st.just(b"\x0a" + b"\xff" * 10),  # a length past the end
        st.just(b"\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"),  # an overlong varint
    )
