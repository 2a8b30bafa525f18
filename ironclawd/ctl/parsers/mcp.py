"""``ironctl mcp ...``: the arguments. The handlers are in ironclawd/ctl/mcp.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import Parser, add_command


class _Intermixed(Parser):
    """A parser whose positionals may be split by options (``grant NAME --agent A TOOL…``);
    plain argparse takes NAME and TOOL… at once and then refuses the TOOLs after the option."""

    _inside = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._inside:  # parse_known_intermixed_args calls back here
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def register(sub: Any) -> None:
    mcp = sub.add_parser("mcp", help="MCP servers of an agent and the tools granted to it",
                         epilog=exitcodes.HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    verbs = mcp.add_subparsers(dest="verb", metavar="VERB", required=True)
    add = add_command(
        verbs,
        "add",
        "probe an MCP server (stdio, or remote with --url), then submit its registration "
        "(a human approves)",
        "ironctl mcp add time --agent demo --command /opt/mcp/bin/mcp-server-time\n"
        "  ironctl mcp add time --agent demo --command '/opt/mcp/bin/mcp-server-time "
        "--local-timezone UTC'\n  ironctl mcp add gh --agent demo --credential GITHUB_TOKEN=gh "
        "--allow api.github.com:443 --command /opt/mcp/bin/github-mcp stdio\n"
        "  (arguments that start with '-': quote the whole command line as one word)",
        "mcp:cmd_add",
    )  # fmt: skip
    add.add_argument("name", metavar="NAME", help="server name, [a-z][a-z0-9-]*")
    add.add_argument("--agent", required=True)
    add.add_argument("--env", action="append", metavar="K=V", help="a plain setting (shown)")
    add.add_argument("--credential", action="append", metavar="ENV=NAME",
                     help="host credential NAME into ENV (its value is never shown)")  # fmt: skip
    add.add_argument("--allow", action="append", metavar="HOST:PORT",
                     help="a destination the server may reach (default: no network)")  # fmt: skip
    add.add_argument("--reason", help="why (shown to the approver)")
    add.add_argument(
        "--url",
        metavar="URL",
        help="a remote server, https://HOST[:PORT]/PATH, "
        "reached under the egress broker's rules; --credential HEADER=NAME sends a "
        "host credential in that request header",
    )
    add.add_argument("--command", dest="command_argv", nargs="+",
                     metavar="CMD", help="absolute path of the server, then its arguments; or "
                     "the whole command line as one quoted word")  # fmt: skip
    grant = add_command(
        verbs, "grant", "submit the tools of a server the agent may call (replaces; none revokes)",
        "ironctl mcp grant time --agent demo get_current_time convert_time", "mcp:cmd_grant",
    )  # fmt: skip
    grant.__class__ = _Intermixed
    grant.add_argument("name", metavar="NAME")
    grant.add_argument("tools", metavar="TOOL", nargs="*")
    grant.add_argument("--agent", required=True)
    grant.add_argument("--reason", help="why (shown to the approver)")
    listing = add_command(verbs, "list", "list an agent's MCP servers",
                          "ironctl mcp list --agent demo --json", "mcp:cmd_list")  # fmt: skip
    listing.add_argument("--agent", required=True)
    show = add_command(verbs, "show", "show a server: command, env, network, tools, grants",
                       "ironctl mcp show time --agent demo", "mcp:cmd_show")  # fmt: skip
    show.add_argument("name", metavar="NAME")
    show.add_argument("--agent", required=True)
    remove = add_command(verbs, "remove", "submit unregistering a server (and its grants)",
                         "ironctl mcp remove time --agent demo", "mcp:cmd_remove")  # fmt: skip
    remove.add_argument("name", metavar="NAME")
    remove.add_argument("--agent", required=True)
    remove.add_argument("--reason", help="why (shown to the approver)")
