"""Runs inside the private systemd (as root, like ironclawd): the real McpClients over the remote
launcher, configured as the daemon is in tests/integration/test_mcp_remote.py (internal_cidrs,
ca_file, the host credential store), listing and calling a remote server; prints one JSON line.

    python -m tests.integration.mcp_remote_driver SERVER_JSON CA_FILE
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import sys
from pathlib import Path
from typing import Any

from ironclawd import paths
from ironclawd.domain.egress import EgressLimits
from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.errors import McpServerFailed
from ironclawd.host.mcp_remote import RemoteMcpLauncher
from ironclawd.net.http import tls_context
from ironclawd.net.resolver import SystemResolver
from ironclawd.services.mcp_servers import McpSupervisor
from ironclawd.store.credentials import CredentialStore


async def main(raw: dict[str, Any], ca_file: str) -> dict[str, Any]:
    server = McpServer(raw["name"], url=raw["url"],
                       credentials=tuple(tuple(kv) for kv in raw["credentials"]))  # fmt: skip
    limits = McpLimits(connect_timeout_seconds=30.0)
    egress = EgressLimits(internal_cidrs=(ipaddress.ip_network("203.0.113.0/24"),))
    launcher = RemoteMcpLauncher(
        CredentialStore(paths.MASTER_KEY_FILE.parent), limits, egress, SystemResolver(),
        lambda *a, **f: None, lambda: tls_context(Path(ca_file)),
    )  # fmt: skip
    clients = McpSupervisor(launcher, limits)
    try:
        tools = await clients.list_tools("demo", server)
        result = await clients.call_tool("demo", server, "echo", {"text": "hello remote"})
        try:
            await clients.call_tool("demo", server, "big", {"kilobytes": 8 * 1024})
            big = "answered"
        except McpServerFailed as exc:
            big = str(exc)
        return {"tools": {t.name: t.digest for t in tools},
                "echo": {"text": result.text, "is_error": result.is_error}, "big": big}  # fmt: skip
    finally:
        await clients.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1]), sys.argv[2]))))
