"""``ironctl agent ...``: the arguments. The handlers are in ironclawd/ctl/agents.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import add_command


def register(sub: Any) -> None:
    agent = sub.add_parser("agent", help="agents in the registry", epilog=exitcodes.HELP,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    agent_verbs = agent.add_subparsers(dest="verb", metavar="VERB", required=True)
    add_command(
        agent_verbs, "list", "list agents", "ironctl agent list --json", "agents:cmd_agent_list"
    )
    show = add_command(agent_verbs, "show", "show an agent", "ironctl agent show demo",
                       "agents:cmd_agent_show")  # fmt: skip
    show.add_argument("name", metavar="NAME")
    create = add_command(
        agent_verbs, "create", "submit a create_agent change (a human must approve it)",
        "ironctl agent create helper --persona 'You help.' --tools read_file,write_file",
        "agents:cmd_agent_create",
    )  # fmt: skip
    create.add_argument("name", metavar="NAME")
    create.add_argument("--persona", required=True)
    create.add_argument("--tools", help="comma-separated tool names")
    # No list here: ironctl speaks only gRPC, and the daemon refuses a provider it does not know.
    create.add_argument("--provider", help="a model provider the daemon knows (default: mock)")
    create.add_argument("--model")
    create.add_argument("--reason")
