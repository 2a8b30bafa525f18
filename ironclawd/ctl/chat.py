"""``ironctl send`` (for scripts) and ``ironctl chat`` (interactive)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ironclaw.admin.v1 import admin_pb2
from ironclawd.ctl import exitcodes, render, wire
from ironclawd.ctl.common import (
    CtlError,
    UsageError,
    decode_stdin,
    failed_call,
    outcome_unknown,
    read_stdin,
)
from ironclawd.ctl.shapes import print_json, to_dict
from ironclawd.ctl.text import visible

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub


def _send(
    stub: Stub, sid: str, text: str, timeout: float, client_id: str | None = None
) -> admin_pb2.SendMessageResponse:
    # The client id makes the daemon queue a request it receives twice (a resent frame) once.
    # Without --client-id each run of ironctl makes a new one: a re-run is a second message,
    # which is why a failure after the daemon may have queued it says so. 128 random bits in
    # hex, as uuid4().hex was (uuid imports platform: milliseconds).
    request = admin_pb2.SendMessageRequest(
        sid=sid, text=text, client_id=client_id or os.urandom(16).hex()
    )
    try:
        reply: admin_pb2.SendMessageResponse = stub.SendMessage(request, timeout=timeout)
    except wire.RpcError as err:
        if not outcome_unknown(err):
            raise  # refused, or never reached the daemon: not queued
        raise failed_call(err, _unknown(sid)) from None
    except KeyboardInterrupt:
        _interrupted(_unknown(sid))
        raise
    return reply


def _unknown(sid: str) -> str:
    return (f"the message may or may not have been queued to session {sid}: look for its "
            f"reply before sending it again: {_watch_hint(sid, 0)}")  # fmt: skip


def _queued(sid: str, seq: int, after: int) -> str:
    return (f"message {seq} is queued to session {sid}: do not send it again; its reply, "
            f"once there: {_watch_hint(sid, after)}")  # fmt: skip


def _interrupted(what: str) -> None:
    """Ctrl-C came while a message was in flight: say where it stands (main() ends quietly)."""
    print(f"\nironctl: interrupted: {visible(what)}", file=sys.stderr, flush=True)


def _watch_hint(sid: str, after: int) -> str:
    request = json.dumps({"sid": sid, "after_seq": after} if after else {"sid": sid})
    return f"ironctl api call WatchReplies '{request}'"


def _replies(stub: Stub, sid: str, after: int, timeout: float | None) -> Iterator[admin_pb2.Reply]:
    request = admin_pb2.WatchRepliesRequest(sid=sid, after_seq=after, follow=True)
    for item in stub.WatchReplies(request, timeout=timeout):
        yield item.reply


def _answer(
    stub: Stub, sid: str, sent: admin_pb2.SendMessageResponse, timeout: float
) -> admin_pb2.Reply:

    # A repeated client id answers the first message's seq, whose reply may be in already
    # (the hints below look from there too).
    after = 0 if sent.duplicate else sent.replies_before
    try:
        for reply in _replies(stub, sid, after, timeout):
            if reply.in_reply_to == sent.seq:
                return reply
    except wire.RpcError as err:
        # The message is queued and will be answered: sent again, it would be a second one.
        raise failed_call(err, _queued(sid, sent.seq, after)) from None
    except KeyboardInterrupt:
        _interrupted(_queued(sid, sent.seq, after))
        raise
    # A follow stream ends without an error only when the daemon closes it (the session was
    # stopped or removed, the daemon is shutting down): a failure the operator can act on.
    raise CtlError(
        "NO_REPLY",
        exitcodes.FAILED,
        f"session {sid}: the reply stream ended before the reply to message {sent.seq} "
        "(was the session stopped, or the daemon restarted?); the message stays queued: "
        f"see ironctl session show {sid}; its reply, once there: "
        f"{_watch_hint(sid, after)}",
    )


def cmd_send(args: argparse.Namespace, stub: Stub) -> int:
    text = read_stdin() if args.text == "-" else args.text
    sent = _send(stub, args.sid, text, args.timeout, args.client_id)
    # The daemon matches the id alone, not the text: words sent under an id used before are
    # not queued, and the reply is the first message's.
    again = sent.duplicate and args.client_id and not args.json
    said = f"client id {args.client_id} was used before, for message {sent.seq}: nothing new queued"
    if args.no_wait:
        doc: dict[str, Any] = {"seq": sent.seq, "duplicate": sent.duplicate}
        print(json.dumps(doc) if args.json else said if again else f"queued as message {sent.seq}")
        return exitcodes.OK
    if again:
        print(f"ironctl send: {said}; its reply:", file=sys.stderr)
    reply = _answer(stub, args.sid, sent, args.timeout)
    if args.json:
        print(json.dumps({"seq": sent.seq, "reply": to_dict(reply)}))
    else:
        print(render.visible(reply.text, newlines=True))
    return exitcodes.OK


def cmd_chat(args: argparse.Namespace, stub: Stub) -> int:
    sid, made = args.sid, None
    if not sid:
        if not args.agent:
            raise UsageError("ironctl chat: give a session id or --agent NAME")
        created = stub.CreateSession(
            admin_pb2.CreateSessionRequest(agent=args.agent), timeout=args.timeout
        )
        made = created.session
        sid = made.sid
        print(f"started session {sid} of agent {render.visible(args.agent)}", file=sys.stderr)
    interactive = sys.stdin.isatty()
    asked = False
    try:
        while True:
            if interactive:
                print("you> ", end="", flush=True)
            line = decode_stdin(sys.stdin.buffer.readline())
            if not line:
                return exitcodes.OK
            text = line.rstrip("\n")
            if not text.strip():
                continue
            asked = True  # from here the session holds the operator's words: it stays
            sent = _send(stub, sid, text, args.timeout)
            reply = _answer(stub, sid, sent, args.timeout)
            prefix = "agent> " if interactive else ""
            print(prefix + render.visible(reply.text, newlines=True), flush=True)
    finally:
        if made is not None and not asked:
            _remove_unused(stub, made, args.timeout)


def _remove_unused(stub: Stub, made: admin_pb2.Session, timeout: float) -> None:
    """A session ``chat --agent`` started and nothing was said in: removed, not left running
    (``ironctl chat --agent demo </dev/null`` left one for every run, a pooled sandbox taken
    each time; found by a review, stop 50). A failure to remove is said, never raised. One a
    message was queued to (another operator's send: its id is listed from the start) is
    someone else's conversation now: kept. The daemon judges that itself (``only_if_unused``:
    exact, with sends held back meanwhile); the activity read first is what keeps it from an
    older daemon, which ignores the field (a send between that read and the removal is then
    lost, as before the field)."""
    sid = made.sid
    request = admin_pb2.RemoveSessionRequest(sid=sid, force=True, only_if_unused=True)
    try:
        now = stub.GetSession(admin_pb2.GetSessionRequest(sid=sid), timeout=timeout).session
        if now.last_active_at != made.last_active_at:
            print(f"ironctl chat: nothing was sent from here, but session {sid} got a message "
                  "meanwhile: kept", file=sys.stderr)  # fmt: skip
            return
        stub.RemoveSession(request, timeout=timeout)
    except wire.RpcError as err:
        said = visible(err.details())
        if err.code().name == "FAILED_PRECONDITION":  # a message reached it: kept
            print(f"ironctl chat: nothing was sent from here, but session {sid} is kept: {said}",
                  file=sys.stderr)  # fmt: skip
            return
        print(f"ironctl chat: nothing was sent, but session {sid} could not be removed: {said}",
              file=sys.stderr)  # fmt: skip
        return
    print(f"ironctl chat: nothing was sent: removed session {sid}", file=sys.stderr)


def cmd_verify(args: argparse.Namespace, stub: Stub) -> int:
    report = stub.VerifySession(admin_pb2.VerifySessionRequest(sid=args.sid), timeout=args.timeout)
    if args.json:
        print_json(report)
    elif report.ok:
        pruned = f" ({report.pruned} more dropped by the agent as told)" if report.pruned else ""
        print(
            f"session {render.visible(args.sid)}: {report.checked} ingested replies verified"
            + pruned
        )
    else:
        print(
            f"session {args.sid}: TAMPERING at reply {report.first_bad_seq}: {report.problem} "
            f"({report.checked} verified before it)"
        )
    return exitcodes.OK if report.ok else exitcodes.FAILED
