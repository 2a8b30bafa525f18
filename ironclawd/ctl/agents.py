"""``ironctl agent ...``: the agents in the registry; creating one is a change a human approves."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render
from ironclawd.ctl.changes import show_change
from ironclawd.ctl.common import Stub, add_command, print_json


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
    payload = {"persona": args.persona, "tools": [t for t in (args.tools or "").split(",") if t]}
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


def register(sub: Any) -> None:
    agent = sub.add_parser("agent", help="agents in the registry", epilog=exitcodes.HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    agent_verbs = agent.add_subparsers(dest="verb", metavar="VERB", required=True)
    add_command(agent_verbs, "list", "list agents", "ironctl agent list --json", cmd_agent_list)
    show = add_command(agent_verbs, "show", "show an agent", "ironctl agent show demo",
                       cmd_agent_show)  # fmt: skip
    show.add_argument("name", metavar="NAME")
    create = add_command(
        agent_verbs, "create", "submit a create_agent change (a human must approve it)",
        "ironctl agent create helper --persona 'You help.' --tools read_file,write_file",
        cmd_agent_create,
    )  # fmt: skip
    create.add_argument("name", metavar="NAME")
    create.add_argument("--persona", required=True)
    create.add_argument("--tools", help="comma-separated tool names")
    # No list here: ironctl speaks only gRPC, and the daemon refuses a provider it does not know.
    create.add_argument("--provider", help="a model provider the daemon knows (default: mock)")
    create.add_argument("--model")
    create.add_argument("--reason")
