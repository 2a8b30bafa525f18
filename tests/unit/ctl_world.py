"""A stub admin service answering every method ironctl calls with one fixed world (a session, a
change, an agent with a skill, a package, routes and permissions, an MCP server, a channel, a
held message), and the arguments that run each ironctl command against it. The output tests
(test_ctl_json.py, test_ctl_tables.py) use it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.changes import agent_view, canonical
from ironclawd.domain.kinds.skills import KIND as SKILLS
from tests.unit import skill_samples

T = 1_764_576_000.25  # 2025-12-01 08:00:00.25 UTC
BIG = 2**40  # a 64-bit value that protobuf's own JSON mapping would print as a string
SHA = "0123456789abcdef" * 4

SESSION = admin_pb2.Session(
    sid="abcdefgh0001", agent="demo", state=admin_pb2.SESSION_STATE_RUNNING, created_at=T,
    updated_at=T + 1, last_active_at=T + 2, unit="ironclaw-sbx-abcdefgh0001.service",
    netns="ironclaw-abcdefgh0001", platform="systrap",
)  # fmt: skip
CHANGE = admin_pb2.Change(
    id="c0ffee0001", kind="persona", agent="demo", payload_json='{"persona": "You are terse."}',
    reason="shorter answers", submitter="uid:0(root)", before_json="{}", after_json="{}",
    hash=SHA, created_at=T, expires_at=T + 86400, state="pending",
    diff=['-persona: "You help."', '+persona: "You are terse."'],
)  # fmt: skip
PACKAGE = {"name": "jq", "version": "1.6-2.1", "architecture": "amd64", "sha256": SHA,
           "size": 64_252, "requested": True}  # fmt: skip
ROUTE = {"channel": "chat", "where": "!room:m.example", "engage": "mention"}
PERMISSIONS = {"allow": ["chat:@alice:m.example"], "unknown": "hold", "approvers": {}}
TOOL = {"name": "get_current_time", "description": "What time it is.", "input_schema": "{}"}
MCP_VIEW = {
    "mcp_servers": [{"name": "time", "command": ["/opt/mcp/bin/mcp-server-time"], "env": {},
                     "credentials": {}, "network": "none", "tools": [TOOL]}],
    "mcp_grants": [{"tool": "mcp__time__get_current_time", "server": "time",
                    "name": "get_current_time", "digest": SHA}],
}  # fmt: skip
DELIVERY = admin_pb2.ChannelDelivery(
    delivery_id="abcdefgh0001-3", state="pending", attempts=4, last_error="HTTP 502",
    updated_at=T, next_at=0,
)  # fmt: skip
CHANNEL = admin_pb2.Channel(
    name="chat", kind="matrix", connected=True, detail="https://m.example as @bot:m.example",
    counters={"received": BIG, "queued": 3}, deliveries={"delivered": 3, "pending": 1}, held=1,
    failures=[DELIVERY],
)  # fmt: skip
HELD = admin_pb2.HeldMessage(
    id="1", channel="chat", where="!room:m.example", sender="chat:@eve:m.example",
    event_id="$ev1", text="hello?", received_at=T,
)  # fmt: skip
REPLY = admin_pb2.Reply(seq=BIG + 1, in_reply_to=BIG, created_at=T, text="hi", chain=SHA)
AUDIT = [
    json.dumps({"seq": 1, "time": T, "event": "daemon.started", "actor": "system", "prev": SHA,
                "mac": SHA, "version": "0.1.0"}),
    json.dumps({"seq": 2, "time": T + 1, "event": "change.submitted", "actor": "uid:0(root)",
                "prev": SHA, "mac": SHA, "change": CHANGE.id}),
]  # fmt: skip
CHECKS = [
    admin_pb2.Check(name="runsc.version", status=admin_pb2.CHECK_STATUS_PASS,
                    detail="runsc release-20240401.0", required=True, duration_seconds=0.25),
    admin_pb2.Check(name="runsc.platform.kvm", status=admin_pb2.CHECK_STATUS_SKIP,
                    detail="no /dev/kvm", fix_hint="load the kvm module for a faster platform"),
]  # fmt: skip


def demo_agent() -> admin_pb2.Agent:
    spec = SKILLS.apply(
        replace(AgentSpec("demo"), persona="You help.\nBriefly."),
        SKILLS.parse(skill_samples.payload("weather", skill_samples.files())),
    )
    view = {**(agent_view(spec) or {}), "packages": [PACKAGE], "wiring": [ROUTE],
            "permissions": PERMISSIONS}  # fmt: skip
    return admin_pb2.Agent(
        name="demo", persona=spec.persona, provider="mock", model="mock-1",
        tools=["read_file", "list_files"], memory_bytes=BIG, tasks_max=64, cpu_percent=100,
        view_json=canonical(view),
    )  # fmt: skip


class Stub:
    """Every admin method ironctl calls, answered from the world above."""

    def __init__(self, channel: Any) -> None:
        self.agent = demo_agent()

    def GetStatus(self, *_: Any, **__: Any) -> admin_pb2.GetStatusResponse:
        caller = admin_pb2.Caller(uid=0, gid=0, pid=4242, user_name="root")
        return admin_pb2.GetStatusResponse(
            version="0.1.0", uptime_seconds=12.5, caller=caller, config_path="/etc/x.toml",
            runsc_version="release-20240401.0", runsc_platform="systrap", pid=99, state="running",
        )  # fmt: skip

    def Doctor(self, *_: Any, **__: Any) -> admin_pb2.DoctorResponse:
        return admin_pb2.DoctorResponse(checks=CHECKS)

    def _session(self, *_: Any, **__: Any) -> Any:
        return admin_pb2.GetSessionResponse(session=SESSION)

    CreateSession = GetSession = StartSession = StopSession = _session

    def ListSessions(self, *_: Any, **__: Any) -> admin_pb2.ListSessionsResponse:
        return admin_pb2.ListSessionsResponse(sessions=[SESSION])

    def RemoveSession(self, *_: Any, **__: Any) -> admin_pb2.RemoveSessionResponse:
        return admin_pb2.RemoveSessionResponse()

    def SessionLogs(self, *_: Any, **__: Any) -> Iterator[admin_pb2.SessionLogsResponse]:
        yield admin_pb2.SessionLogsResponse(timestamp=T, message="started", source="runsc")

    def SendMessage(self, *_: Any, **__: Any) -> admin_pb2.SendMessageResponse:
        return admin_pb2.SendMessageResponse(seq=BIG, replies_before=BIG)

    def WatchReplies(self, *_: Any, **__: Any) -> Iterator[admin_pb2.WatchRepliesResponse]:
        yield admin_pb2.WatchRepliesResponse(reply=REPLY)

    def VerifySession(self, *_: Any, **__: Any) -> admin_pb2.VerifySessionResponse:
        return admin_pb2.VerifySessionResponse(checked=BIG, ok=True)

    def _change(self, *_: Any, **__: Any) -> Any:
        return admin_pb2.GetChangeResponse(change=CHANGE)

    SubmitChange = GetChange = ApproveChange = RejectChange = _change

    def ListChanges(self, *_: Any, **__: Any) -> admin_pb2.ListChangesResponse:
        return admin_pb2.ListChangesResponse(changes=[CHANGE])

    def ListAgents(self, *_: Any, **__: Any) -> admin_pb2.ListAgentsResponse:
        return admin_pb2.ListAgentsResponse(agents=[self.agent])

    def GetAgent(self, *_: Any, **__: Any) -> admin_pb2.GetAgentResponse:
        return admin_pb2.GetAgentResponse(agent=self.agent)

    def ProbeMcpServer(self, *_: Any, **__: Any) -> admin_pb2.ProbeMcpServerResponse:
        return admin_pb2.ProbeMcpServerResponse(tools_json=json.dumps([TOOL]))

    def ListMcpServers(self, *_: Any, **__: Any) -> admin_pb2.ListMcpServersResponse:
        return admin_pb2.ListMcpServersResponse(view_json=json.dumps(MCP_VIEW))

    def ListAudit(self, *_: Any, **__: Any) -> admin_pb2.ListAuditResponse:
        return admin_pb2.ListAuditResponse(records=AUDIT)

    def VerifyAudit(self, *_: Any, **__: Any) -> admin_pb2.VerifyAuditResponse:
        return admin_pb2.VerifyAuditResponse(ok=True, records=BIG, append_only=True)

    def ListChannels(self, *_: Any, **__: Any) -> admin_pb2.ListChannelsResponse:
        return admin_pb2.ListChannelsResponse(channels=[CHANNEL])

    def GetChannel(self, *_: Any, **__: Any) -> admin_pb2.GetChannelResponse:
        return admin_pb2.GetChannelResponse(channel=CHANNEL)

    def TestChannel(self, *_: Any, **__: Any) -> admin_pb2.TestChannelResponse:
        return admin_pb2.TestChannelResponse(detail="logged in as @bot:m.example")

    def ListHeld(self, *_: Any, **__: Any) -> admin_pb2.ListHeldResponse:
        return admin_pb2.ListHeldResponse(held=[HELD])

    def AdmitHeld(self, *_: Any, **__: Any) -> admin_pb2.AdmitHeldResponse:
        return admin_pb2.AdmitHeldResponse(admission="queued", sid=SESSION.sid, seq=BIG)

    def DropHeld(self, *_: Any, **__: Any) -> admin_pb2.DropHeldResponse:
        return admin_pb2.DropHeldResponse()


def arguments(files: Path) -> dict[str, list[str]]:
    """Each command's name (as tests/harness/ctl_commands.py names it) and the arguments that
    run it against Stub; ``files`` is a directory for the offline commands' inputs."""
    key = files / "skills.key"
    key.write_text(skill_samples.KEY.to_file())
    pub = files / "skills.pub"
    pub.write_text(skill_samples.KEY.public_key().to_file())
    signed = str(skill_samples.write_folder(files / "signed"))
    unsigned = str(skill_samples.write_folder(files / "unsigned", signature=None))
    sid, change = SESSION.sid, CHANGE.id
    return {
        "status": ["status"],
        "doctor": ["doctor"],
        "session create": ["session", "create", "--agent", "demo"],
        **{f"session {verb}": ["session", verb, sid]
           for verb in ("show", "start", "stop", "rm", "logs", "verify")},
        "session list": ["session", "list"],
        "send": ["send", sid, "hello"],
        "change submit": ["change", "submit", "--kind", "persona", "--agent", "demo",
                          "--persona", "You are terse."],
        "change list": ["change", "list"],
        "change pending": ["change", "pending"],
        **{f"change {verb}": ["change", verb, change] for verb in ("show", "diff")},
        "change approve": ["change", "approve", change, "--yes"],
        "change reject": ["change", "reject", change, "--yes"],
        "agent list": ["agent", "list"],
        "agent show": ["agent", "show", "demo"],
        "agent create": ["agent", "create", "helper", "--persona", "You help."],
        "audit list": ["audit", "list"],
        "audit verify": ["audit", "verify"],
        "skill add": ["skill", "add", signed, "--agent", "demo"],
        "skill remove": ["skill", "remove", "weather", "--agent", "demo"],
        "skill list": ["skill", "list"],
        "skill show": ["skill", "show", "weather", "--agent", "demo"],
        "skill sign": ["skill", "sign", unsigned, "--key", str(key)],
        "skill manifest": ["skill", "manifest", signed],
        "skill verify": ["skill", "verify", signed, "--pubkey", str(pub)],
        "mcp add": ["mcp", "add", "time", "--agent", "demo", "--command",
                    "/opt/mcp/bin/mcp-server-time"],
        "mcp grant": ["mcp", "grant", "time", "get_current_time", "--agent", "demo"],
        "mcp list": ["mcp", "list", "--agent", "demo"],
        "mcp show": ["mcp", "show", "time", "--agent", "demo"],
        "mcp remove": ["mcp", "remove", "time", "--agent", "demo"],
        "package list": ["package", "list"],
        "package add": ["package", "add", "ripgrep", "--agent", "demo"],
        "package remove": ["package", "remove", "jq", "--agent", "demo"],
        "package set": ["package", "set", "jq", "ripgrep", "--agent", "demo"],
        "wiring list": ["wiring", "list"],
        "wiring show": ["wiring", "show", "demo"],
        "permissions show": ["permissions", "show", "demo"],
        "channel list": ["channel", "list"],
        "channel show": ["channel", "show", "chat"],
        "channel test": ["channel", "test", "chat"],
        "channel held": ["channel", "held"],
        "channel admit": ["channel", "admit", "1"],
        "channel drop": ["channel", "drop", "1"],
    }  # fmt: skip
