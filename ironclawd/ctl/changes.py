"""``ironctl change ...``: submit, inspect, approve and reject capability changes."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING, Any

from rich.text import Text

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import argtypes, editor, exitcodes, render, terminal, wire
from ironclawd.ctl.caller import confirm_caller
from ironclawd.ctl.common import (
    CtlError,
    UsageError,
    decode_stdin,
    failed_call,
    outcome_unknown,
    read_file,
    read_stdin,
)
from ironclawd.ctl.shapes import print_json, to_dict

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def _payload(args: argparse.Namespace) -> str:
    if args.payload == "-":
        return read_stdin()
    if args.payload is not None:
        return str(args.payload)
    fields: dict[str, Any] = {}
    if getattr(args, "persona", None) is not None:
        fields["persona"] = read_stdin() if args.persona == "-" else args.persona
    if getattr(args, "tools", None) is not None:
        fields["tools"] = argtypes.names(args.tools)
    return json.dumps(fields)


# The daemon takes a persona of at most 16000 characters (domain/kinds/persona.py MAX_PERSONA),
# each at most 4 bytes of UTF-8: more is refused here, before it is read whole and sent.
MAX_PERSONA_BYTES = 4 * 16_000


def _persona_from_file(args: argparse.Namespace) -> bytes:
    try:
        data = read_file(args.persona_file, MAX_PERSONA_BYTES)
        args.persona = decode_stdin(data).removesuffix("\n")
    except OSError as exc:
        raise CtlError("INVALID_INPUT", exitcodes.INVALID,
                       f"--persona-file {args.persona_file}: {exc.strerror}") from None  # fmt: skip
    return data


# The kinds ironctl opens in $EDITOR when no payload is given: a persona is one text, the
# agent's current one (GetAgent) is what the operator starts from.
EDITED_KINDS = frozenset({"persona"})


def _persona_missing(args: argparse.Namespace) -> bool:
    return args.kind in EDITED_KINDS and args.payload is None and args.persona is None


def show_change(
    args: argparse.Namespace, change: admin_pb2.Change, *, diff_only: bool = False
) -> None:

    if args.json:
        print_json(change)
        return
    console = terminal.console()
    if not diff_only:
        when = render.when
        render.fields([
            ("id", change.id), ("kind", change.kind), ("agent", render.visible(change.agent)),
            ("state", change.state), ("submitter", render.visible(change.submitter)),
            ("reason", render.visible(change.reason)), ("hash", change.hash),
            ("created", when(change.created_at)), ("expires", when(change.expires_at)),
            ("decided", f"{render.visible(change.decided_by)} {when(change.decided_at)}"
             if change.decided_by else ""),
            ("note", render.visible(change.note)),
        ])  # fmt: skip
    # Every character of the diff is shown as what it is: control, escape and bidi characters
    # arrive here already JSON-escaped, and visible() catches anything left.
    # soft_wrap: a diff line is printed whole, never folded at the console's width, which would
    # split escapes ("\u20" / "2e") and make a piped diff differ from what was submitted.
    # Text, never markup: a line's brackets and :emoji_codes: are shown as submitted.
    for line in change.diff:
        style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
        console.print(Text(render.visible(line), style=style), soft_wrap=True)


def cmd_submit(args: argparse.Namespace, stub: Stub) -> int:
    from_file = None if args.persona_file is None else _persona_from_file(args)
    if _persona_missing(args) and not editor.on_terminal():
        raise UsageError(
            "change submit --kind persona: no persona given, and no editor can open off a "
            "terminal: pass --persona-file FILE, --persona - (standard input) or --persona TEXT"
        )
    confirm_caller(args, stub)
    change = _edit_and_submit(args, stub) if _persona_missing(args) else _submit(args, stub)
    # An edit ironctl kept, submitted now: the pending change holds its text.
    forgot = from_file is not None and editor.forget_kept(args.persona_file, from_file)
    if forgot and not args.json:
        print(f"removed {args.persona_file}: the edit kept there is change {change.id} now",
              file=sys.stderr)  # fmt: skip
    if not args.json:
        print(f"change {change.id} is pending a human decision")
    show_change(args, change)
    return exitcodes.OK


def _submit(args: argparse.Namespace, stub: Stub) -> admin_pb2.Change:
    request = admin_pb2.SubmitChangeRequest(
        kind=args.kind, agent=args.agent, payload_json=_payload(args), reason=args.reason or ""
    )
    change: admin_pb2.Change = stub.SubmitChange(request, timeout=args.timeout).change
    return change


def _persona(args: argparse.Namespace, stub: Stub) -> str:
    request = admin_pb2.GetAgentRequest(name=args.agent)
    return str(stub.GetAgent(request, timeout=args.timeout).agent.persona)


def _edit_and_submit(args: argparse.Namespace, stub: Stub) -> admin_pb2.Change:
    """Edit the agent's persona in $EDITOR and submit it. An edit takes minutes: a persona
    changed meanwhile is not overwritten by text written from the old one. The edit's file is
    kept whenever the text is not submitted (the daemon refused it, or is gone, or Ctrl-C
    came), and named; it is removed once the text is submitted."""
    original = _persona(args, stub)
    edit = editor.edit(original, f"persona of {args.agent}", ".md")
    args.persona, kept = edit.text, editor.kept(edit.path)
    reread = False  # the persona was read again: an error after it is the submit's
    try:
        if _persona(args, stub) != original:
            raise CtlError("FAILED_PRECONDITION", exitcodes.CONFLICT,
                           f"the persona of {args.agent} changed while it was edited (a "
                           "change was applied): nothing submitted, as it would undo that; "
                           f"your text is kept in {edit.path}: compare it with the persona now "
                           f"(ironctl agent show {args.agent}), then submit it with "
                           f"--persona-file {edit.path}")  # fmt: skip
        reread = True
        change = _submit(args, stub)
    except wire.RpcError as err:
        if reread and outcome_unknown(err):  # the daemon may have stored it all the same
            raise failed_call(err, f"{_SUBMITTED_UNKNOWN}; {kept}") from None
        raise wire.RpcError(err.code(), f"{err.details()}; nothing submitted: {kept}",
                            transport=err.transport) from None  # fmt: skip
    except KeyboardInterrupt:  # (main() ends with 130, quietly)
        editor.interrupted(
            f"{_SUBMITTED_UNKNOWN}; {kept}" if reread else f"nothing submitted: {kept}"
        )
        raise
    editor.discard(edit.path)
    return change


_SUBMITTED_UNKNOWN = (
    "whether the persona change was submitted is not known: see ironctl change pending"
)


def cmd_list(args: argparse.Namespace, stub: Stub) -> int:
    state = "pending" if args.verb == "pending" else (args.state or "")
    reply = stub.ListChanges(admin_pb2.ListChangesRequest(state=state), timeout=args.timeout)
    after = reply.next_after_id
    while after:  # the daemon answers a page at a time
        request = admin_pb2.ListChangesRequest(state=state, after_id=after)
        page = stub.ListChanges(request, timeout=args.timeout)
        reply.changes.extend(page.changes)
        after = page.next_after_id
    if args.json:
        print(json.dumps({"changes": [to_dict(c) for c in reply.changes]}, indent=2))
        return exitcodes.OK
    # Ids and submitters are what an operator copies into the next command: never cut (render).
    rows = [[c.id, c.kind, render.visible(c.agent), c.state, render.visible(c.submitter),
             render.when(c.created_at)] for c in reply.changes]  # fmt: skip
    render.table(("ID", "KIND", "AGENT", "STATE", "SUBMITTER", "CREATED"), rows,
                 legend=not args.no_legend)  # fmt: skip
    return exitcodes.OK


def cmd_show(args: argparse.Namespace, stub: Stub) -> int:
    change = stub.GetChange(admin_pb2.GetChangeRequest(id=args.id), timeout=args.timeout).change
    show_change(args, change, diff_only=args.verb == "diff")
    return exitcodes.OK


def _confirm(args: argparse.Namespace, change: admin_pb2.Change, verb: str) -> None:
    """Return if --yes, or if a person at a terminal, shown the change, answers yes; else raise
    NOT_CONFIRMED (under --json, a JSON error on standard output like every other failure)."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CtlError("NOT_CONFIRMED", exitcodes.FAILED,
                       f"{verb} {change.id}: not a terminal; pass --yes to {verb} without "
                       "asking")  # fmt: skip
    if args.json:
        # Standard output is for the one JSON document (the change decided): the person asked
        # reads the change, as people read it, where they read the question.
        with contextlib.redirect_stdout(sys.stderr):
            show_change(argparse.Namespace(**{**vars(args), "json": False}), change)
    else:
        show_change(args, change)
    question = f"{verb} change {change.id} ({change.kind} on {change.agent})? [y/N] "
    print(render.visible(question), end="", file=sys.stderr, flush=True)
    answer = decode_stdin(sys.stdin.buffer.readline())
    if answer.strip().lower() not in ("y", "yes"):
        raise CtlError("NOT_CONFIRMED", exitcodes.FAILED,
                       f"{verb} {change.id}: not confirmed; nothing decided")  # fmt: skip


def cmd_decide(args: argparse.Namespace, stub: Stub) -> int:
    confirm_caller(args, stub)
    change = stub.GetChange(admin_pb2.GetChangeRequest(id=args.id), timeout=args.timeout).change
    _confirm(args, change, args.verb)
    try:
        if args.verb == "approve":
            # The hash is the one shown to the approver; a change altered since fails it.
            expected = args.hash or change.hash
            decided = stub.ApproveChange(
                admin_pb2.ApproveChangeRequest(id=args.id, hash=expected), timeout=args.timeout
            ).change
        else:
            request = admin_pb2.RejectChangeRequest(id=args.id, note=args.note or "")
            decided = stub.RejectChange(request, timeout=args.timeout).change
    except wire.RpcError as err:
        if not outcome_unknown(err):
            raise
        # The daemon decides (and applies) in a task a client leaving does not cut.
        raise failed_call(err, f"whether change {change.id} was {args.verb}d is not known: "
                             f"see ironctl change show {change.id}") from None  # fmt: skip
    if args.json:
        print_json(decided)
    else:
        print(f"change {decided.id}: {decided.state}")
    return exitcodes.OK
