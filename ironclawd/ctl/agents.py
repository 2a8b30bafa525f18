"""``ironctl agent ...``: the agents in the registry; creating one is a change a human approves."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import argtypes, exitcodes, render
from ironclawd.ctl.changes import show_change
from ironclawd.ctl.shapes import print_json

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def cmd_agent_list(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.ListAgents(admin_pb2.ListAgentsRequest(), timeout=args.timeout)
    if args.json:
        print_json(reply)
        return exitcodes.OK
    rows = [[a.name, a.provider, render.visible(a.model), ", ".join(a.tools)] for a in reply.agents]
    render.table(("NAME", "PROVIDER", "MODEL", "TOOLS"), rows, legend=not args.no_legend)
    return exitcodes.OK


def cmd_agent_show(args: argparse.Namespace, stub: Stub) -> int:
    agent = stub.GetAgent(admin_pb2.GetAgentRequest(name=args.name), timeout=args.timeout).agent
    if args.json:
        print_json(agent)
        return exitcodes.OK
    rows: list[tuple[str, render.Cell]] = [
        (key, render.visible(str(getattr(agent, key))))
        for key in ("name", "provider", "model", "base_url", "credential")
    ]
    rows.append(("tools", ", ".join(agent.tools)))
    rows.append(("persona", render.visible(agent.persona, newlines=True)))
    render.fields(rows)
    return exitcodes.OK


def cmd_agent_create(args: argparse.Namespace, stub: Stub) -> int:
    payload = {"persona": args.persona, "tools": argtypes.names(args.tools)}
    if args.provider:
        payload["provider"] = args.provider
    if args.model:
        payload["model"] = args.model
    request = admin_pb2.SubmitChangeRequest(
        kind="create_agent", agent=args.name, payload_json=json.dumps(payload),
        reason=args.reason or "",
    )  # fmt: skip
    change = stub.SubmitChange(request, timeout=args.timeout).change
    if not args.json:
        print(f"agent {render.visible(args.name)}: create_agent change {change.id} is pending a "
              "human decision")  # fmt: skip
    show_change(args, change)
    return exitcodes.OK
