"""The hardened unit of an MCP server (host/mcp.py): the settings it gets with and without
allowed destinations, and that its command line never carries a credential value."""

from __future__ import annotations

from pathlib import Path

from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.host.mcp import run_argv, unit_name, unit_properties

LIMITS = McpLimits(memory_max_bytes=123456789, tasks_max=17, cpu_quota_percent=30)
REQUIRED = {"DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
            "PrivateDevices=yes", "NoNewPrivileges=yes", "SystemCallFilter=@system-service",
            "MemoryMax=123456789", "TasksMax=17", "CPUQuota=30%",
            "InaccessiblePaths=-/var/lib/ironclaw", "InaccessiblePaths=-/run/ironclaw",
            "InaccessiblePaths=-/var/cache/ironclaw"}  # fmt: skip


def test_without_destinations_the_unit_has_no_network_at_all() -> None:
    props = unit_properties(LIMITS, [], None, hidden=["/srv/agents"])
    closed = {"PrivateNetwork=yes", "RestrictAddressFamilies=AF_UNIX", "IPAddressDeny=any",
              "InaccessiblePaths=-/srv/agents"}  # fmt: skip
    assert set(props) >= REQUIRED | closed
    assert not any(p.startswith(("IPAddressAllow=", "EnvironmentFile=")) for p in props)


def test_with_destinations_only_their_addresses_are_allowed() -> None:
    props = unit_properties(LIMITS, ["192.0.2.7", "2001:db8::1"], None)
    allowed = {"IPAddressDeny=any", "IPAddressAllow=192.0.2.7 2001:db8::1",
               "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6"}  # fmt: skip
    assert set(props) >= REQUIRED | allowed
    assert "PrivateNetwork=yes" not in props


def test_the_command_line_names_the_credentials_file_never_a_value() -> None:
    server = McpServer("gh", command=("/opt/gh-mcp", "stdio"), env=(("MODE", "ro"),),
                       credentials=(("GITHUB_TOKEN", "github"),))  # fmt: skip
    env_file = Path("/run/ironclaw/mcp-credentials/x/env.1234")
    argv = run_argv("demo", server, LIMITS, [], env_file)
    assert argv[:5] == ["/usr/bin/systemd-run", "--pipe", "--quiet", "--wait", "--collect"]
    assert "--unit=ironclaw-mcp-demo_gh.service" in argv
    assert f"--property=EnvironmentFile={env_file}" in argv
    assert "--setenv=MODE=ro" in argv
    assert argv[-3:] == ["--", "/opt/gh-mcp", "stdio"]
    assert not any("github" in a for a in argv)
    # Agent and server names cannot run into each other: '_' is in neither.
    assert unit_name("a-b", "c") != unit_name("a", "b-c")
