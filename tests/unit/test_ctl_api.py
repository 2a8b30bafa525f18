"""``ironctl api``'s pure parts against the admin API's own descriptors (what reflection hands
back is the same FileDescriptorProto): naming a method, JSON to request, proto text."""

from __future__ import annotations

import pytest
from grpc_reflection.v1alpha import reflection_pb2

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import api, exitcodes
from ironclawd.ctl.common import CtlError

ADMIN = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
REFLECTION = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
METHODS = [*ADMIN.methods, *REFLECTION.methods]


@pytest.mark.parametrize(
    "name",
    [
        "ironclaw.admin.v1.AdminService.GetAgent",
        "/ironclaw.admin.v1.AdminService/GetAgent",
        "ironclaw.admin.v1.AdminService/GetAgent",
        "AdminService.GetAgent",
        "GetAgent",
    ],
)
def test_a_method_is_found_by_any_usual_spelling(name: str) -> None:
    assert api.find_method(METHODS, name).full_name == "ironclaw.admin.v1.AdminService.GetAgent"


def test_an_unknown_method_is_refused_with_the_nearest_name() -> None:
    with pytest.raises(CtlError) as info:
        api.find_method(METHODS, "GetAgnt")
    assert info.value.exit_code == exitcodes.NOT_FOUND
    assert info.value.code == "UNKNOWN_METHOD"
    assert "unknown method 'GetAgnt'" in str(info.value)
    assert "did you mean ironclaw.admin.v1.AdminService.GetAgent?" in str(info.value)
    assert not api.method_matches("ironclaw.admin.v1.AdminService.GetAgent", "Agent")
    assert not api.method_matches("ironclaw.admin.v1.AdminService.GetAgent", "")


def test_a_name_shared_by_two_services_asks_for_the_full_name() -> None:
    twin = [ADMIN.methods_by_name["GetAgent"], ADMIN.methods_by_name["GetAgent"]]
    with pytest.raises(CtlError, match="more than one method"):
        api.find_method(twin, "GetAgent")


def test_json_becomes_the_request_message() -> None:
    method = ADMIN.methods_by_name["SessionLogs"]
    request = api.request_from_json(method, '{"sid": "abcd1234", "lines": 5, "follow": true}')
    assert (
        request.SerializeToString()
        == admin_pb2.SessionLogsRequest(sid="abcd1234", lines=5, follow=True).SerializeToString()
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"nam": "demo"}', 'no field named "nam"'),
        ('{"name": 3}', "name field"),
        ('{"name": ', "Failed to load JSON"),
    ],
)
def test_bad_json_is_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(CtlError) as info:
        api.request_from_json(ADMIN.methods_by_name["GetAgent"], text)
    assert info.value.exit_code == exitcodes.INVALID
    assert "request JSON for GetAgent (ironclaw.admin.v1.GetAgentRequest)" in str(info.value)
    assert named in str(info.value)
    assert "\n" not in str(info.value)


def test_a_method_that_reads_a_stream_of_requests_is_refused() -> None:
    with pytest.raises(CtlError) as info:
        api.request_from_json(REFLECTION.methods_by_name["ServerReflectionInfo"], "{}")
    assert info.value.exit_code == exitcodes.USAGE
    assert "is bidirectional" in str(info.value)
    assert "only unary and server-streaming methods" in str(info.value)


def test_describe_prints_proto_text_and_a_request_template() -> None:
    text = api.describe_method(ADMIN.methods_by_name["SessionLogs"])
    assert (
        "rpc SessionLogs(ironclaw.admin.v1.SessionLogsRequest) returns "
        "(stream ironclaw.admin.v1.SessionLogsResponse);" in text
    )
    assert "  uint32 lines = 2;" in text
    assert 'request JSON (defaults): {"sid": "", "lines": 0, "follow": false}' in text
    channel = api.describe_message(admin_pb2.Channel.DESCRIPTOR)
    assert "  map<string, uint64> counters = 7;" in channel
    assert "  repeated ironclaw.admin.v1.ChannelDelivery failures = 10;" in channel
    enum = api.describe_enum(admin_pb2.SessionState.DESCRIPTOR)
    assert "  SESSION_STATE_RUNNING = 3;" in enum
    assert api.describe_service(ADMIN).startswith("service ironclaw.admin.v1.AdminService {\n")


def test_replies_are_canonical_json_with_every_field() -> None:
    reply = admin_pb2.GetAgentResponse(agent=admin_pb2.Agent(name="demo", memory_bytes=1 << 28))
    doc = api.reply_to_dict(reply)
    assert doc["agent"]["name"] == "demo"
    assert doc["agent"]["tools"] == []
    assert doc["agent"]["memory_bytes"] == str(1 << 28)  # proto3 JSON: 64-bit as a string
