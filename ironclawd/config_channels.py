"""The ``[[channels]]`` array of tables: the Matrix logins and webhook listeners the daemon
runs (docs/channels.md). Credentials are named here, never read: a channel reads its own when
it needs them, so a rotated token is picked up without a restart."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from ironclawd import lazy_re, paths
from ironclawd.config_keys import (
    _choice,
    _convert,
    _credential,
    _expected,
    _float,
    _int,
    _Key,
    loopback,
    real_dir,
    real_path,
)
from ironclawd.domain.channels import (
    CHANNEL_NAME_RE,
    RESERVED_CHANNEL_NAMES,
    ChannelConfig,
    WebhookEndpoint,
)
from ironclawd.domain.messages import MAX_MESSAGE_BYTES
from ironclawd.errors import ConfigError

KINDS = ("matrix", "webhook")
ENDPOINT_NAME_RE = lazy_re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MATRIX_USER_RE = lazy_re.compile(r"@[a-z0-9._=/+-]{1,255}:[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?")
MAX_ENDPOINTS = 64


def _channel_name(v: Any) -> str:
    if not isinstance(v, str) or not CHANNEL_NAME_RE.fullmatch(v):
        raise ValueError("a channel name of [a-z][a-z0-9-], at most 32 characters")
    if v in RESERVED_CHANNEL_NAMES:
        # Permissions name host users and groups as user:<name> and group:<name>.
        raise ValueError("a channel name other than 'user' or 'group' (they name host identities)")
    return v


def _homeserver(v: Any) -> str:
    expected = "a homeserver base URL like https://matrix.example.org"
    if not isinstance(v, str) or "?" in v or "#" in v:
        raise ValueError(expected)
    if any(c.isspace() or not c.isprintable() for c in v):
        raise ValueError(f"{expected}, without spaces or control characters")
    parts = urlsplit(v)
    if not parts.hostname or parts.path not in ("", "/"):
        raise ValueError(expected)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{expected} (a port from 1 to 65535)")
    if parts.scheme == "http" and not loopback(parts.hostname):
        raise ValueError("an https:// URL (http:// only for a loopback homeserver)")
    if parts.scheme not in ("https", "http") or parts.username or parts.password:
        raise ValueError("an https:// URL without user or password")
    return str(v).rstrip("/")


def _user_id(v: Any) -> str:
    if not isinstance(v, str) or not MATRIX_USER_RE.fullmatch(v):
        raise ValueError("a Matrix user id like @bot:example.org")
    return v


def _device_id(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", v):
        raise ValueError("a device id of [A-Za-z0-9_-], at most 64 characters")
    return v


def _listen(v: Any) -> str:
    """``host:port`` (an IP literal, IPv6 in brackets) or ``unix:/absolute/path``."""
    expected = "'127.0.0.1:8787', '[::1]:8787' or 'unix:/run/ironclaw/hooks.sock'"
    if not isinstance(v, str):
        raise ValueError(expected)  # noqa: TRY004
    if v.startswith("unix:"):
        path = v[5:]
        if not path.startswith("/") or "\0" in path or "/../" in path + "/" or len(path) > 100:
            raise ValueError(f"{expected} (a unix socket path: absolute, no '..', < 100 chars)")
        return v
    match = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:([0-9]{1,5})|([^:\[\]]+):([0-9]{1,5})", v)
    if match is None:
        raise ValueError(expected)
    host, port = (match[1], match[2]) if match[1] else (match[3], match[4])
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{expected} (an IP address, not a host name)") from None
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"{expected} (a port from 1 to 65535)")
    return v


def _endpoints(v: Any) -> tuple[WebhookEndpoint, ...]:
    expected = f"a list of 1-{MAX_ENDPOINTS} tables {{name, secret_credential}} with unique names"
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_ENDPOINTS:
        raise ValueError(expected)
    out: list[WebhookEndpoint] = []
    for item in v:
        if not isinstance(item, dict) or set(item) != {"name", "secret_credential"}:
            raise ValueError(expected)
        name = item["name"]
        if not isinstance(name, str) or not ENDPOINT_NAME_RE.fullmatch(name):
            raise ValueError(f"{expected} (an endpoint name is [a-z0-9][a-z0-9_-], <= 64)")
        if any(e.name == name for e in out):
            raise ValueError(f"{expected} (endpoint {name!r} twice)")
        credential = _credential(item["secret_credential"])
        if any(e.secret_credential == credential for e in out):
            raise ValueError(f"{expected} (credential {credential!r} twice: {_ONE_KEY_EACH})")
        out.append(WebhookEndpoint(name, credential))
    return tuple(out)


# A signature covers the timestamp and the body, not the endpoint: a request signed for one
# endpoint would be taken by another with the same key (and its sender taken for the other's).
_ONE_KEY_EACH = "each endpoint needs a key of its own"


COMMON_KEYS: Mapping[str, _Key] = {
    "name": _Key(_channel_name, "Channel name: identities on it read '<name>:<sender>'."),
    "type": _Key(_choice(KINDS), "What it speaks."),
    "max_message_bytes": _Key(
        _int(1, MAX_MESSAGE_BYTES), "Longer inbound messages are refused before the queue."
    ),
    "sender_messages_per_minute": _Key(_int(1, 100_000), "Inbound messages per sender."),
    "channel_messages_per_minute": _Key(_int(1, 1_000_000), "Inbound messages, all senders."),
}
MATRIX_KEYS: Mapping[str, _Key] = {
    "homeserver": _Key(_homeserver, "Matrix: homeserver base URL (https; http only loopback)."),
    "user_id": _Key(_user_id, "Matrix: the bot's user id."),
    "token_credential": _Key(_credential, "Matrix: credential holding the bot's access token."),
    "device_id": _Key(_device_id, "Matrix: the bot's device id."),
}
WEBHOOK_KEYS: Mapping[str, _Key] = {
    "listen": _Key(
        _listen,
        "Webhook: where to listen (IP:port, or unix:/path for a proxy); an address no other "
        "channel's takes (::ffff:a.b.c.d is a.b.c.d; 0.0.0.0 takes its port's IPv4 addresses, "
        "[::] all), a path outside the daemon's directories and not `admin.socket`.",
    ),
    "endpoints": _Key(
        _endpoints, "Webhook: endpoints (POST /hooks/<name>), each with its HMAC key credential."
    ),
    "replay_window_seconds": _Key(
        _float(1.0, 3600.0), "Webhook: signatures older (or newer) than this are stale."
    ),
}
KEYS: Mapping[str, Mapping[str, _Key]] = {"matrix": MATRIX_KEYS, "webhook": WEBHOOK_KEYS}
REQUIRED = {"matrix": ("homeserver", "user_id", "token_credential"), "webhook": ("listen",
            "endpoints")}  # fmt: skip


def parse_channels(body: Any, source: str) -> tuple[ChannelConfig, ...]:
    """``[[channels]]`` tables, each checked against the keys of its type; names unique."""
    if not isinstance(body, list) or not all(isinstance(t, dict) for t in body):
        raise ConfigError(f"{source}: 'channels' must be an array of tables, like [[channels]]")
    channels: list[ChannelConfig] = []
    for index, table in enumerate(body):
        where = f"channels[{index}]"
        for key in ("type", "name"):
            if key not in table:
                raise ConfigError(f"{source}: missing key '{where}.{key}': expected "
                                  f"{_expected(COMMON_KEYS[key])}")  # fmt: skip
        kind = _convert(COMMON_KEYS["type"], table.get("type"), f"{where}.type", source)
        name = _convert(COMMON_KEYS["name"], table.get("name"), f"{where}.name", source)
        where = f"channels.{name}"
        if any(c.name == name for c in channels):
            raise ConfigError(f"{source}: channel name '{name}' is used twice")
        keys = {**COMMON_KEYS, **KEYS[kind]}
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key not in keys:
                other = next((k for k in KINDS if key in KEYS[k]), "")
                why = f" (a key of {other} channels)" if other else ""
                raise ConfigError(
                    f"{source}: unknown key '{where}.{key}' for a {kind} channel{why} (expected "
                    f"one of: {', '.join(sorted(keys))})"
                )
            values[key] = _convert(keys[key], value, f"{where}.{key}", source)
        missing = [k for k in REQUIRED[kind] if k not in values]
        if missing:
            raise ConfigError(f"{source}: {where}: a {kind} channel needs {', '.join(missing)}")
        config = ChannelConfig(**values)
        for endpoint in config.endpoints:
            shared = next((c.name for c in channels for e in c.endpoints
                           if e.secret_credential == endpoint.secret_credential), None)  # fmt: skip
            if shared is not None:
                raise ConfigError(
                    f"{source}: {where}.endpoints: credential {endpoint.secret_credential!r} is "
                    f"also an endpoint's key on channel '{shared}': {_ONE_KEY_EACH}"
                )
        channels.append(config)
    return tuple(channels)


_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
_Address = str | tuple[_IP, int]  # unix path, or IP (as bound) and port


def check_listens(
    channels: tuple[ChannelConfig, ...], admin_socket: Path, state_dir: Path, source: str
) -> None:
    """Each webhook listens where nothing else does: a listener replaces the socket at its path
    when it starts (host/webhook.py), after the admin API's, so one at ``admin.socket`` took
    that socket's place; one at another channel's address took its socket, or failed to bind."""
    admin = real_path(admin_socket)  # spelled otherwise (/var/run for /run), the same socket
    own = (admin_socket.parent / paths.INTERNAL_DIR.name, paths.INTERNAL_DIR,
           paths.SESSIONS_RUN_DIR, paths.KEYS_RUN_DIR, paths.INGEST_DIR, paths.MOUNTNS_DIR,
           state_dir)  # fmt: skip
    seen: list[tuple[str, str, _Address]] = []  # channel, its listen, where it binds
    for channel in channels:
        if channel.type != "webhook":
            continue
        key, listen = f"channels.{channel.name}.listen", channel.listen
        if listen.startswith("unix:"):
            path = real_path(listen[5:])
            address: _Address = path
            if path == admin:
                _refuse(source, key, "a socket path other than the admin socket (admin.socket, "
                        f"{admin}: the listener would take its place)", listen)  # fmt: skip
            inside = next((d for d in map(real_dir, own) if path.startswith(d + "/")), "")
            if inside:
                _refuse(source, key, f"a socket path outside {inside} (the daemon's own)", listen)
        else:
            host, _, port = listen.rpartition(":")
            address = (_bound_as(ipaddress.ip_address(host.strip("[]"))), int(port))
        other = next(((name, value) for name, value, a in seen if _clash(a, address)), None)
        if other is not None:
            _refuse(source, key, f"an address no other channel listens on (channel '{other[0]}' "
                    f"listens on {other[1]!r}: the two cannot both bind)", listen)  # fmt: skip
        seen.append((channel.name, listen, address))


def _bound_as(ip: _IP) -> _IP:
    """The address a socket bound to ``ip`` holds: an IPv4-mapped IPv6 address (::ffff:a.b.c.d)
    is bound as the IPv4 address, by an IPv6 socket that is not v6-only (host/webhook.py
    leaves IPV6_V6ONLY as the system has it, off by default), and clashes as that address."""
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip if mapped is None else mapped


def _clash(a: _Address, b: _Address) -> bool:
    """Whether binding ``b`` fails once ``a`` listens (Linux, SO_REUSEADDR as the listener sets
    it): the same address and port; or the same port and one of them a wildcard taking the
    other's address: 0.0.0.0 takes every IPv4 address, a dual-stack [::] every address."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    (one, port), (two, other_port) = a, b
    if port != other_port:
        return False
    if one == two or ipaddress.IPv6Address("::") in (one, two):
        return True
    return one.version == two.version == 4 and ipaddress.IPv4Address("0.0.0.0") in (one, two)


def _refuse(source: str, key: str, expected: str, value: str) -> NoReturn:
    raise ConfigError(f"{source}: bad value for '{key}': expected {expected}, got {value!r}")


def channel_reference() -> list[str]:
    """Rows of the config reference (docs/config.md) for ``[[channels]]``."""
    example = ChannelConfig("example", "webhook")
    rows = []
    for keys in (COMMON_KEYS, MATRIX_KEYS, WEBHOOK_KEYS):
        for key, spec in keys.items():
            default = "(required)" if key in ("name", "type") else repr(getattr(example, key))
            rows.append(
                f"| `channels[].{key}` | `{default:.40}` | {_expected(spec)} | {spec.doc} |"
            )
    return rows
