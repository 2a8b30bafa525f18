"""``ironctl channel ...``: the channels people reach agents on (docs/channels.md): status,
counters and failed deliveries, an end-to-end test, and messages held for an operator.

Everything a channel shows came from its senders: text is printed with control, escape and
bidi characters made visible (``render.visible``), never as markup."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from rich.markup import escape
from rich.table import Table

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render
from ironclawd.ctl.common import Stub, add_command, print_json, to_dict

HELD_TEXT = 200  # characters of a held message shown in the table


def _shown(text: str, limit: int = 0) -> str:
    text = render.visible(text)
    if limit and len(text) > limit:
        text = text[:limit] + "…"
    return escape(text)


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S") if seconds else "-"


def _counts(values: Any) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(values.items())) or "-"


def cmd_list(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.ListChannels(admin_pb2.ListChannelsRequest(), timeout=args.timeout)
    if args.json:
        print_json(reply)
        return exitcodes.OK
    table = Table()
    for column in ("CHANNEL", "KIND", "STATUS", "WHERE", "HELD", "DELIVERIES", "LAST ERROR"):
        table.add_column(column, overflow="fold")
    for c in reply.channels:
        table.add_row(
            c.name, c.kind, "connected" if c.connected else "[bold red]down[/]",
            _shown(c.detail), str(c.held), _counts(c.deliveries), _shown(c.last_error, 120),
        )  # fmt: skip
    render.console().print(table if reply.channels else "no channels configured")
    return exitcodes.OK


def cmd_show(args: argparse.Namespace, stub: Stub) -> int:
    c = stub.GetChannel(admin_pb2.GetChannelRequest(name=args.name), timeout=args.timeout).channel
    if args.json:
        print_json(c)
        return exitcodes.OK
    table = Table(show_header=False, box=None)
    rows = [
        ("channel", f"{c.name} ({c.kind})"),
        ("status", "connected" if c.connected else "down"),
        ("where", c.detail),
        ("last error", f"{c.last_error} ({_when(c.last_error_at)})" if c.last_error else "-"),
        ("counters", _counts(c.counters)),
        ("deliveries", _counts(c.deliveries)),
        ("held", str(c.held)),
    ]
    for key, value in rows:
        table.add_row(key, _shown(value))
    console = render.console()
    console.print(table)
    if c.failures:
        failures = Table(title="failed or retrying deliveries")
        for column in ("DELIVERY", "STATE", "ATTEMPTS", "WHEN", "ERROR"):
            failures.add_column(column, overflow="fold")
        for d in c.failures:
            failures.add_row(
                d.delivery_id, d.state, str(d.attempts), _when(d.updated_at), _shown(d.last_error)
            )
        console.print(failures)
    return exitcodes.OK


def cmd_test(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.TestChannel(admin_pb2.TestChannelRequest(name=args.name), timeout=args.timeout)
    if args.json:
        print_json(reply, ok=True)
    else:
        print(f"channel {args.name}: ok: {render.visible(reply.detail)}")
    return exitcodes.OK


def cmd_held(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.ListHeld(admin_pb2.ListHeldRequest(), timeout=args.timeout)
    if args.json:
        print(json.dumps({"held": [to_dict(h) for h in reply.held]}, indent=2))
        return exitcodes.OK
    table = Table()
    for column in ("ID", "CHANNEL", "WHERE", "SENDER", "RECEIVED", "TEXT"):
        table.add_column(column, overflow="fold")
    for h in reply.held:
        table.add_row(
            str(h.id), h.channel, _shown(h.where), _shown(h.sender), _when(h.received_at),
            _shown(h.text, HELD_TEXT),
        )  # fmt: skip
    render.console().print(table if reply.held else "no held messages")
    return exitcodes.OK


def cmd_admit(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.AdmitHeld(admin_pb2.AdmitHeldRequest(id=args.id), timeout=args.timeout)
    if args.json:
        print_json(reply)
    else:
        held = render.visible(args.id)
        print(f"held message {held}: {reply.admission} to session {reply.sid} as #{reply.seq}")
    return exitcodes.OK


def cmd_drop(args: argparse.Namespace, stub: Stub) -> int:
    stub.DropHeld(admin_pb2.DropHeldRequest(id=args.id), timeout=args.timeout)
    if args.json:
        print(json.dumps({"dropped": args.id}))
    else:
        print(f"held message {render.visible(args.id)}: dropped")
    return exitcodes.OK


def register(sub: Any) -> None:
    group = sub.add_parser(
        "channel",
        help="the channels (Matrix, signed webhooks) people reach agents on",
        description="Status, counters and failed deliveries of each configured channel; a test "
        "of one end to end; messages held from unknown senders, to admit or drop "
        "(docs/channels.md).",
        epilog=exitcodes.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = group.add_subparsers(dest="verb", metavar="VERB", required=True)
    add_command(verbs, "list", "list channels with their status", "ironctl channel list",
                cmd_list)  # fmt: skip
    for verb, text, handler in (
        ("show", "show a channel: status, counters, failed deliveries", cmd_show),
        ("test", "check a channel end to end without sending a message", cmd_test),
    ):
        cmd = add_command(verbs, verb, text, f"ironctl channel {verb} chat", handler)
        cmd.add_argument("name", metavar="NAME", help="channel name (see: ironctl channel list)")
    add_command(verbs, "held", "list messages held from senders not allowed yet",
                "ironctl channel held --json", cmd_held)  # fmt: skip
    for verb, text, handler in (
        ("admit", "queue a held message to its agent, as if its sender were allowed", cmd_admit),
        ("drop", "delete a held message", cmd_drop),
    ):
        cmd = add_command(verbs, verb, text, f"ironctl channel {verb} 3", handler)
        cmd.add_argument("id", metavar="ID", help="held message id (see: ironctl channel held)")
