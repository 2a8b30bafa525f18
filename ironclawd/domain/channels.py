"""Channels, wiring and permissions as values (docs/channels.md, docs/architecture.md §7). Pure.

A channel is host infrastructure from the configuration (``ChannelConfig``). An agent's
``wiring`` (routes: which room or webhook endpoint reaches it, when it engages, how sessions
form, where replies go) and its ``permissions`` (who may talk to it, what happens to an unknown
sender, which host group approves which change kind for it) are set only by approved changes.
Identities are namespaced: ``<channel>:<raw>`` for what a channel's server asserts,
``user:<name>`` and ``group:<name>`` for host users and groups, so two channels never collide.
Everything a route holds is checked here; a hostile sender's text only ever meets ``engages``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ironclawd import lazy_re
from ironclawd.errors import InvalidArgument

# The regex parser CPython compiles with (re._parser: sre_parse without its deprecation warning).
sre_parse: Any = importlib.import_module("re._parser")
c: Any = importlib.import_module("re._constants")

ENGAGE = ("always", "mention", "pattern")
SESSIONS = ("per_sender", "per_room", "shared")
UNKNOWN = ("drop", "hold")
CHANNEL_TYPES = ("matrix", "webhook")
CHANNEL_NAME_RE = lazy_re.compile(r"[a-z][a-z0-9-]{0,31}")
# Namespaces of host identities: no channel may be named like them.
RESERVED_CHANNEL_NAMES = frozenset({"user", "group"})
ENDPOINT_NAME_RE = lazy_re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# "!opaque:server"; room version 12 ids are "!hash" alone (no server part).
ROOM_ID_RE = lazy_re.compile(r"![\x21-\x39\x3b-\x7e]{1,255}(:[\x21-\x7e]{1,255})?")
HOST_NAME_RE = lazy_re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # a POSIX user or group name
RAW_IDENTITY_RE = lazy_re.compile(r"[\x21-\x7e]{1,255}")  # printable ASCII, no space
MAX_PATTERN = 200
PATTERN_TEXT = 4096  # a pattern only ever sees the first this many characters of a message
MAX_URL = 2048
MAX_ALLOW = 256


@dataclass(frozen=True)
class Route:
    channel: str  # a [[channels]] name
    where: str  # Matrix room id "!x:server" | webhook endpoint name
    engage: str = "always"  # ENGAGE
    pattern: str = ""  # only with engage == "pattern"
    sessions: str = "per_sender"  # SESSIONS
    reply_url: str = ""  # webhook routes only: where replies are POSTed ("" = nowhere)


@dataclass(frozen=True)
class Permissions:
    allow: tuple[str, ...] = ()  # identities "<channel>:<raw>", "user:<n>", "group:<n>"
    unknown: str = "drop"  # UNKNOWN: what happens to a sender not allowed
    approvers: tuple[tuple[str, str], ...] = ()  # (change kind, host group), sorted by kind


@dataclass(frozen=True)
class WebhookEndpoint:
    name: str  # ENDPOINT_NAME_RE; URL path /hooks/<name>
    secret_credential: str  # credential holding the HMAC key (>= 32 bytes of text)


@dataclass(frozen=True)
class ChannelConfig:
    name: str  # CHANNEL_NAME_RE
    type: str  # "matrix" | "webhook"
    # matrix
    homeserver: str = ""  # https://… (http:// only for loopback)
    user_id: str = ""  # @bot:server
    token_credential: str = ""  # credential holding the bot's access token
    device_id: str = "IRONCLAW"
    # webhook
    listen: str = ""  # "127.0.0.1:8787" | "[::1]:8787" | "unix:/run/ironclaw/hooks.sock"
    endpoints: tuple[WebhookEndpoint, ...] = ()
    replay_window_seconds: float = 300.0
    # both
    max_message_bytes: int = 16384
    sender_messages_per_minute: int = 20
    channel_messages_per_minute: int = 600


# -- routes -----------------------------------------------------------------------------------


def route_from_mapping(raw: object, where: str = "route") -> Route:
    """A route checked field by field; InvalidArgument names ``where.field`` and what was
    expected."""
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{where}: expected an object with channel, where, engage, ...")
    _only(raw, where, {"channel", "where", "engage", "pattern", "sessions", "reply_url"})
    channel = check_channel_name(raw.get("channel"), f"{where}.channel")
    place = raw.get("where")
    if not isinstance(place, str) or not (is_room_id(place) or is_endpoint_name(place)):
        raise InvalidArgument(
            f"{where}.where: expected a Matrix room id !id:server or a webhook endpoint name "
            f"{ENDPOINT_NAME_RE.pattern}, got {_shown(place)}"
        )
    engage = _choice(raw.get("engage", "always"), ENGAGE, f"{where}.engage")
    pattern = raw.get("pattern", "")
    if engage == "pattern":
        pattern = check_pattern(pattern, f"{where}.pattern")
    elif pattern != "":
        raise InvalidArgument(f"{where}.pattern: only with engage = pattern (engage is {engage})")
    sessions = _choice(raw.get("sessions", "per_sender"), SESSIONS, f"{where}.sessions")
    reply_url = check_reply_url(raw.get("reply_url", ""), f"{where}.reply_url")
    return Route(channel, place, engage, pattern, sessions, reply_url)


def route_to_mapping(route: Route) -> dict[str, Any]:
    """The canonical form (defaults left out, so the JSON parses back to the same route)."""
    out: dict[str, Any] = {"channel": route.channel, "where": route.where}
    if route.engage != "always":
        out["engage"] = route.engage
    if route.pattern:
        out["pattern"] = route.pattern
    if route.sessions != "per_sender":
        out["sessions"] = route.sessions
    if route.reply_url:
        out["reply_url"] = route.reply_url
    return out


def is_room_id(text: str) -> bool:
    return len(text) <= 255 and ROOM_ID_RE.fullmatch(text) is not None


def is_endpoint_name(text: str) -> bool:
    return ENDPOINT_NAME_RE.fullmatch(text) is not None


def check_channel_name(raw: object, where: str) -> str:
    if not isinstance(raw, str) or CHANNEL_NAME_RE.fullmatch(raw) is None:
        raise InvalidArgument(
            f"{where}: expected a channel name {CHANNEL_NAME_RE.pattern}, got {_shown(raw)}"
        )
    if raw in RESERVED_CHANNEL_NAMES:
        raise InvalidArgument(f"{where}: {raw} names host identities, not a channel")
    return raw


def check_reply_url(raw: object, where: str) -> str:
    """``""`` or an http(s) URL without credentials or fragment. Which addresses it may reach is
    the egress broker's rules at delivery time, not this."""
    if raw == "":
        return ""
    expected = f"expected an http:// or https:// URL of at most {MAX_URL} printable chars"
    if not isinstance(raw, str) or len(raw) > MAX_URL or not raw.isascii():
        raise InvalidArgument(f"{where}: {expected}")
    if not raw.isprintable() or " " in raw:
        raise InvalidArgument(f"{where}: {expected}")
    try:
        parts = urlsplit(raw)
        _ = parts.port
    except ValueError:
        raise InvalidArgument(f"{where}: {expected}, got {raw!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"{where}: {expected}, got {raw!r}")
    if "@" in parts.netloc or parts.fragment or "#" in raw:
        raise InvalidArgument(f"{where}: no user:password@ or #fragment in a reply URL")
    return raw


# -- engage patterns --------------------------------------------------------------------------


def check_pattern(pattern: object, where: str = "pattern") -> str:
    """A Python regex safe to run on hostile text: at most ``MAX_PATTERN`` chars, compiles, no
    backreference, no repeat inside a repeat, no alternation under an unbounded repeat, and a
    bounded number of ways to match at each position (``_cost``): measured, ``a*a*b`` on 4 KiB
    of ``a`` ran 400 s, ``a*a?a?x`` 2 s."""
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN:
        raise InvalidArgument(f"{where}: expected a regular expression of 1 to {MAX_PATTERN} chars")
    try:
        tree = sre_parse.parse(pattern, re.IGNORECASE)
        re.compile(pattern, re.IGNORECASE)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InvalidArgument(f"{where}: not a regular expression ({exc})") from None
    cost = _cost(tree, where, inside=None)
    if cost > BACKTRACK_BUDGET:
        raise InvalidArgument(
            f"{where}: too much backtracking possible on hostile text (more than "
            f"{BACKTRACK_BUDGET} ways to try at a position: each *, + or {{n,}} counts "
            f"{PATTERN_TEXT}, each ?, {{m,n}} and alternation multiplies); use one unbounded "
            "repeat at most and bound the others"
        )
    return pattern


# Ways a pattern may try to match at one position: one unbounded repeat over the text and a
# factor of 2 (a*a?x: at worst ~0.4 s on 4 KiB here). Sequential choices multiply.
BACKTRACK_BUDGET = 2 * PATTERN_TEXT
_REPEATS = {c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)}
_CAP = BACKTRACK_BUDGET + 1


def _cost(items: Any, where: str, inside: str | None) -> int:
    """Refuse what can backtrack exponentially; else the ways ``items`` can be tried at one
    position (capped just above the budget)."""
    total = 1
    for op, av in items:
        if op in (c.GROUPREF, c.GROUPREF_EXISTS, getattr(c, "GROUPREF_IGNORE", c.GROUPREF)):
            raise InvalidArgument(f"{where}: backreferences ((?P=name), \\1, (?(1)…)) not allowed")
        if op in _REPEATS:
            low, high, sub = av
            if inside is not None:
                raise InvalidArgument(
                    f"{where}: a repeat inside a repeat is not allowed (it can backtrack "
                    "exponentially on hostile text)"
                )
            unbounded = high == c.MAXREPEAT
            inner = _cost(sub, where, "unbounded" if unbounded else "bounded")
            ways = PATTERN_TEXT if unbounded else min(high - low + 1, _CAP) * _power(inner, high)
        elif op is c.BRANCH:
            if inside == "unbounded":
                raise InvalidArgument(
                    f"{where}: an alternation (a|b) under an unbounded repeat is not allowed; "
                    "use a character class or bound the repeat"
                )
            ways = sum(_cost(branch, where, inside) for branch in av[1])
        elif op is c.SUBPATTERN:
            ways = _cost(av[-1], where, inside)
        elif op in (c.ASSERT, c.ASSERT_NOT):
            ways = _cost(av[1], where, inside)
        elif op is getattr(c, "ATOMIC_GROUP", None):
            ways = _cost(av, where, inside)
        else:
            ways = 1
        total = min(total * ways, _CAP)
    return total


def _power(base: int, exponent: int) -> int:
    """``base ** exponent`` capped at ``_CAP`` without computing a huge number."""
    out = 1
    for _ in range(exponent):
        if base == 1 or out >= _CAP:
            break
        out *= base
    return min(out, _CAP)


def engages(route: Route, text: str, mentioned: bool) -> bool:
    """Whether a message wakes the agent on this route."""
    if route.engage == "always":
        return True
    if route.engage == "mention":
        return mentioned
    return re.search(route.pattern, text[:PATTERN_TEXT], re.IGNORECASE) is not None


def session_key(route: Route, sender_identity: str, where: str, thread: str) -> str:
    """Which session of the agent a message goes to, within its (channel, where)."""
    if route.sessions == "per_sender":
        return sender_identity
    if route.sessions == "per_room":
        return where + ("/" + thread if thread else "")
    return "*"


# -- permissions ------------------------------------------------------------------------------


def permissions_from_mapping(
    raw: object, kinds: Collection[str] | None = None, where: str = "permissions"
) -> Permissions:
    """Permissions checked field by field; ``kinds``: the change kinds an approver group may be
    named for (None: any name)."""
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{where}: expected an object with allow, unknown, approvers")
    _only(raw, where, {"allow", "unknown", "approvers"})
    allow = raw.get("allow", [])
    if not isinstance(allow, list) or len(allow) > MAX_ALLOW:
        raise InvalidArgument(f"{where}.allow: expected a list of at most {MAX_ALLOW} identities")
    identities = tuple(sorted({check_identity(a, f"{where}.allow") for a in allow}))
    unknown = _choice(raw.get("unknown", "drop"), UNKNOWN, f"{where}.unknown")
    approvers = raw.get("approvers", {})
    if not isinstance(approvers, Mapping):
        raise InvalidArgument(f'{where}.approvers: expected an object {{"<kind>": "<group>"}}')
    pairs: list[tuple[str, str]] = []
    for kind, group in approvers.items():
        if kinds is not None and kind not in kinds:
            raise InvalidArgument(
                f"{where}.approvers: unknown change kind {_shown(kind)} "
                f"(expected one of: {', '.join(kinds)})"
            )
        if not isinstance(kind, str) or not isinstance(group, str) or not _host_name(group):
            raise InvalidArgument(
                f"{where}.approvers.{kind}: expected a host group name "
                f"{HOST_NAME_RE.pattern}, got {_shown(group)}"
            )
        pairs.append((kind, group))
    return Permissions(identities, unknown, tuple(sorted(pairs)))


def permissions_to_mapping(perms: Permissions) -> dict[str, Any]:
    return {
        "allow": list(perms.allow),
        "unknown": perms.unknown,
        "approvers": dict(perms.approvers),
    }


def check_identity(raw: object, where: str) -> str:
    """``user:<name>``, ``group:<name>`` or ``<channel>:<raw>`` (raw: printable, no space)."""
    prefix, sep, rest = raw.partition(":") if isinstance(raw, str) else ("", "", "")
    if sep and prefix in RESERVED_CHANNEL_NAMES and _host_name(rest):
        return f"{prefix}:{rest}"
    if (
        sep and prefix not in RESERVED_CHANNEL_NAMES and CHANNEL_NAME_RE.fullmatch(prefix)
        and RAW_IDENTITY_RE.fullmatch(rest)
    ):  # fmt: skip
        return f"{prefix}:{rest}"
    raise InvalidArgument(
        f"{where}: expected user:<name>, group:<name> or <channel>:<identity> "
        f"(e.g. chat:@alice:example.org), got {_shown(raw)}"
    )


def admission(perms: Permissions, sender_identity: str) -> str:
    """ "allow" for a listed channel identity, else the permissions' rule for unknown senders."""
    return "allow" if sender_identity in perms.allow else perms.unknown


def host_user_allowed(perms: Permissions, user: str, groups: Sequence[str]) -> bool:
    """Whether host user ``user`` (in host ``groups``) may talk to the agent through the admin
    API: anyone when the permissions name no host user or group, else only those named."""
    hosts = [a for a in perms.allow if a.startswith(("user:", "group:"))]
    if not hosts:
        return True
    return f"user:{user}" in hosts or any(f"group:{g}" in hosts for g in groups)


def approver_group(perms: Permissions, kind: str) -> str | None:
    """The host group whose members alone may decide ``kind`` changes for the agent."""
    return dict(perms.approvers).get(kind)


# -- helpers ----------------------------------------------------------------------------------


def _only(raw: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    extra = sorted(str(k) for k in set(raw) - allowed)
    if extra:
        raise InvalidArgument(
            f"{where}: unexpected key(s) {', '.join(extra)} "
            f"(expected: {', '.join(sorted(allowed))})"
        )


def _choice(raw: object, options: tuple[str, ...], where: str) -> str:
    if raw not in options:
        raise InvalidArgument(f"{where}: expected one of {', '.join(options)}, got {_shown(raw)}")
    assert isinstance(raw, str)
    return raw


def _host_name(text: str) -> bool:
    return HOST_NAME_RE.fullmatch(text) is not None


def _shown(raw: object) -> str:
    """A hostile value shown bounded and escaped."""
    text = repr(raw)
    return text if len(text) <= 80 else text[:77] + "..."


def endpoint_event_id(endpoint: str, event_id: str) -> str:
    """The inbox's id of a webhook endpoint's event: ``<endpoint>/<its event id>`` (an endpoint
    name has no '/'): two endpoints (two senders) may use the same ids."""
    return f"{endpoint}/{event_id}"


def sender_event_id(where: str, stored: str) -> str:
    """The id its sender gave an event, from the inbox's (``endpoint_event_id``); any other id
    (a Matrix event's, or a webhook event's stored before endpoints named theirs) as it is."""
    prefix = f"{where}/"
    return stored[len(prefix) :] if stored.startswith(prefix) else stored
