"""``ironctl package ...``: list an agent's Debian packages; ask for more, fewer or others.

A ``packages`` change carries the agent's whole list of names; ``add`` and ``remove`` compute it
from the packages the agent asked for (not the dependencies apt added). The daemon resolves the
names with apt and holds the change for a human, who sees every ``.deb`` that would be unpacked
(docs/packages.md).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render, wire
from ironclawd.ctl.changes import show_change
from ironclawd.ctl.common import CtlError

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def packages_of(agent: admin_pb2.Agent) -> list[dict[str, Any]]:
    """The agent's packages from its view, dependencies included, each with the agent's name."""
    view = json.loads(agent.view_json or "{}")
    return [{"agent": agent.name, **p} for p in view.get("packages", [])]


def _agent(args: argparse.Namespace, stub: Stub) -> admin_pb2.Agent:
    request = admin_pb2.GetAgentRequest(name=args.agent)
    return stub.GetAgent(request, timeout=args.timeout).agent


def _submit(
    args: argparse.Namespace, stub: Stub, names: list[str], what: str, read: list[str] | None = None
) -> int:
    """Submit ``names`` as the agent's whole list. ``read``: the requested packages ``names``
    was computed from (add, remove), checked against those the daemon computed the change from."""
    request = admin_pb2.SubmitChangeRequest(
        kind="packages",
        agent=args.agent,
        payload_json=json.dumps({"packages": names}),
        reason=args.reason or "",
    )
    change = stub.SubmitChange(request, timeout=args.timeout).change
    if read is not None and change.kind == request.kind:  # (else not the change sent)
        _check_base(args, stub, change, read)
    if not args.json:
        print(f"{what}: packages change {change.id} is pending a human decision")
    show_change(args, change)
    return exitcodes.OK


def _check_base(
    args: argparse.Namespace, stub: Stub, change: admin_pb2.Change, read: list[str]
) -> None:
    """Raise, the change withdrawn, if the agent's requested packages changed between the read
    and the submit (another packages change applied): the list sent would undo that change."""
    if not change.before_json:  # abridged (too large to show): it cannot be approved anyway
        return
    before = [p["name"] for p in json.loads(change.before_json).get("packages", [])
              if p.get("requested")]  # fmt: skip
    if before == read:
        return
    moved = (f"agent {args.agent}'s requested packages changed while ironctl package "
             f"{args.verb} ran (were: {', '.join(read) or 'none'}; now: "
             f"{', '.join(before) or 'none'}), and change {change.id}, computed from the old "
             "list, would undo that")  # fmt: skip
    note = (f"withdrawn by ironctl package {args.verb}: computed from an outdated list of "
            "requested packages")  # fmt: skip
    try:
        stub.RejectChange(admin_pb2.RejectChangeRequest(id=change.id, note=note),
                          timeout=args.timeout)  # fmt: skip
    except wire.RpcError as err:
        why = f"{err.code().name.lower()}: {err.details()}"
        raise CtlError("FAILED_PRECONDITION", exitcodes.CONFLICT,
                       f"{moved}: change {change.id} is pending; reject it (ironctl change "
                       f"reject {change.id} --yes) and run the command again (withdrawing it "
                       f"failed: {why})") from None  # fmt: skip
    raise CtlError("FAILED_PRECONDITION", exitcodes.CONFLICT,
                   f"{moved}: it was withdrawn (rejected) and nothing is pending; run the "
                   "command again")  # fmt: skip


def _requested(args: argparse.Namespace, stub: Stub) -> list[str]:
    return [p["name"] for p in packages_of(_agent(args, stub)) if p.get("requested")]


def cmd_set(args: argparse.Namespace, stub: Stub) -> int:
    names = list(dict.fromkeys(args.names))
    return _submit(args, stub, names, f"packages {' '.join(names) or '(none)'}")


def cmd_add(args: argparse.Namespace, stub: Stub) -> int:
    current = _requested(args, stub)
    new = [n for n in args.names if n not in current]
    if not new:
        raise CtlError(
            "nothing_to_do", exitcodes.USAGE,
            f"agent {args.agent} already has {', '.join(args.names)}; nothing to submit",
        )  # fmt: skip
    names = current + list(dict.fromkeys(new))
    return _submit(args, stub, names, f"adding {' '.join(new)}", current)


def cmd_remove(args: argparse.Namespace, stub: Stub) -> int:
    current = _requested(args, stub)
    missing = [n for n in args.names if n not in current]
    if missing:
        raise CtlError(
            "not_found", exitcodes.NOT_FOUND,
            f"agent {args.agent} did not ask for {', '.join(missing)} "
            f"(it has: {', '.join(current) or 'none'}; dependencies go with what needs them)",
        )  # fmt: skip
    kept = [n for n in current if n not in args.names]
    return _submit(args, stub, kept, f"removing {' '.join(args.names)}", current)


def cmd_list(args: argparse.Namespace, stub: Stub) -> int:
    if args.agent:
        agents = [_agent(args, stub)]
    else:
        agents = list(stub.ListAgents(admin_pb2.ListAgentsRequest(), timeout=args.timeout).agents)
    packages = [p for a in agents for p in packages_of(a)]
    if args.json:
        print(json.dumps({"packages": packages}, indent=2))
        return exitcodes.OK
    # Versions and hashes are compared and copied: render never splits a word.
    rows = [[p["agent"], p["name"], render.visible(p["version"]), p["architecture"], p["sha256"],
             str(p["size"]), "requested" if p["requested"] else "dependency"]
            for p in packages]  # fmt: skip
    render.table(("AGENT", "PACKAGE", "VERSION", "ARCH", "SHA256", "SIZE", "WHY"), rows,
                 legend=not args.no_legend)  # fmt: skip
    return exitcodes.OK
