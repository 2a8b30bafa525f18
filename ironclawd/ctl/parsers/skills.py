"""``ironctl skill ...``: the arguments. The handlers are in ironclawd/ctl/skills.py,
imported only when one of these commands runs."""

from __future__ import annotations

import argparse
from typing import Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import add_command

# = formats.skill.SIGNATURE_FILE (a unit test keeps them equal; formats.skill imports yaml).
SIGNATURE_FILE = "SKILL.minisig"


def register(sub: Any) -> None:
    group = sub.add_parser(
        "skill",
        help="skills of an agent: signed folders of text, installed only once approved",
        description="Install, list, show and remove an agent's skills (docs/skills.md); sign, "
        "verify and print the manifest of a skill folder offline.",
        epilog=exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = group.add_subparsers(dest="verb", metavar="VERB", required=True)
    add = add_command(
        verbs,
        "add",
        "submit a skills change installing a signed skill folder",
        "ironctl skill add ./weather --agent demo --reason 'forecasts'",
        "skills:cmd_add",
    )
    add.add_argument("path", metavar="PATH", help="the skill's folder (named as the skill)")
    remove = add_command(
        verbs,
        "remove",
        "submit a skills change removing a skill and its grants",
        "ironctl skill remove weather --agent demo",
        "skills:cmd_remove",
    )
    remove.add_argument("name", metavar="NAME")
    for cmd in (add, remove):
        cmd.add_argument("--agent", required=True, help="target agent")
        cmd.add_argument("--reason", help="why (shown to the approver)")
    listing = add_command(
        verbs,
        "list",
        "list installed skills and what each grants",
        "ironctl skill list --agent demo",
        "skills:cmd_list",
    )
    listing.add_argument("--agent", help="only this agent's skills")
    show = add_command(
        verbs,
        "show",
        "show one installed skill: files, hashes, signer, grants",
        "ironctl skill show weather --agent demo",
        "skills:cmd_show",
    )
    show.add_argument("name", metavar="NAME")
    show.add_argument("--agent", required=True)
    sign = add_command(
        verbs,
        "sign",
        f"sign a skill folder (writes {SIGNATURE_FILE})",
        "ironctl skill sign ./weather --key ~/.minisign/skills.key\n"
        "  (an unencrypted minisign key: minisign -G -W; minisign -V checks the "
        "result)",
        "skills:cmd_sign",
    )
    sign.add_argument("path", metavar="PATH")
    sign.add_argument("--key", required=True, help="minisign secret key file (unencrypted)")
    sign.add_argument("--comment", help="trusted comment (default: timestamp and name)")
    manifest = add_command(
        verbs,
        "manifest",
        "print the manifest a skill's signature covers",
        "ironctl skill manifest ./weather > m && minisign -S -s KEY -m m && "
        "mv m.minisig ./weather/SKILL.minisig",
        "skills:cmd_manifest",
    )
    manifest.add_argument("path", metavar="PATH")
    verify = add_command(
        verbs,
        "verify",
        "check a skill folder's form and signature offline",
        "ironctl skill verify ./weather --pubkey skills.pub",
        "skills:cmd_verify",
    )
    verify.add_argument("path", metavar="PATH")
    verify.add_argument("--pubkey", required=True, help="a minisign public key file to trust")
