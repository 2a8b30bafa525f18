"""``ironctl wiring list|show`` and ``ironctl permissions show``: which channel rooms and webhook
endpoints reach which agent, and who may talk to it and approve its changes.

Both are read from the agent's view the daemon already returns (``Agent.view_json``); they are
changed only by approved ``wiring`` and ``permissions`` changes (``ironctl change submit --kind
wiring --payload …``, docs/channels.md). Every value is shown escaped: a pattern's brackets are
text, not terminal markup.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.markup import escape
from rich.table import Table

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render
from ironclawd.ctl.common import Stub, add_command

# What an agent's view leaves out while it has the default (ironclawd/domain/channels.py).
ROUTE_DEFAULTS = {"engage": "always", "pattern": "", "sessions": "per_sender", "reply_url": ""}
PERMISSIONS_DEFAULT: dict[str, Any] = {"allow": [], "unknown": "drop", "approvers": {}}


def routes_of(agent: admin_pb2.Agent) -> list[dict[str, Any]]:
    """The agent's routes, every field present."""
    view = json.loads(agent.view_json or "{}")
    return [{**ROUTE_DEFAULTS, **r} for r in view.get("wiring", [])]


def permissions_of(agent: admin_pb2.Agent) -> dict[str, Any]:
    view = json.loads(agent.view_json or "{}")
    return {**PERMISSIONS_DEFAULT, **view.get("permissions", {})}


def _shown(text: str) -> str:
    return escape(render.visible(text)) if text else "-"


def _routes_table(rows: list[dict[str, Any]], with_agent: bool) -> Table:
    table = Table()
    columns = ["AGENT"] if with_agent else []
    for column in (*columns, "CHANNEL", "WHERE", "ENGAGE", "SESSIONS", "REPLY_URL"):
        table.add_column(column, overflow="fold")
    for r in rows:
        engage = r["engage"] + (f" {r['pattern']}" if r["pattern"] else "")
        cells = [r["agent"]] if with_agent else []
        table.add_row(*(_shown(c) for c in (*cells, r["channel"], r["where"], engage,
                                             r["sessions"], r["reply_url"])))  # fmt: skip
    return table


def cmd_wiring_list(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.ListAgents(admin_pb2.ListAgentsRequest(), timeout=args.timeout)
    rows = [{"agent": a.name, **r} for a in reply.agents for r in routes_of(a)]
    if args.json:
        print(json.dumps({"routes": rows}, indent=2))
        return exitcodes.OK
    if not rows:
        print("no agent is wired to a channel (ironctl change submit --kind wiring ...)")
        return exitcodes.OK
    render.console().print(_routes_table(rows, with_agent=True))
    return exitcodes.OK


def _agent(args: argparse.Namespace, stub: Stub) -> admin_pb2.Agent:
    request = admin_pb2.GetAgentRequest(name=args.agent)
    return stub.GetAgent(request, timeout=args.timeout).agent


def cmd_wiring_show(args: argparse.Namespace, stub: Stub) -> int:
    agent = _agent(args, stub)
    rows = [{"agent": agent.name, **r} for r in routes_of(agent)]
    if args.json:
        print(json.dumps({"agent": agent.name, "routes": rows}, indent=2))
        return exitcodes.OK
    if not rows:
        print(f"agent {render.visible(agent.name)} is wired to no channel")
        return exitcodes.OK
    render.console().print(_routes_table(rows, with_agent=False))
    return exitcodes.OK


def cmd_permissions_show(args: argparse.Namespace, stub: Stub) -> int:
    agent = _agent(args, stub)
    perms = permissions_of(agent)
    if args.json:
        print(json.dumps({"agent": agent.name, **perms}, indent=2))
        return exitcodes.OK
    hosts = [a for a in perms["allow"] if a.startswith(("user:", "group:"))]
    table = Table(show_header=False, box=None)
    table.add_row("agent", _shown(agent.name))
    table.add_row("allow", escape(", ".join(render.visible(a) for a in perms["allow"])) or "-")
    table.add_row("unknown senders", perms["unknown"])
    table.add_row(
        "ironctl send",
        "only " + escape(", ".join(hosts)) if hosts else "any ironclaw-admin member",
    )
    approvers = perms["approvers"]
    table.add_row(
        "approvers",
        escape(", ".join(f"{k}: group {g}" for k, g in sorted(approvers.items())))
        or "any ironclaw-admin member",
    )
    render.console().print(table)
    return exitcodes.OK


def register(sub: Any) -> None:
    wiring = sub.add_parser(
        "wiring", help="which channel rooms and webhook endpoints reach which agent",
        epilog=exitcodes.HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    verbs = wiring.add_subparsers(dest="verb", metavar="VERB", required=True)
    add_command(verbs, "list", "every agent's routes", "ironctl wiring list --json",
                cmd_wiring_list)  # fmt: skip
    show = add_command(verbs, "show", "one agent's routes", "ironctl wiring show demo",
                       cmd_wiring_show)  # fmt: skip
    show.add_argument("agent", metavar="AGENT")
    perms = sub.add_parser(
        "permissions", help="who may talk to an agent and who approves its changes",
        epilog=exitcodes.HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    perm_verbs = perms.add_subparsers(dest="verb", metavar="VERB", required=True)
    show = add_command(perm_verbs, "show", "an agent's permissions",
                       "ironctl permissions show demo --json", cmd_permissions_show)  # fmt: skip
    show.add_argument("agent", metavar="AGENT")
