"""``ironctl mcp ...``: register MCP servers for an agent, grant their tools, list, show and
remove them. Registering probes the server first (in its own hardened unit, no network, no
credentials) so that the change a human approves shows the tools it offers."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import TYPE_CHECKING, Any

from rich.text import Text

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render, terminal
from ironclawd.ctl.changes import show_change
from ironclawd.ctl.common import UsageError

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def _pairs(items: list[str] | None, flag: str) -> list[list[str]]:
    out = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"ironctl: mcp: {flag} expects NAME=VALUE, got {item!r}")
        out.append([key, value])
    return out


def _command(words: list[str]) -> list[str]:
    # One word with spaces is a whole command line (how arguments starting with '-' get in).
    if len(words) == 1 and any(c.isspace() for c in words[0]):
        try:
            return shlex.split(words[0])
        except ValueError as exc:
            raise UsageError(f"ironctl: mcp add: --command: {exc}") from None
    return words


def _submit(args: argparse.Namespace, stub: Stub, payload: dict[str, Any], what: str) -> int:
    request = admin_pb2.SubmitChangeRequest(
        kind="mcp", agent=args.agent, payload_json=json.dumps(payload), reason=args.reason or ""
    )
    change = stub.SubmitChange(request, timeout=args.timeout).change
    if not args.json:
        print(f"agent {render.visible(args.agent)}: {what}: mcp change {change.id} is pending a "
              "human decision")  # fmt: skip
    show_change(args, change)
    return exitcodes.OK


def cmd_add(args: argparse.Namespace, stub: Stub) -> int:
    # Neither: the daemon's refusal says what a registration needs (payload.server.command).
    if args.command_argv and args.url:
        raise UsageError("ironctl: mcp add: give --command or --url, not both")
    server: dict[str, Any] = {
        "name": args.name, "env": _pairs(args.env, "--env"),
        "credentials": _pairs(args.credential, "--credential"), "allow": args.allow or [],
    }  # fmt: skip
    if args.url:
        server["url"] = args.url
    else:
        server["command"] = _command(args.command_argv or [])
    probe = admin_pb2.ProbeMcpServerRequest(agent=args.agent, server_json=json.dumps(server))
    tools = json.loads(stub.ProbeMcpServer(probe, timeout=args.timeout).tools_json)
    server["tools"] = tools
    if not args.json:
        print(f"probed {render.visible(args.name)}: {len(tools)} tool(s): "
              + render.visible(", ".join(t["name"] for t in tools)))  # fmt: skip
    return _submit(args, stub, {"op": "register", "server": server}, f"register {args.name}")


def cmd_grant(args: argparse.Namespace, stub: Stub) -> int:
    payload = {"op": "grant", "server": args.name, "tools": args.tools}
    what = f"grant {', '.join(args.tools)}" if args.tools else f"revoke every tool of {args.name}"
    return _submit(args, stub, payload, what)


def cmd_remove(args: argparse.Namespace, stub: Stub) -> int:
    payload = {"op": "unregister", "server": args.name}
    return _submit(args, stub, payload, f"unregister {args.name}")


def _view(args: argparse.Namespace, stub: Stub) -> dict[str, Any]:
    """The agent's servers and grants, both lists always present (the daemon's view leaves out
    an empty one): ``mcp list`` prints this, ``mcp show`` one server of it."""
    request = admin_pb2.ListMcpServersRequest(agent=args.agent)
    view = json.loads(stub.ListMcpServers(request, timeout=args.timeout).view_json)
    return {"agent": args.agent, "servers": view.get("mcp_servers", []),
            "grants": view.get("mcp_grants", [])}  # fmt: skip


def cmd_list(args: argparse.Namespace, stub: Stub) -> int:
    view = _view(args, stub)
    if args.json:
        print(json.dumps(view, indent=2))
        return exitcodes.OK
    granted: dict[str, list[str]] = {}
    for g in view["grants"]:
        granted.setdefault(g["server"], []).append(g["name"])
    rows = []
    for s in view["servers"]:
        network = s["network"] if isinstance(s["network"], str) else ", ".join(s["network"])
        command = s.get("url") or " ".join(s["command"])
        rows.append([render.visible(s["name"]), render.visible(command), render.visible(network),
                     str(len(s["tools"])),
                     render.visible(", ".join(granted.get(s["name"], [])))])  # fmt: skip
    render.table(("NAME", "COMMAND", "NETWORK", "TOOLS", "GRANTED"), rows,
                 legend=not args.no_legend)  # fmt: skip
    return exitcodes.OK


def cmd_show(args: argparse.Namespace, stub: Stub) -> int:
    view = _view(args, stub)
    server = next((s for s in view["servers"] if s["name"] == args.name), None)
    if server is None:
        raise UsageError(f"ironctl: mcp show: agent {args.agent} has no MCP server {args.name}")
    grants = [g for g in view["grants"] if g["server"] == args.name]
    if args.json:
        print(json.dumps({"agent": args.agent, "server": server, "grants": grants}, indent=2))
        return exitcodes.OK
    rows: list[tuple[str, render.Cell]] = [("name", render.visible(server["name"]))]
    if server.get("url"):
        rows.append(("url", render.visible(server["url"])))
    else:
        rows.append(("command", render.visible(json.dumps(server["command"]))))
    rows += [
        ("env", render.visible(json.dumps(server["env"]))),
        ("credentials", render.visible(json.dumps(server["credentials"]))),
        ("network", render.visible(json.dumps(server["network"]))),
        ("granted", render.visible(", ".join(g["name"] for g in grants))),
    ]
    render.fields(rows)
    console = terminal.console()
    # Text, never markup: a server's own words are shown as it sent them (brackets, :codes:).
    for tool in server["tools"]:
        console.print(Text.assemble((render.visible(tool["name"]), "bold"), ": ",
                                    render.visible(tool["description"], newlines=True)),
                      soft_wrap=True)  # fmt: skip
        console.print(Text("  schema: " + render.visible(tool["input_schema"])), soft_wrap=True)
    return exitcodes.OK
