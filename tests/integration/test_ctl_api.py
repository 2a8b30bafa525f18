"""``ironctl api list|describe|call`` over the real daemon's admin socket, through its server
reflection: the same answers as ironctl's own commands, the same refusals for a host user the
daemon does not admit, one JSON object per line for a stream."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.integration

SOCKET = "/run/ironclaw/admin.sock"
ADMIN = "ironclaw.admin.v1.AdminService"


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode() + (proc.stderr or b"").decode()


def ctl(daemon: Any, *argv: str, user: str | None = None, code: int = 0) -> str:
    proc = daemon.run(["ironctl", *argv], user=user, timeout=120)
    assert proc.returncode == code, out(proc)
    return str(proc.stdout.decode())


@pytest.fixture
def open_socket(daemon: Any) -> Iterator[None]:
    """The socket's mode opened to everyone, so that only the daemon's peer check stands."""
    daemon.run(["chmod", "0666", SOCKET], check=True)
    yield
    daemon.run(["chmod", "0660", SOCKET], check=True)


def test_list_and_describe_show_what_the_daemon_serves(daemon: Any) -> None:
    services = ctl(daemon, "api", "list").split()
    assert {ADMIN, "grpc.health.v1.Health"} <= set(services)
    methods = ctl(daemon, "api", "list", "AdminService").split()
    assert {f"{ADMIN}.GetAgent", f"{ADMIN}.SessionLogs"} <= set(methods)
    text = ctl(daemon, "api", "describe", f"{ADMIN}.GetAgent")
    assert "rpc GetAgent(ironclaw.admin.v1.GetAgentRequest) returns " in text
    assert "message ironclaw.admin.v1.GetAgentRequest {\n  string name = 1;\n}" in text
    doc = json.loads(ctl(daemon, "api", "describe", "--json", "ironclaw.admin.v1.Agent"))
    assert doc["kind"] == "message"
    assert "persona" in [f["name"] for f in doc["descriptor"]["field"]]


def test_a_call_answers_as_the_normal_command_does(daemon: Any) -> None:
    by_api = json.loads(ctl(daemon, "api", "call", f"{ADMIN}.GetAgent", '{"name": "demo"}'))
    by_ctl = json.loads(ctl(daemon, "agent", "show", "demo", "--json"))
    for key in ("name", "persona", "provider", "model", "tools", "view_json"):
        assert by_api["agent"][key] == by_ctl[key], key
    status = json.loads(ctl(daemon, "api", "call", "/" + ADMIN + "/GetStatus", user="alice"))
    assert status["caller"]["user_name"] == "alice"
    # The daemon's own refusal comes back as for any command: status, message, exit code.
    proc = daemon.run(["ironctl", "--json", "api", "call", "GetAgent", '{"name": "nobody"}'])
    assert proc.returncode == 5, out(proc)
    assert json.loads(proc.stdout)["error"]["code"] == "NOT_FOUND"


def test_a_host_user_the_daemon_refuses_is_refused_through_api_too(
    daemon: Any, open_socket: None
) -> None:
    uid = daemon.run(["id", "-u", "outsider"]).stdout.decode().strip()
    refusals = []
    for argv in (
        ["status"],
        ["api", "call", f"{ADMIN}.GetStatus"],
        ["api", "list"],
    ):
        proc = daemon.run(["ironctl", "--json", *argv], user="outsider")
        assert proc.returncode == 4, out(proc)
        error = json.loads(proc.stdout)["error"]
        # The same refusal each time; only the caller's pid differs.
        refusals.append((error["code"], re.sub(r" pid \d+ ", " pid N ", error["message"])))
    assert set(refusals) == {
        (
            "PERMISSION_DENIED",
            f"uid {uid} (outsider) pid N is not a member of group 'ironclaw-admin'",
        )
    }


def test_bad_input_is_refused_before_anything_is_sent(daemon: Any) -> None:
    proc = daemon.run(["ironctl", "api", "call", "GetAgent", '{"nmae": "demo"}'])
    assert proc.returncode == 7, out(proc)
    assert 'no field named "nmae"' in out(proc)
    proc = daemon.run(["ironctl", "api", "call", "GetAgnt", "{}"])
    assert proc.returncode == 5, out(proc)
    assert "unknown method 'GetAgnt'; did you mean ironclaw.admin.v1.AdminService.GetAgent?" in out(
        proc
    )
    proc = daemon.run(["ironctl", "api", "call", "ServerReflectionInfo", "{}"])
    assert proc.returncode == 2, out(proc)
    assert "is bidirectional" in out(proc)


def test_a_stream_prints_one_json_object_per_line(daemon: Any) -> None:
    # Health.Watch streams until the deadline: the first answer, then DEADLINE_EXCEEDED (8).
    proc = daemon.run(
        ["ironctl", "api", "call", "--timeout", "2", "grpc.health.v1.Health.Watch", "-"],
        input=b'{"service": "ironclaw.admin.v1.AdminService"}',
    )
    assert proc.returncode == 8, out(proc)
    first = proc.stdout.decode().splitlines()[0]
    assert json.loads(first) == {"status": "SERVING"}
