"""The request boundary (api/boundary.py): what it refuses and how it echoes."""

from __future__ import annotations

import json
import secrets

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ironclaw.admin.v1 import admin_pb2
from ironclaw.gateway.v1 import gateway_pb2
from ironclaw.model.v1 import model_pb2
from ironclawd.api.boundary import (
    CACHED_JSON_CHARS,
    ECHO_CHARS,
    MAX_ITEMS,
    MAX_REPEATED,
    Undecodable,
    _schema_verdict,
    check_json,
    check_request,
    clip,
    lenient,
)
from ironclawd.errors import InvalidArgument


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (admin_pb2.GetChangeRequest(id="x" * 10_000), "id"),
        (admin_pb2.SubmitChangeRequest(payload_json='{"a": "\\ud800"}'), "payload_json"),
        (admin_pb2.SubmitChangeRequest(payload_json="[" * 100 + "]" * 100), "payload_json"),
        (admin_pb2.SubmitChangeRequest(payload_json='{"a": 1e999}'), "payload_json"),
        (admin_pb2.SubmitChangeRequest(payload_json='{"a": NaN}'), "payload_json"),
        (admin_pb2.SubmitChangeRequest(payload_json='{"a": 99999999999999999999}'), "payload_json"),
        (admin_pb2.ListAuditRequest(after_seq=2**64 - 1), "after_seq"),
        (admin_pb2.GetSessionRequest(sid="a\x00b"), "sid"),
        (gateway_pb2.SubmitChangeRequest(payload_json='{"a": [1, 2'), "payload_json"),
        (
            model_pb2.CompleteRequest(
                messages=[model_pb2.Message(role=model_pb2.Role.ValueType(77))]
            ),
            "messages[0].role",
        ),
    ],
)
def test_out_of_shape_requests_are_refused_naming_the_field(request_: object, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_request(request_)  # type: ignore[arg-type]
    assert str(caught.value).startswith(field)
    assert len(str(caught.value)) < 300


def test_in_shape_requests_pass() -> None:
    check_request(admin_pb2.SendMessageRequest(sid="s1", text="nul \x00 is data in text"))
    check_request(admin_pb2.SubmitChangeRequest(kind="tools", payload_json='{"tools": ["fs"]}'))
    check_request(admin_pb2.ListAuditRequest(after_seq=2**63 - 1))


def test_clip_escapes_control_characters_and_cuts() -> None:
    assert clip("a\x1b[31m\ud800") == "a\\x1b[31m\\ud800"
    assert clip("é") == "é"
    assert len(clip("x" * 10_000)) == ECHO_CHARS


def test_lenient_deserializer_turns_garbage_into_a_refusal() -> None:
    parse = lenient(admin_pb2.GetSessionRequest.FromString)
    assert parse is not None
    assert isinstance(parse(b"\x0a\x02\xff\xfe"), Undecodable)  # a string that is not UTF-8


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=30,
))  # fmt: skip
def test_check_json_either_passes_or_refuses(value: object) -> None:
    try:
        text = json.dumps(value)
    except ValueError:
        return
    try:
        check_json(text, "payload_json")
    except InvalidArgument as exc:
        refusal = str(exc)
    else:
        return
    assert refusal.startswith("payload_json: ")


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("[" * 32 + "]" * 32, False),  # as deep as allowed: 32 brackets, no scan needed
        ("[" * 33 + "]" * 33, True),
        ("[" * 20 + "{" * 13 + "}" * 13 + "]" * 20, True),
        ('{"a": "' + "[" * 40 + '"}', False),  # many brackets, all in a string: scanned, depth 1
        ("[" * 16 + '"' + "[" * 40 + '"' + "]" * 16, False),
    ],
)
def test_json_deeper_than_allowed_is_refused_before_parsing(text: str, refused: bool) -> None:
    if refused:
        with pytest.raises(InvalidArgument, match="JSON nested deeper than 32"):
            check_json(text, "arguments_json")
    else:
        check_json(text, "arguments_json")


def test_only_tool_schemas_have_their_verdict_kept_and_each_refusal_names_its_own_field() -> None:
    nonce = secrets.token_hex(8)  # texts no other test has checked (the cache is the module's)
    schema = json.dumps({"type": "object", "properties": {"path": {"description": nonce}}})
    bad = '{"n": 1e999, "m": "' + nonce + '"}'
    arguments = json.dumps({"path": nonce})

    def request(parameters: str) -> model_pb2.CompleteRequest:
        call = model_pb2.ToolCall(id="c1", name="read_file", arguments_json=arguments)
        return model_pb2.CompleteRequest(
            messages=[model_pb2.Message(role=model_pb2.ROLE_ASSISTANT, tool_calls=[call])],
            tools=[model_pb2.ToolDefinition(name=n, parameters_json=parameters) for n in "ab"],
        )

    before = _schema_verdict.cache_info()
    check_request(request(schema))  # two tools, one text: checked once, then its kept verdict
    after = _schema_verdict.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    assert after.currsize == before.currsize + 1  # the schema; never the call's arguments
    for _ in range(2):
        with pytest.raises(InvalidArgument, match=r"^tools\[0\]\.parameters_json: not valid JSON"):
            check_request(request(bad))
    assert _schema_verdict.cache_info().hits - after.hits == 1  # the second refusal's, kept
    # Outside tool schemas, the same bad text is refused as ever, under its own name.
    with pytest.raises(InvalidArgument, match=r"^arguments_json: not valid JSON"):
        check_json(bad, "arguments_json")
    # Longer schemas are checked every time, and refused the same way.
    deep = "[" * 20 + "{" * 13 + " " * CACHED_JSON_CHARS + "}" * 13 + "]" * 20
    for _ in range(2):
        with pytest.raises(InvalidArgument, match=r"parameters_json: JSON nested deeper than 32"):
            check_request(request(deep))
    assert _schema_verdict.cache_info().currsize == after.currsize + 1  # the bad one, not deep


def test_repeated_items_are_bounded_over_the_whole_request_not_only_per_field() -> None:
    """Each field under MAX_REPEATED, but 2M empty tool calls in all fit in 4 MiB: walking and
    converting them held the event loop ~3 s per call (found by a review), at 50 calls a
    second. The walk now stops once the request holds more than MAX_ITEMS items in all."""
    assert MAX_ITEMS == MAX_REPEATED
    calls = [model_pb2.ToolCall() for _ in range(MAX_REPEATED - 1)]
    message = model_pb2.Message(role=model_pb2.ROLE_ASSISTANT, tool_calls=calls)
    check_request(model_pb2.CompleteRequest(messages=[message]))  # MAX_ITEMS in all: taken
    whole = model_pb2.CompleteRequest(messages=[message] * 3)
    with pytest.raises(InvalidArgument, match=rf"^messages\[0\]\.tool_calls: .* {MAX_ITEMS} "):
        check_request(whole)
