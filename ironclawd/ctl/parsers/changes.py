"""``ironctl change ...``: the arguments. The handlers are in ironclawd/ctl/changes.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import add_command

BY_HELP = (
    "assert that you are NAME (a user name or uid); refused if the daemon sees another caller: "
    "identity comes from the kernel, --by can only confirm it"
)


# --payload is the whole change: a shortcut beside it was read and then dropped without a word
# (found by a review). Each of these refuses the others, in whichever order they come; the
# shortcuts together are a create_agent change.
_APART = {"payload": ("persona", "persona_file", "tools"), "persona": ("payload",),
          "persona_file": ("payload",), "tools": ("payload",)}  # fmt: skip


class _Apart(argparse.Action):
    """Stores its value, unless an option it may not go with was given already."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        for dest in _APART[self.dest]:
            if getattr(namespace, dest, None) is not None:
                flag = "--" + dest.replace("_", "-")
                raise argparse.ArgumentError(
                    self, f"not allowed with {flag} (--payload is the whole change)"
                )
        setattr(namespace, self.dest, values)


def register(sub: Any) -> None:
    change = sub.add_parser("change", help="capability changes held for a human decision",
                            description="Submit, inspect, approve and reject capability changes.",
                            epilog=exitcodes.HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    verbs = change.add_subparsers(dest="verb", metavar="VERB", required=True)
    submit = add_command(
        verbs, "submit", "submit a change; it waits for a human decision",
        "ironctl change submit --kind persona --agent demo --persona 'You are terse.'\n"
        "  ironctl change submit --kind persona --group demo --by alice   # opens $EDITOR\n"
        "  ironctl change submit --kind tools --agent demo --tools read_file,list_files\n"
        "  echo '{\"persona\": \"...\"}' | ironctl change submit --kind persona --agent demo "
        "--payload -", "changes:cmd_submit",
    )  # fmt: skip
    submit.add_argument("--kind", required=True, help="persona, tools, create_agent, ...")
    submit.add_argument("--agent", "--group", dest="agent", required=True,
                        help="target agent (--group is the same option)")  # fmt: skip
    submit.add_argument("--payload", action=_Apart, help="payload JSON, or - for standard "
                        "input (the whole change: no shortcut beside it)")  # fmt: skip
    persona = submit.add_mutually_exclusive_group()
    persona.add_argument("--persona", action=_Apart,
                         help="shortcut for a persona payload: the text, or - for "
                         "standard input; without it (and --payload), $EDITOR opens on the "
                         "current persona when run on a terminal, and an edit not submitted "
                         "(refused, no answer, Ctrl-C) is kept in a private file ironctl "
                         "names")  # fmt: skip
    persona.add_argument("--persona-file", metavar="FILE", action=_Apart,
                         help="the persona from a UTF-8 file (at most 64000 bytes); a file "
                         "ironctl kept an edit in is removed once submitted from, unless "
                         "changed meanwhile; one you do not submit is yours to "
                         "remove")  # fmt: skip
    submit.add_argument("--tools", action=_Apart,
                        help="shortcut for a tools payload: comma-separated names")  # fmt: skip
    submit.add_argument("--reason", help="why (shown to the approver)")
    submit.add_argument("--by", metavar="NAME", help=BY_HELP)
    listing = add_command(verbs, "list", "list changes", "ironctl change list --state applied",
                          "changes:cmd_list")  # fmt: skip
    listing.add_argument("--state", help="pending, approved, applied, rejected, expired, failed")
    add_command(verbs, "pending", "list changes waiting for a decision", "ironctl change pending",
                "changes:cmd_list")  # fmt: skip
    for verb, helptext in (("show", "show a change and its diff"), ("diff", "show only the diff")):
        cmd = add_command(verbs, verb, helptext, f"ironctl change {verb} ID", "changes:cmd_show")
        cmd.add_argument("id", metavar="ID")
    for verb, helptext in (("approve", "approve and apply a pending change"),
                           ("reject", "reject a pending change")):  # fmt: skip
        cmd = add_command(
            verbs, verb, helptext, f"ironctl change {verb} ID --yes", "changes:cmd_decide"
        )
        cmd.add_argument("id", metavar="ID")
        cmd.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        cmd.add_argument("--by", metavar="NAME", help=BY_HELP)
        if verb == "approve":
            cmd.add_argument("--hash", help="the change hash you reviewed (default: as shown)")
        else:
            cmd.add_argument("--note", help="why it was rejected")
