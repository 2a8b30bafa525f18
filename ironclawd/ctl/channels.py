"""``ironctl channel ...``: the channels people reach agents on (docs/channels.md): status,
counters and failed deliveries, an end-to-end test, and messages held for an operator.

Everything a channel shows came from its senders: text is printed with control, escape and
bidi characters made visible (``render.visible``), as text (render's cells are never markup)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render
from ironclawd.ctl.shapes import print_json, to_dict

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub

HELD_TEXT = 200  # characters of a held message shown in the table


def _shown(text: str, limit: int = 0) -> str:
    """Text from outside, made visible; past ``limit`` characters cut at a word boundary (a
    first word longer than that is kept whole: a table never splits a word)."""
    text = render.visible(text)
    if limit and len(text) > limit:
        cut = text.rfind(" ", 0, limit + 1)
        end = cut if cut > 0 else len(text.split(" ", 1)[0])
        text = text[:end].rstrip() + "…" if end < len(text) else text
    return text


def _counts(values: Any) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(values.items())) or "-"


def cmd_list(args: argparse.Namespace, stub: Stub) -> int:
    reply = stub.ListChannels(admin_pb2.ListChannelsRequest(), timeout=args.timeout)
    if args.json:
        print_json(reply)
        return exitcodes.OK
    rows: list[list[render.Cell]] = [
        [c.name, c.kind, ("connected", "") if c.connected else ("down", "bold red"),
         _shown(c.detail), str(c.held), _counts(c.deliveries), _shown(c.last_error, 120)]
        for c in reply.channels
    ]  # fmt: skip
    render.table(("CHANNEL", "KIND", "STATUS", "WHERE", "HELD", "DELIVERIES", "ERROR"), rows,
                 legend=not args.no_legend,
                 summary="" if rows else "no channels configured")  # fmt: skip
    return exitcodes.OK


def cmd_show(args: argparse.Namespace, stub: Stub) -> int:
    c = stub.GetChannel(admin_pb2.GetChannelRequest(name=args.name), timeout=args.timeout).channel
    if args.json:
        print_json(c)
        return exitcodes.OK
    last_error = f"{c.last_error} ({render.when(c.last_error_at)})" if c.last_error else ""
    render.fields([
        ("channel", _shown(f"{c.name} ({c.kind})")),
        ("status", ("connected", "") if c.connected else ("down", "bold red")),
        ("where", _shown(c.detail)),
        ("last error", _shown(last_error)),
        ("counters", _counts(c.counters)),
        ("deliveries", _counts(c.deliveries)),
        ("held", str(c.held)),
    ])  # fmt: skip
    if c.failures:
        rows = [[_shown(d.delivery_id), d.state, str(d.attempts), render.when(d.updated_at),
                 _shown(d.last_error)] for d in c.failures]  # fmt: skip
        render.table(("DELIVERY", "STATE", "ATTEMPTS", "WHEN", "ERROR"), rows,
                     legend=not args.no_legend, title="failed or retrying deliveries")  # fmt: skip
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
    after = reply.next_after_id
    while after:  # the daemon answers a page at a time
        page = stub.ListHeld(admin_pb2.ListHeldRequest(after_id=after), timeout=args.timeout)
        reply.held.extend(page.held)
        after = page.next_after_id
    if args.json:
        print(json.dumps({"held": [to_dict(h) for h in reply.held]}, indent=2))
        return exitcodes.OK
    rows = [[h.id, h.channel, _shown(h.where), _shown(h.sender), render.when(h.received_at),
             _shown(h.text, HELD_TEXT)] for h in reply.held]  # fmt: skip
    render.table(("ID", "CHANNEL", "WHERE", "SENDER", "RECEIVED", "TEXT"), rows,
                 legend=not args.no_legend, summary="" if rows else "no held messages")  # fmt: skip
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
