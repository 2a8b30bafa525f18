"""``--by NAME``: an assertion about who is calling, checked against who the daemon says it is.

IronClaw's published quickstart writes ``ironctl change approve ID --by alice``. ironctl never
sends a name: the daemon takes the caller's identity from the kernel (SO_PEERCRED on the admin
socket, docs/admin-identity.md). So ``--by`` is accepted only as a check that the operator is who
they think they are, compared with the caller the daemon reports (GetStatus), never as a claim.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import CtlError

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def asserted_caller_matches(asserted: str, uid: int, user_name: str) -> bool:
    """Whether ``--by asserted`` names the caller (uid, user_name) the daemon sees."""
    wanted = asserted.strip()
    return wanted == user_name or (wanted.isdecimal() and int(wanted) == uid)


def mismatch(asserted: str, uid: int, user_name: str) -> CtlError:
    return CtlError(
        "CALLER_MISMATCH",
        exitcodes.PERMISSION,
        f"--by {asserted}: the daemon sees you as uid {uid} ({user_name}), not {asserted}; "
        "identity comes from the kernel (SO_PEERCRED on the admin socket), never from the "
        f"command line, so --by can only confirm it. Run ironctl as {asserted} "
        f"(sudo -u {asserted} ironctl ...) or leave --by out",
    )


def confirm_caller(args: argparse.Namespace, stub: Stub) -> None:
    """Raise unless ``--by`` (if given) names the caller the daemon sees."""
    asserted = getattr(args, "by", None)
    if asserted is None:
        return
    caller = stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=args.timeout).caller
    if not asserted_caller_matches(asserted, caller.uid, caller.user_name):
        raise mismatch(asserted, caller.uid, caller.user_name)
