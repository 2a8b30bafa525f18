"""``ironctl wiring list|show`` and ``ironctl permissions show``: which channel rooms and webhook
endpoints reach which agent, and who may talk to it and approve its changes.

Both are read from the agent's view the daemon already returns (``Agent.view_json``); they are
changed only by approved ``wiring`` and ``permissions`` changes (``ironctl change submit --kind
wiring --payload …``, docs/channels.md). Every value is shown as text: a pattern's brackets
are not terminal markup.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub

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
    return render.visible(text)


def _routes_table(args: argparse.Namespace, rows: list[dict[str, Any]], with_agent: bool) -> None:
    columns = ["AGENT"] if with_agent else []
    cells = []
    for r in rows:
        engage = r["engage"] + (f" {r['pattern']}" if r["pattern"] else "")
        first = [r["agent"]] if with_agent else []
        cells.append([_shown(c) for c in (*first, r["channel"], r["where"], engage,
                                          r["sessions"], r["reply_url"])])  # fmt: skip
    render.table((*columns, "CHANNEL", "WHERE", "ENGAGE", "SESSIONS", "REPLY_URL"), cells,
                 legend=not args.no_legend)  # fmt: skip


def cmd_wiring_list(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.ListAgents(admin_pb2.ListAgentsRequest(), timeout=args.timeout)
    rows = [{"agent": a.name, **r} for a in reply.agents for r in routes_of(a)]
    if args.json:
        print(json.dumps({"routes": rows}, indent=2))
        return exitcodes.OK
    if not rows:
        if not args.no_legend:
            print("no agent is wired to a channel (ironctl change submit --kind wiring ...)")
        return exitcodes.OK
    _routes_table(args, rows, with_agent=True)
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
        if not args.no_legend:
            print(f"agent {render.visible(agent.name)} is wired to no channel")
        return exitcodes.OK
    _routes_table(args, rows, with_agent=False)
    return exitcodes.OK


def cmd_permissions_show(args: argparse.Namespace, stub: Stub) -> int:
    agent = _agent(args, stub)
    perms = permissions_of(agent)
    if args.json:
        print(json.dumps({"agent": agent.name, **perms}, indent=2))
        return exitcodes.OK
    hosts = [a for a in perms["allow"] if a.startswith(("user:", "group:"))]
    approvers = perms["approvers"]
    render.fields([
        ("agent", _shown(agent.name)),
        ("allow", ", ".join(render.visible(a) for a in perms["allow"])),
        ("unknown senders", render.visible(perms["unknown"])),
        ("ironctl send", "only " + render.visible(", ".join(hosts)) if hosts
         else "any ironclaw-admin member"),
        ("approvers", render.visible(", ".join(f"{k}: group {g}"
                                               for k, g in sorted(approvers.items())))
         or "any ironclaw-admin member"),
    ])  # fmt: skip
    return exitcodes.OK
