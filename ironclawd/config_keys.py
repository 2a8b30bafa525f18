"""How configuration values are checked: converters that return the value or raise ValueError
with the words that follow "expected" in the error (``ironclawd/config.py`` says which key uses
which)."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from ironclawd import paths
from ironclawd.domain.addresses import parse_internal_cidr
from ironclawd.domain.egress import EgressRule, rule_from_mapping
from ironclawd.domain.tools import CATALOG
from ironclawd.errors import ConfigError


@dataclass(frozen=True)
class _Key:
    """How one key is checked: a converter that raises ValueError with 'expected ...'."""

    convert: Callable[[Any], Any]
    doc: str


def _int(lo: int, hi: int) -> Callable[[Any], int]:
    def convert(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"an integer from {lo} to {hi}")
        return v

    return convert


def _float(lo: float, hi: float) -> Callable[[Any], float]:
    def convert(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise ValueError(f"a number from {lo:g} to {hi:g}")
        return float(v)

    return convert


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(v: Any) -> str:
        if v not in options:
            raise ValueError("one of " + ", ".join(repr(o) for o in options))
        return str(v)

    return convert


def _abs_path(v: Any) -> Path:
    if not isinstance(v, str) or not v.startswith("/") or "\0" in v or "/../" in v + "/":
        raise ValueError("an absolute path without '..'")
    return Path(v)


# A Unix socket address holds 108 bytes, the last a NUL.
MAX_SOCKET_PATH = 107
_INTERNAL = f"{paths.INTERNAL_DIR.name}/{paths.INTERNAL_ADMIN_SOCKET.name}"


def _socket_path(v: Any) -> Path:
    """``admin.socket``: the daemon also binds ``internal/admin-grpc.sock`` beside it."""
    expected = (f"an absolute path without '..' of at most {MAX_SOCKET_PATH} bytes, as is its "
                f"directory's {_INTERNAL} (Unix socket addresses)")  # fmt: skip
    try:
        path = _abs_path(v)
    except ValueError:
        raise ValueError(expected) from None
    internal = path.parent / _INTERNAL
    if max(len(str(path).encode()), len(str(internal).encode())) > MAX_SOCKET_PATH:
        raise ValueError(f"{expected}; {internal} takes {len(str(internal).encode())}")
    return path


def normal_path(path: str | Path) -> str:
    """A path as the kernel resolves its spelling: '.' and repeated '/' folded (the config's
    paths hold no '..'), for comparing one with another."""
    return "/" + os.path.normpath(str(path)).lstrip("/")


def real_dir(path: str | Path) -> str:
    """A directory as the kernel reaches it: the symlinks of its existing parts followed
    (/var/run is /run on Debian), then ``normal_path``. A path checked only as spelled was
    passed by another spelling of the same place."""
    return normal_path(os.path.realpath(path))


def real_path(path: str | Path) -> str:
    """A file's path with its directory as the kernel reaches it (``real_dir``); the last part
    is not followed, as bind(), lstat() and unlink() do not follow it."""
    spelled = normal_path(path)
    return normal_path(os.path.join(real_dir(os.path.dirname(spelled)),
                                    os.path.basename(spelled)))  # fmt: skip


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


# The daemon's own directories that stay closed to other users whatever the config says
# (root-only, or 0711 to be passed through): the admin socket's directory, made 0755, may be
# none of them, nor lie in one (a socket in /run/ironclaw/internal opened the directory of the
# sandboxes' gRPC socket; the credentials stay in /etc/ironclaw/credentials when the master key
# moves).
_CLOSED_DIRS = tuple(
    (str(d), "a directory the daemon keeps closed")
    for d in (paths.INTERNAL_DIR, paths.SESSIONS_RUN_DIR, paths.KEYS_RUN_DIR, paths.INGEST_DIR,
              paths.MOUNTNS_DIR, paths.CACHE_DIR, paths.CREDENTIALS_DIR)
)  # fmt: skip


def check_paths(state_dir: Path, master_key_file: Path, admin_socket: Path, source: str) -> None:
    """The paths of [daemon] and [admin] against each other: the master key is kept apart from
    what it encrypts, and the admin socket's directory, made 0755 with an ``internal/``
    directory in it (api/server.py), is none that must stay closed."""
    if normal_path(state_dir) == "/":
        _refuse(source, "daemon.state_dir", "an absolute directory other than '/'", state_dir)
    state, key = real_dir(state_dir), real_path(master_key_file)
    if _within(key, state):
        _refuse(source, "daemon.master_key_file", f"a file outside state_dir ({state}): the "
                "key is kept apart from the data it encrypts", master_key_file)  # fmt: skip
    here = real_dir(admin_socket.parent)
    why = "its directory is made 0755 and gets an internal/ directory"
    closed = ((state, "state_dir"), (os.path.dirname(key), "master_key_file's directory"),
              *((real_dir(d), name) for d, name in _CLOSED_DIRS))  # fmt: skip
    for directory, name in closed:
        # A key in '/' (every path lies there) is kept closed by its own mode: '/' is not
        # opened by a socket below it, only the socket's own directory is.
        if directory != "/" and _within(here, directory):
            _refuse(source, "admin.socket", f"a socket outside {name} ({directory}): {why} "
                    "(0755)", admin_socket)  # fmt: skip
    if here == "/":
        _refuse(source, "admin.socket", f"a socket in a directory other than '/': {why} (0755)",
                admin_socket)  # fmt: skip


def check_allowlist(allowlist: tuple[str, ...], master_key_file: Path, source: str) -> None:
    """No directory an agent may be granted holds, or lies in, the master key's directory
    (where the host credentials are kept too) when the config moved it out of /etc/ironclaw:
    the sandbox spec's check refuses the daemon's own places and ``state_dir`` whatever the
    allowlist says, but not a key moved elsewhere (found by a review: with the key in
    /srv/keys and /srv allowlisted, a mounts change could grant /srv/keys)."""
    keys = real_dir(master_key_file.parent)
    if _within(keys, real_dir(paths.CONFIG_DIR)):
        return
    for root in allowlist:
        if _within(keys, real_dir(root)) or _within(real_dir(root), keys):
            _refuse(source, "gateway.mount_allowlist", "directories apart from the master "
                    f"key's ({keys}): agents could be granted it", root)  # fmt: skip


def _refuse(source: str, key: str, expected: str, value: object) -> NoReturn:
    raise ConfigError(f"{source}: bad value for '{key}': expected {expected}, got {str(value)!r}")


def _group_name(v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > 32 or not v.replace("-", "").isalnum():
        raise ValueError("a group name (letters, digits, '-'; at most 32 characters)")
    return v


def _optional_path(v: Any) -> str:
    try:
        return "" if v == "" else str(_abs_path(v))
    except ValueError as exc:
        raise ValueError(f"'' (the system store) or {exc}") from None


def _or_empty(convert: Callable[[Any], str], empty: str) -> Callable[[Any], str]:
    """``convert``, or "" for a key whose documented default is "" (``empty`` says what that
    means): the reference shows ``credential = ""``, so writing it is no error."""

    def either(v: Any) -> str:
        if v == "":
            return ""
        try:
            return convert(v)
        except ValueError as exc:
            raise ValueError(f"'' ({empty}) or {exc}") from None

    return either


def _text(limit: int) -> Callable[[Any], str]:
    def convert(v: Any) -> str:
        if not isinstance(v, str) or len(v) > limit or "\0" in v:
            raise ValueError(f"a string of at most {limit} characters")
        return v

    return convert


def _url(v: Any) -> str:
    """A provider's base URL: where the agent's key goes, so never over plain http to another
    host, and nothing the first model call would fail on (no host, a bad port)."""
    expected = "an https:// URL with a host (http:// only for a loopback host)"
    if not isinstance(v, str) or not v.startswith(("https://", "http://")):
        raise ValueError(expected)
    if any(c.isspace() or not c.isprintable() for c in v):
        raise ValueError(f"{expected}, without spaces or control characters")
    parts = urlsplit(v)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if not parts.hostname:
        raise ValueError(expected)
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{expected}, without user or password (name a credential)")
    if "?" in v or "#" in v:
        raise ValueError(f"{expected}, without query or fragment")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{expected} and a port from 1 to 65535")
    if parts.scheme == "http" and not loopback(parts.hostname):
        raise ValueError(f"{expected}: over http:// the key would cross the network in clear")
    return v.rstrip("/")


def loopback(host: str) -> bool:
    """Whether a URL's host is this machine: the one place plain http may go."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _credential(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", v):
        raise ValueError("a credential name of [a-z0-9_.-] (a file in /etc/ironclaw/credentials)")
    return v


def _agent_names(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(
        isinstance(a, str) and re.fullmatch(r"[a-z][a-z0-9-]{0,62}", a) for a in v
    ):
        raise ValueError("a list of agent names ([a-z][a-z0-9-]*)")
    return tuple(dict.fromkeys(v))


def _kinds(v: Any) -> tuple[str, ...]:
    from ironclawd.domain.changes import KINDS  # noqa: PLC0415

    if not isinstance(v, list) or not all(isinstance(k, str) and k in KINDS for k in v):
        raise ValueError("a list of change kinds from: " + ", ".join(KINDS))
    return tuple(v)


def _cidrs(v: Any) -> tuple[Any, ...]:
    try:
        if not isinstance(v, list) or not all(isinstance(c, str) for c in v):
            raise ValueError  # noqa: TRY301
        return tuple(parse_internal_cidr(c) for c in v)
    except ValueError as exc:
        detail = f" ({exc})" if str(exc) else ""
        raise ValueError(
            "a list of CIDRs outside loopback, link-local, multicast and metadata" + detail
        ) from None


def _mount_allowlist(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or len(v) > 64:
        raise ValueError("a list of at most 64 absolute directory paths")
    out = []
    for item in v:
        path = str(_abs_path(item))
        if path == "/" or path != item.rstrip("/") or "//" in item:
            raise ValueError("absolute, normalised directory paths other than '/'")
        out.append(path)
    return tuple(dict.fromkeys(out))


def _tools(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(t, str) and t in CATALOG for t in v):
        raise ValueError("a list of tool names from: " + ", ".join(sorted(CATALOG)))
    return tuple(v)


def _egress_rules(v: Any) -> tuple[EgressRule, ...]:
    if not isinstance(v, list):
        raise ValueError(  # noqa: TRY004
            "a list of rule tables {host, scheme, port, methods, path_prefixes, ...}"
        )
    try:
        return tuple(rule_from_mapping(r) for r in v)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"a list of egress rules: {exc}") from None


def _convert(spec: _Key, value: Any, key: str, source: str) -> Any:
    """One value converted, or a ConfigError naming the key: a converter meeting a value of a
    type it did not foresee (TypeError, ...) is a bad value too, never a crash of start or
    reload."""
    try:
        return spec.convert(value)
    except ValueError as exc:
        expected = str(exc)
    except (TypeError, KeyError, AttributeError, OverflowError):
        expected = _expected(spec)
    raise ConfigError(
        f"{source}: bad value for '{key}': expected {expected}, got {_clip(value)}"
    ) from None


def _clip(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _expected(spec: _Key) -> str:
    try:
        spec.convert(object())
    except ValueError as exc:
        return str(exc)
    except (TypeError, KeyError, AttributeError, OverflowError):
        return "a value of the type in docs/config.md"
    return "any"


# The [mcp] table (domain/mcp.py McpLimits; docs/mcp.md "Time-outs, caps and back-off").
MCP_KEYS: dict[str, _Key] = {
    "connect_timeout_seconds": _Key(
        _float(1.0, 600.0), "Starting a server's unit and the SDK's initialize, together."
    ),
    "list_timeout_seconds": _Key(_float(0.5, 600.0), "One tools/list."),
    "call_timeout_seconds": _Key(
        _float(0.5, 3600.0), "One tool call; past it the server is stopped and restarted."
    ),
    "max_output_bytes": _Key(
        _int(1024, 64 * 1024 * 1024), "A tool's text is cut (and marked truncated) here."
    ),
    "max_message_bytes": _Key(
        _int(64 * 1024, 256 * 1024 * 1024),
        "Longest message a server may send; a longer one stops the server (restarted later).",
    ),
    "backoff_initial_seconds": _Key(
        _float(0.1, 3600.0), "Restart hold-off after a first failure; doubles each time."
    ),
    "backoff_max_seconds": _Key(_float(0.1, 86400.0), "Longest restart hold-off."),
    "memory_max_bytes": _Key(_int(16 * 1024 * 1024, 64 * 1024**3), "Each server unit's memory."),
    "tasks_max": _Key(_int(4, 65536), "Each server unit's tasks (processes and threads)."),
    "cpu_quota_percent": _Key(_int(1, 100 * 1024), "Each server unit's CPU (100 = one core)."),
    "calls_per_minute": _Key(
        _int(1, 1_000_000),
        "Each session's MCP calls in a sliding minute; more are refused. A call refused by a "
        "later check (grant, arguments, pin, stops_per_session) counts; one refused for this "
        "rate does not, so a session calling faster still gets this many a minute.",
    ),
    "stops_per_session": _Key(
        _int(1, 1000),
        "A session that this many stops of its agent's servers count against within "
        "stops_window_seconds is refused MCP calls until the oldest is that old. A stop counts "
        "against the session whose call caused it where that is known (it timed out while the "
        "server answered a ping, or its answer went over max_message_bytes with its id read), "
        "else against each session with a call in flight.",
    ),
    "stops_window_seconds": _Key(_float(1.0, 86400.0), "The window of stops_per_session."),
}
