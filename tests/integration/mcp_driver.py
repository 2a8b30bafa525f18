"""Runs inside the private systemd (as root, like ironclawd): the real McpClients (the
supervisor over hardened units) against the real PyPI servers and the hostile one, printing one
JSON document of what happened for tests/integration/test_mcp_host.py to check.

    python -m tests.integration.mcp_driver SCENARIO VENV [ARG...]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.errors import McpServerFailed
from ironclawd.host.mcp import SystemdMcpLauncher, unit_name
from ironclawd.services.mcp_servers import McpSupervisor
from tests.fakes.host import FakeCredentials
from tests.harness.mcp_venv import HOSTILE

SECRET = "mcp-secret-value-7f3a9c"
LIMITS = McpLimits(
    connect_timeout_seconds=60.0, list_timeout_seconds=30.0, call_timeout_seconds=8.0,
    max_output_bytes=256 * 1024, max_message_bytes=4 * 1024 * 1024,
    backoff_initial_seconds=0.5, backoff_max_seconds=2.0,
)  # fmt: skip


def _supervisor(hidden: tuple[str, ...] = ()) -> McpSupervisor:
    launcher = SystemdMcpLauncher(FakeCredentials(tok=SECRET), LIMITS, hidden)
    return McpSupervisor(launcher, LIMITS)


async def _call(clients: McpSupervisor, agent: str, server: McpServer, tool: str,
                **args: Any) -> dict[str, Any]:  # fmt: skip
    started = time.monotonic()
    try:
        r = await clients.call_tool(agent, server, tool, args)
    except McpServerFailed as exc:
        return {"failed": str(exc), "seconds": time.monotonic() - started}
    return {"text": r.text[:2000], "is_error": r.is_error, "truncated": r.truncated,
            "bytes": len(r.text.encode()), "seconds": time.monotonic() - started}  # fmt: skip


async def time_server(venv: Path, spec: str) -> dict[str, Any]:
    raw = json.loads(spec)
    server = McpServer(raw["name"], command=tuple(raw["command"]))
    clients = _supervisor()
    try:
        tools = await clients.list_tools("demo", server)
        now = await _call(clients, "demo", server, "get_current_time", timezone="UTC")
        return {"tools": {t.name: t.digest for t in tools}, "now": now}
    finally:
        await clients.close()


async def git_server(venv: Path, repo: str) -> dict[str, Any]:
    server = McpServer("git", command=(str(venv / "bin/mcp-server-git"), "--repository", repo),
                       # The repository belongs to root; the dynamic user is told it is safe.
                       env=(("GIT_CONFIG_COUNT", "1"), ("GIT_CONFIG_KEY_0", "safe.directory"),
                            ("GIT_CONFIG_VALUE_0", "*")))  # fmt: skip
    clients = _supervisor()
    try:
        tools = [t.name for t in await clients.list_tools("demo", server)]
        log = await _call(clients, "demo", server, "git_log", repo_path=repo, max_count=5)
        status = await _call(clients, "demo", server, "git_status", repo_path=repo)
        commit = await _call(clients, "demo", server, "git_commit", repo_path=repo,
                             message="from the server")  # fmt: skip
        return {"tools": tools, "log": log, "status": status, "commit": commit}
    finally:
        await clients.close()


async def hostile(venv: Path, other_agent_dir: str) -> dict[str, Any]:
    py = str(venv / "bin/python3")
    # Beside the venv: a checkout below /root or /home would be hidden from the units.
    script = str(venv / "mcp_hostile.py")
    shutil.copyfile(HOSTILE, script)
    os.chmod(script, 0o644)
    good = McpServer("good", command=(py, script))
    evil = McpServer("evil", command=(py, script), credentials=(("TOKEN", "tok"),))
    looping = McpServer("loop", command=(py, script), env=(("HOSTILE_MODE", "crash"),))
    clients = _supervisor(hidden=(other_agent_dir,))
    out: dict[str, Any] = {}
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    other = socket.create_server(("127.0.0.2", 0))
    other_port = other.getsockname()[1]
    allowed = McpServer("allowed", command=(py, script), allow=(f"127.0.0.1:{port}",))
    try:
        out["good_first"] = await _call(clients, "agent-b", good, "write",
                                        path="/tmp/secret-b", text="b's")  # fmt: skip
        out["credential_in_env"] = await _call(clients, "agent-a", evil, "env", name="TOKEN")
        show = await asyncio.to_thread(_sh, "systemctl", "show", unit_name("agent-a", "evil"))
        cmdlines = await asyncio.to_thread(_cmdlines)
        out["secret_in_systemctl_show"] = SECRET in show
        out["secret_in_any_argv"] = SECRET.encode() in cmdlines
        out["load_credential_shown"] = [ln for ln in show.splitlines() if "Credential" in ln]
        for name, path in (("shadow", "/etc/shadow"), ("state", "/var/lib/ironclaw/state.db"),
                           ("run", "/run/ironclaw/admin.sock"),
                           ("other_tmp", "/tmp/secret-b"),
                           ("other_agent", f"{other_agent_dir}/notes.txt"),
                           ("root_home", "/root/.bashrc")):  # fmt: skip
            out[f"read_{name}"] = await _call(clients, "agent-a", evil, "read", path=path)
        out["write_etc"] = await _call(
            clients, "agent-a", evil, "write", path="/etc/evil", text="x"
        )
        out["connect"] = await _call(clients, "agent-a", evil, "connect", host="127.0.0.1",
                                     port=port)  # fmt: skip
        out["connect_out"] = await _call(clients, "agent-a", evil, "connect", host="1.1.1.1",
                                         port=53)  # fmt: skip
        # With --allow: the allowed address is reachable, any other is not.
        out["allowed_connect"] = await _call(clients, "agent-a", allowed, "connect",
                                             host="127.0.0.1", port=port)  # fmt: skip
        out["allowed_connect_other"] = await _call(clients, "agent-a", allowed, "connect",
                                                   host="127.0.0.2", port=other_port)  # fmt: skip
        await clients.stop("agent-a", "allowed")
        # 50 MB answer: refused at the transport cap; the good server keeps answering.
        out["big"] = await _call(clients, "agent-a", evil, "big", megabytes=50)
        out["good_after_big"] = await _call(clients, "agent-b", good, "echo", text="ok")
        # A hang: while it lasts, the good server answers and the event loop ticks.
        await asyncio.sleep(LIMITS.backoff_max_seconds)
        hung = asyncio.create_task(_call(clients, "agent-a", evil, "hang"))
        ticks = []
        while not hung.done():
            t0 = time.monotonic()
            await _call(clients, "agent-b", good, "echo", text="tick")
            ticks.append(time.monotonic() - t0)
            await asyncio.sleep(0.2)
        out["hang"] = await hung
        out["good_during_hang_max_seconds"] = max(ticks)
        out["good_during_hang_calls"] = len(ticks)
        # A crash loop: every start fails; restarts are held off, doubling.
        loop_results = []
        for _ in range(4):
            loop_results.append(await _call(clients, "agent-a", looping, "echo", text="x"))
            await asyncio.sleep(0.3)
        out["crash_loop"] = loop_results
        out["good_at_end"] = await _call(clients, "agent-b", good, "echo", text="still here")
        out["running"] = clients.running()
        unit = unit_name("agent-b", "good")
        out["analyze"] = await asyncio.to_thread(
            _sh, "systemd-analyze", "security", "--no-pager", unit
        )
        return out
    finally:
        listener.close()
        other.close()
        await clients.close()
        out["units_left"] = (
            await asyncio.to_thread(
                _sh, "systemctl", "list-units", "--all", "--plain", "--no-legend", "ironclaw-mcp-*"
            )
        ).strip()


def _sh(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.stdout + proc.stderr


def _cmdlines() -> bytes:
    out = b""
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out += path.read_bytes()
        except OSError:
            continue  # the process ended
    return out


def main() -> None:
    scenario, venv, *rest = sys.argv[1:]
    run = {"time": time_server, "git": git_server, "hostile": hostile}[scenario]
    os.umask(0o022)
    result = asyncio.run(run(Path(venv), *rest))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
