"""ironclawd/domain/channels.py: routes, permissions and engage patterns as checked values.
Every refusal names the field and what was expected; patterns that can backtrack without bound
on a hostile message are refused before any message meets them."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ironclawd.domain.channels import (
    ENGAGE,
    SESSIONS,
    Permissions,
    Route,
    admission,
    approver_group,
    check_pattern,
    engages,
    host_user_allowed,
    permissions_from_mapping,
    permissions_to_mapping,
    route_from_mapping,
    route_to_mapping,
    session_key,
)
from ironclawd.errors import InvalidArgument

ROOM = "!abc:example.org"


def _route(**fields: Any) -> Route:
    return route_from_mapping({"channel": "chat", "where": ROOM, **fields})


def test_a_route_round_trips_and_leaves_defaults_out() -> None:
    full = {"channel": "hooks", "where": "github", "engage": "pattern", "pattern": r"^deploy\b",
            "sessions": "shared", "reply_url": "https://ci.example.com/reply"}  # fmt: skip
    route = route_from_mapping(full)
    assert route_to_mapping(route) == full
    assert route_to_mapping(_route()) == {"channel": "chat", "where": ROOM}
    assert _route() == Route("chat", ROOM)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"channel": "Chat"}, "route.channel: expected a channel name"),
        ({"channel": "user"}, "route.channel: user names host identities"),
        ({"channel": 3}, "route.channel: expected a channel name"),
        ({"where": "#alias:example.org"}, "route.where: expected a Matrix room id"),
        ({"where": "!a b:x"}, "route.where: expected a Matrix room id"),
        ({"where": "!"}, "route.where: expected a Matrix room id"),
        ({"where": "a b"}, "route.where: expected"),
        ({"where": "x" * 65}, "route.where: expected"),
        ({"where": "!" + "a" * 255 + ":s"}, "route.where: expected"),
        ({"engage": "sometimes"}, "route.engage: expected one of always, mention, pattern"),
        ({"pattern": "x"}, "route.pattern: only with engage = pattern"),
        ({"engage": "pattern"}, "route.pattern: expected a regular expression of 1 to 200"),
        ({"sessions": "per_day"}, "route.sessions: expected one of per_sender, per_room"),
        ({"reply_url": "ftp://x.example"}, "route.reply_url: expected an http:// or https://"),
        ({"reply_url": "https://u:p@x.example/"}, "route.reply_url: no user:password@"),
        ({"reply_url": "https://x.example/#f"}, "route.reply_url: no user:password@ or #frag"),
        ({"reply_url": "https://x.example/\n"}, "route.reply_url: expected"),
        ({"reply_url": "https://x.example:99999/"}, "route.reply_url: expected"),
        ({"reply_url": "https://" + "a" * 2048}, "route.reply_url: expected"),
        ({"reply_url": "http:///path"}, "route.reply_url: expected"),
        ({"room": ROOM}, "route: unexpected key(s) room (expected: channel, engage,"),
    ],
)
def test_every_bad_route_field_is_named(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        _route(**fields)
    assert needle in str(err.value), str(err.value)


def test_room_ids_of_every_room_version_are_accepted() -> None:
    for room in ("!abc:example.org", "!abc:example.org:8448", "!Ab0_-hash31xyz"):
        assert _route(where=room).where == room


def test_a_route_that_is_not_an_object_is_refused() -> None:
    raws: tuple[object, ...] = (None, [], "chat")
    for raw in raws:
        with pytest.raises(InvalidArgument, match="route: expected an object"):
            route_from_mapping(raw)


# -- patterns ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [r"\bdeploy\b", r"^!bot\s", r"(?:status|deploy) now", r"x(?:foo|bar){0,3}", r"[ab]+c",
     r"^\w+: (urgent|p1)", r"a{2,5}b{0,3}", r"\bops\b.*\bdown\b"],
)  # fmt: skip
def test_ordinary_patterns_are_accepted(pattern: str) -> None:
    assert check_pattern(pattern) == pattern


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [
        (r"(a+)+b", "a repeat inside a repeat"),
        (r"(?:a{1,3}){1,3}", "a repeat inside a repeat"),
        (r"(x(a*)){2}", "a repeat inside a repeat"),
        (r"(?=(a+)+)", "a repeat inside a repeat"),
        (r"(a|ab)*c", "an alternation (a|b) under an unbounded repeat"),
        (r"(?:foo|bar)+", "an alternation (a|b) under an unbounded repeat"),
        (r"a*a*b", "too much backtracking possible"),
        (r"a*a?a?x", "too much backtracking possible"),
        (r"(?:ab|cd|ef)" * 10, "too much backtracking possible"),
        (r"x(?:ab|cd){0,20}", "too much backtracking possible"),
        (r"\s*\w+x", "too much backtracking possible"),
        (r"(\w)\1", "backreferences"),
        (r"(?P<x>a)(?P=x)", "backreferences"),
        (r"(a)?(?(1)b|c)", "backreferences"),
        (r"[", "not a regular expression"),
        (r"a{2,1}", "not a regular expression"),
        ("", "expected a regular expression of 1 to 200 chars"),
        ("a" * 201, "expected a regular expression of 1 to 200 chars"),
    ],
)
def test_patterns_that_backtrack_without_bound_are_refused(pattern: str, needle: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_pattern(pattern, "payload.routes[0].pattern")
    assert str(err.value).startswith("payload.routes[0].pattern: "), str(err.value)
    assert needle in str(err.value), str(err.value)


def test_a_pattern_is_not_a_string_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="expected a regular expression"):
        check_pattern(["a"])


_ATOMS = st.sampled_from(["a", "b", ".", r"\w", r"\s", "[ab]", "(?:a|b)", "(a)", "x"])
_QUANT = st.sampled_from(["", "", "*", "+", "?", "{0,8}", "{2}"])
_PIECES = st.lists(st.tuples(_ATOMS, _QUANT), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(pieces=_PIECES, nest=st.sampled_from(["", "*", "+", "{0,4}"]))
def test_an_accepted_pattern_runs_fast_on_hostile_text(
    pieces: list[tuple[str, str]], nest: str
) -> None:
    body = "".join(atom + quant for atom, quant in pieces)
    pattern = f"(?:{body}){nest}" if nest else body
    try:
        check_pattern(pattern)
    except InvalidArgument:
        return
    route = Route("chat", ROOM, engage="pattern", pattern=pattern)
    for hostile in ("a" * 5000, "ab" * 2500 + "!", " " * 5000 + "x"):
        started = time.perf_counter()
        engages(route, hostile, mentioned=False)
        # One unbounded repeat over 4 KiB is O(n^2) at worst: ~0.2 s here, never minutes.
        assert time.perf_counter() - started < 2.0, pattern


def test_engage_rules() -> None:
    assert engages(_route(), "anything", mentioned=False)
    assert engages(_route(engage="mention"), "hi", mentioned=True)
    assert not engages(_route(engage="mention"), "@bot hi", mentioned=False)
    deploy = _route(engage="pattern", pattern=r"\bdeploy\b")
    assert engages(deploy, "please DEPLOY now", mentioned=False)  # case-insensitive
    assert not engages(deploy, "redeployment", mentioned=False)
    # Only the first 4096 characters are searched.
    assert not engages(deploy, "x" * 4096 + " deploy", mentioned=False)
    assert engages(deploy, "x" * 4000 + " deploy", mentioned=False)


def test_session_keys() -> None:
    sender = "chat:@alice:example.org"
    assert session_key(_route(), sender, ROOM, "$t") == sender
    assert session_key(_route(sessions="per_room"), sender, ROOM, "") == ROOM
    assert session_key(_route(sessions="per_room"), sender, ROOM, "$t") == ROOM + "/$t"
    assert session_key(_route(sessions="shared"), sender, ROOM, "$t") == "*"
    assert {"per_sender", "per_room", "shared"} == set(SESSIONS)
    assert set(ENGAGE) == {"always", "mention", "pattern"}


# -- permissions ------------------------------------------------------------------------------


def test_permissions_round_trip_canonically() -> None:
    raw = {"allow": ["chat:@bob:x.org", "user:alice", "chat:@bob:x.org", "group:ops"],
           "unknown": "hold", "approvers": {"wiring": "netops", "mcp": "sec"}}  # fmt: skip
    perms = permissions_from_mapping(raw, kinds=("wiring", "mcp"))
    assert perms.allow == ("chat:@bob:x.org", "group:ops", "user:alice")  # sorted, once
    assert perms.approvers == (("mcp", "sec"), ("wiring", "netops"))
    assert permissions_from_mapping(permissions_to_mapping(perms)) == perms
    assert permissions_from_mapping({}) == Permissions()


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"allow": "chat:@a:x"}, "permissions.allow: expected a list of at most 256"),
        ({"allow": [f"chat:@u{i}:x" for i in range(257)]}, "expected a list of at most 256"),
        ({"allow": ["@alice:x.org"]}, "permissions.allow: expected user:<name>, group:<name>"),
        ({"allow": ["user:Alice"]}, "permissions.allow: expected user:<name>"),
        ({"allow": ["group:"]}, "permissions.allow: expected user:<name>"),
        ({"allow": ["chat:"]}, "permissions.allow: expected"),
        ({"allow": ["chat:@a b:x"]}, "permissions.allow: expected"),
        ({"allow": ["Chat:@a:x"]}, "permissions.allow: expected"),
        ({"allow": [7]}, "permissions.allow: expected"),
        ({"unknown": "allow"}, "permissions.unknown: expected one of drop, hold, got 'allow'"),
        ({"approvers": ["wiring"]}, "permissions.approvers: expected an object"),
        ({"approvers": {"wiring": "Net Ops"}}, "permissions.approvers.wiring: expected a host "),
        ({"approvers": {"wiring": 5}}, "permissions.approvers.wiring: expected a host group"),
        ({"approvers": {"approve": "ops"}}, "permissions.approvers: unknown change kind 'appro"),
        ({"deny": []}, "permissions: unexpected key(s) deny (expected: allow, approvers, unkn"),
    ],
)
def test_every_bad_permissions_field_is_named(raw: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        permissions_from_mapping(raw, kinds=("wiring", "persona"))
    assert needle in str(err.value), str(err.value)


def test_admission_and_host_users_and_approvers() -> None:
    perms = Permissions(allow=("chat:@alice:x.org",), unknown="hold",
                        approvers=(("wiring", "netops"),))  # fmt: skip
    assert admission(perms, "chat:@alice:x.org") == "allow"
    assert admission(perms, "other:@alice:x.org") == "hold"  # namespaced: no collision
    assert admission(Permissions(), "chat:@alice:x.org") == "drop"
    # No host user or group named: any admin member may `ironctl send` (today's behaviour).
    assert host_user_allowed(perms, "mallory", ["users"])
    named = Permissions(allow=("chat:@a:x", "user:alice", "group:ops"))
    assert host_user_allowed(named, "alice", [])
    assert host_user_allowed(named, "bob", ["users", "ops"])
    assert not host_user_allowed(named, "bob", ["users"])
    assert approver_group(perms, "wiring") == "netops"
    assert approver_group(perms, "persona") is None


@given(identity=st.text(min_size=1, max_size=300))
def test_any_accepted_identity_is_namespaced_and_printable(identity: str) -> None:
    refusal = ""
    try:
        perms = permissions_from_mapping({"allow": [identity]})
    except InvalidArgument as err:
        refusal = str(err)
    if refusal:
        assert refusal.startswith("permissions.allow: expected")
        return
    (kept,) = perms.allow
    prefix, sep, rest = kept.partition(":")
    assert sep
    assert re.fullmatch(r"[a-z][a-z0-9-]{0,31}", prefix)
    assert rest
    assert kept.isprintable()
    assert " " not in kept
    assert kept.isascii()
