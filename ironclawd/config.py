"""Daemon configuration: ``/etc/ironclaw/ironclawd.toml`` over defaults held in code.

Every key is declared here with its type and bounds. An unknown table or key, a wrong type or an
out-of-range value is a :class:`ConfigError` that names the key and what was expected; the daemon
exits before binding anything. The reference is generated from these declarations
(``ironclawd --print-config-reference``) into docs/config.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli

from ironclawd import paths
from ironclawd.config_channels import channel_reference, check_listens, parse_channels
from ironclawd.config_keys import (
    MCP_KEYS,
    _abs_path,
    _agent_names,
    _choice,
    _cidrs,
    _convert,
    _credential,
    _egress_rules,
    _expected,
    _float,
    _group_name,
    _int,
    _Key,
    _kinds,
    _mount_allowlist,
    _optional_path,
    _or_empty,
    _socket_path,
    _text,
    _tools,
    _url,
    check_allowlist,
    check_paths,
)
from ironclawd.domain.agents import AgentSpec
from ironclawd.domain.channels import ChannelConfig
from ironclawd.domain.egress import EgressLimits
from ironclawd.domain.mcp import McpLimits
from ironclawd.domain.messages import QueueLimits
from ironclawd.domain.pool import PoolConfig
from ironclawd.domain.providers import PROVIDERS
from ironclawd.errors import ConfigError

LOG_LEVELS = ("debug", "info", "warning", "error")
PLATFORMS = ("auto", "systrap", "ptrace", "kvm")


@dataclass(frozen=True)
class DaemonConfig:
    log_level: str = "info"
    state_dir: Path = paths.STATE_DIR
    master_key_file: Path = paths.MASTER_KEY_FILE
    agent_log_lines: int = 10
    agent_log_window_seconds: float = 60.0
    min_free_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True)
class AdminConfig:
    socket: Path = paths.ADMIN_SOCKET
    group: str = paths.ADMIN_GROUP
    max_message_bytes: int = 4 * 1024 * 1024
    max_deadline_seconds: float = 300.0
    max_concurrent_streams: int = 32
    max_connections: int = 64


@dataclass(frozen=True)
class SandboxConfig:
    runsc: Path = paths.RUNSC
    platform: str = "auto"
    idle_timeout_seconds: int = 900
    start_timeout_seconds: float = 30.0
    agent_dir: Path = paths.AGENT_DIR
    rootfs_template: Path = paths.ROOTFS_TEMPLATE


@dataclass(frozen=True)
class SocketsConfig:
    """Limits on each session's sockets (api/limits.py); every limit is per session."""

    max_connections: int = 8
    max_control_connections: int = 4
    max_streams_per_connection: int = 8
    max_message_bytes: int = 4 * 1024 * 1024
    connections_per_second: float = 20.0
    calls_per_second: float = 50.0
    # Each session's share of the event loop (api/limits.py Share): seconds of the loop thread's
    # CPU a second its calls may take, and how much of it may be saved up. A box looping on
    # 4 MiB requests held the loop for most of every second (found by a review), where an
    # ordinary model call takes well under a millisecond of it.
    loop_share: float = 0.1
    loop_share_burst_seconds: float = 0.25
    handshake_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 300.0
    keepalive_seconds: float = 60.0
    max_call_seconds: float = 600.0


@dataclass(frozen=True)
class GatewayConfig:
    expiry_hours: float = 168.0
    four_eyes: tuple[str, ...] = ()
    submissions_per_hour: int = 20
    mount_allowlist: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = DaemonConfig()
    admin: AdminConfig = AdminConfig()
    sandbox: SandboxConfig = SandboxConfig()
    egress: EgressLimits = EgressLimits()  # noqa: RUF009
    gateway: GatewayConfig = GatewayConfig()
    queues: QueueLimits = QueueLimits()  # noqa: RUF009
    sockets: SocketsConfig = SocketsConfig()
    mcp: McpLimits = McpLimits()  # noqa: RUF009
    pool: PoolConfig = PoolConfig()  # noqa: RUF009
    agents: tuple[AgentSpec, ...] = ()
    channels: tuple[ChannelConfig, ...] = ()
    source: str = "(defaults)"


SCHEMA: Mapping[str, tuple[type, Mapping[str, _Key]]] = {
    "gateway": (
        GatewayConfig,
        {
            "expiry_hours": _Key(
                _float(1 / 3600, 24 * 365.0), "A pending change expires after this (hours)."
            ),
            "four_eyes": _Key(
                _kinds,
                "Kinds whose approver must differ from the submitter (no kind can skip "
                "the human decision itself), and, for a change a session submitted, from every "
                "host user who had sent that session messages. A change counts as every kind "
                "whose grants it changes: a skill bringing tools, egress rules or MCP tools is "
                "a tools, egress or mcp change too.",
            ),
            "submissions_per_hour": _Key(
                _int(1, 10_000),
                "Change submissions per submitter and hour; a session's attempts count, refused "
                "ones too.",
            ),
            "mount_allowlist": _Key(
                _mount_allowlist,
                "Host directories below which a `mounts` change may grant an agent a directory "
                "(empty: none can ever be granted).",
            ),
        },
    ),
    "daemon": (
        DaemonConfig,
        {
            "log_level": _Key(_choice(LOG_LEVELS), "Lowest level sent to the journal."),
            "state_dir": _Key(
                _abs_path,
                "State DB, wrapped keys, queues, bundles, mount frames, agent rootfs, audit log.",
            ),
            "master_key_file": _Key(
                _abs_path,
                "Master key (0600 root, made on first start) when no systemd credential "
                "'master.key' is passed; kept apart from the data it protects (outside "
                "`state_dir`).",
            ),
            "agent_log_lines": _Key(
                _int(1, 100_000),
                "Journal lines of each kind a session can cause per window (refusals, bad "
                "requests); the rest are counted in one 'suppressed' line. Live on reload.",
            ),
            "agent_log_window_seconds": _Key(_float(1.0, 3600.0), "That window. Live on reload."),
            "min_free_bytes": _Key(
                _int(0, 2**50),
                "New sessions and messages are refused (RESOURCE_EXHAUSTED, naming this key) "
                "while the filesystem of `state_dir` has less free space than this, so what was "
                "accepted can still be answered, ingested and audited; 0 turns the check off.",
            ),
        },
    ),
    "admin": (
        AdminConfig,
        {
            "socket": _Key(
                _socket_path,
                "Admin gRPC socket (0660, group `admin.group`), in a directory of its own: it "
                "is made 0755 and gets an `internal/` directory.",
            ),
            "group": _Key(_group_name, "Group whose members may use the admin socket."),
            "max_message_bytes": _Key(_int(1024, 64 * 1024 * 1024), "Largest gRPC message."),
            "max_deadline_seconds": _Key(
                _float(0.1, 3600.0), "Longest deadline a call may run; longer ones are cut."
            ),
            "max_concurrent_streams": _Key(_int(1, 1024), "HTTP/2 streams per connection."),
            "max_connections": _Key(
                _int(1, 4096),
                "Admin connections open at once (a user other than root holds at most a quarter; "
                "an eighth is kept for root).",
            ),
        },
    ),
    "sandbox": (
        SandboxConfig,
        {
            "runsc": _Key(_abs_path, "The runsc binary."),
            "platform": _Key(
                _choice(PLATFORMS), "gVisor platform; 'auto' picks systrap, else ptrace."
            ),
            "idle_timeout_seconds": _Key(
                _int(0, 7 * 24 * 3600), "Stop a session idle this long (0: never)."
            ),
            "start_timeout_seconds": _Key(
                _float(1.0, 600.0), "How long a sandbox may take to start and say hello."
            ),
            "agent_dir": _Key(_abs_path, "The frozen in-box agent (packaging/build-agent)."),
            "rootfs_template": _Key(_abs_path, "Files of the agent rootfs besides the agent."),
        },
    ),
    "sockets": (
        SocketsConfig,
        {
            "max_connections": _Key(
                _int(1, 1024),
                "Connections open on one session socket; a new one drops the least recently "
                "used (idle ones first).",
            ),
            "max_control_connections": _Key(
                _int(1, 64), "Connections open on control.sock; one waiting for hello goes first."
            ),
            "max_streams_per_connection": _Key(_int(1, 1024), "Calls in flight per connection."),
            "max_message_bytes": _Key(_int(1024, 64 * 1024 * 1024), "Largest gRPC message."),
            "connections_per_second": _Key(_float(0.1, 10_000.0), "New connections per socket."),
            "calls_per_second": _Key(_float(0.1, 100_000.0), "Calls per session, all sockets."),
            "loop_share": _Key(
                _float(0.001, 1.0),
                "Seconds of the daemon's event loop a second one session's calls may take on "
                "average; past it its calls are refused with a retry-after (1.0: no bound).",
            ),
            "loop_share_burst_seconds": _Key(
                _float(0.0, 60.0), "How much of loop_share a session may save up for a burst."
            ),
            "handshake_timeout_seconds": _Key(
                _float(0.1, 600.0), "Time to send the HTTP/2 preface (control.sock: hello)."
            ),
            "idle_timeout_seconds": _Key(
                _float(1.0, 86400.0), "A connection with no call for this long is closed."
            ),
            "keepalive_seconds": _Key(
                _float(1.0, 3600.0), "Ping interval; a peer that does not answer is dropped."
            ),
            "max_call_seconds": _Key(_float(1.0, 86400.0), "Longest a call may run."),
        },
    ),
    "egress": (
        EgressLimits,
        {
            "internal_cidrs": _Key(
                _cidrs, "Non-public ranges the egress broker may reach (default: none)."
            ),
            "ca_file": _Key(
                _optional_path, "PEM trust anchors for upstream TLS instead of the system store."
            ),
            "max_request_bytes": _Key(_int(0, 64 * 1024 * 1024), "Largest request body."),
            "max_response_bytes": _Key(
                _int(1024, 1024**3), "Response bodies are cut (and marked truncated) here."
            ),
            "timeout_seconds": _Key(_float(0.1, 3600.0), "Whole exchange, first byte to last."),
            "connect_timeout_seconds": _Key(_float(0.1, 600.0), "DNS, then TCP and TLS set-up."),
            "requests_per_minute": _Key(_int(1, 100_000), "Egress requests per session."),
            "max_connections_per_session": _Key(_int(1, 1024), "Requests in flight per session."),
            "max_connections_total": _Key(_int(1, 65536), "Requests in flight, all sessions."),
        },
    ),
    "mcp": (McpLimits, MCP_KEYS),
    "pool": (
        PoolConfig,
        {
            "size": _Key(
                _int(0, 64),
                "Pre-started sandboxes kept ready for each agent of `pool.agents` (0: no warm "
                "pool). A new session made without `--sid` claims one; it is sealed to that "
                "session (key, queues, sockets) and never reused. Live on reload.",
            ),
            "agents": _Key(_agent_names, "Agents that get a warm pool. Live on reload."),
            "min_available_bytes": _Key(
                _int(0, 2**50),
                "While MemAvailable is below this the pool does not refill and destroys its "
                "ready sandboxes (0: never). Live on reload.",
            ),
        },
    ),
    "queues": (
        QueueLimits,
        {
            "max_reply_bytes": _Key(
                _int(1024, 64 * 1024 * 1024),
                "Longest reply body; a longer one is ingested as a placeholder (audited).",
            ),
            "rows_per_read": _Key(_int(1, 100_000), "Outbound rows ingested per read."),
            "max_rows": _Key(
                _int(1, 2**40), "Replies per session; no more are ingested. Live on reload."
            ),
            "max_ingested_bytes": _Key(
                _int(1024 * 1024, 2**50),
                "What the state DB holds of one session's replies (bodies and rows, as stored); "
                "no more are ingested past it: they wait in the session's outbound queue. Live "
                "on reload.",
            ),
            "max_replies_per_message": _Key(
                _int(1, 1_000_000),
                "Replies ingested per message sent to a session (its agent writes one); no more "
                "are ingested past it. Live on reload.",
            ),
            "outbound_bytes": _Key(
                _int(1024 * 1024, 64 * 1024**3),
                "Size of each session's outbound tmpfs (RAM); the box gets ENOSPC past it.",
            ),
            "outbound_files": _Key(_int(4, 1_000_000), "Files and directories in it."),
            "read_timeout_seconds": _Key(
                _float(0.1, 3600.0), "One read of a session's outbound queue (its lane only)."
            ),
            "prune_after_rows": _Key(
                _int(0, 2**31),
                "Every this many ingested replies, the agent drops them from its outbound queue "
                "(0: never).",
            ),
        },
    ),
}


AGENT_KEYS: Mapping[str, _Key] = {
    "persona": _Key(_text(16000), "System prompt; the agent cannot change it."),
    "provider": _Key(_choice(tuple(PROVIDERS)), "Model provider."),
    "model": _Key(_text(200), "Model name at the provider."),
    "base_url": _Key(_or_empty(_url, "the provider's public API"), "Provider API base URL."),
    "credential": _Key(
        _or_empty(_credential, "none"), "Name of the host-held key to inject; never in the box."
    ),
    "tools": _Key(_tools, "Tools the agent may use."),
    "max_tool_rounds": _Key(_int(0, 64), "Tool rounds per turn."),
    "max_tokens": _Key(_int(1, 200_000), "Output tokens per model call."),
    "requests_per_minute": _Key(_int(1, 100_000), "Model requests per minute, whole agent."),
    "tokens_per_day": _Key(_int(1, 10**10), "Tokens per day, whole agent."),
    "session_requests_per_minute": _Key(
        _int(1, 100_000), "Model requests per minute, each session."
    ),
    "session_tokens_per_day": _Key(_int(1, 10**10), "Tokens per day, each session."),
    "memory_bytes": _Key(_int(64 * 1024 * 1024, 64 * 1024**3), "Sandbox memory limit."),
    "tasks_max": _Key(_int(16, 65536), "Sandbox tasks limit."),
    "cpu_percent": _Key(_int(1, 100 * 1024), "Sandbox CPU quota (100 = one core)."),
    "egress": _Key(_egress_rules, "Egress grants (until the gateway applies approved ones)."),
}


def _parse_agents(body: Any, source: str) -> tuple[AgentSpec, ...]:
    if not isinstance(body, dict):
        raise ConfigError(f"{source}: 'agents' must hold tables, like [agents.demo]")
    agents = []
    for name, table in body.items():
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", name) or not isinstance(table, dict):
            raise ConfigError(f"{source}: [agents.{name}]: expected a table named [a-z][a-z0-9-]*")
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key not in AGENT_KEYS:
                raise ConfigError(
                    f"{source}: unknown key 'agents.{name}.{key}'{_hint(key, AGENT_KEYS)}"
                )
            values[key] = _convert(AGENT_KEYS[key], value, f"agents.{name}.{key}", source)
        agents.append(AgentSpec(name=name, **values))
    return tuple(agents)


def parse_config(text: str, source: str) -> Config:
    """Parse and validate TOML text; raise ConfigError naming the first bad key."""
    if text.startswith("\ufeff"):
        raise ConfigError(f"{source}: not valid TOML: it starts with a byte-order mark (U+FEFF); "
                          "save it as UTF-8 without one")  # fmt: skip
    try:
        raw = tomli.loads(text)
    except tomli.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    sections: dict[str, Any] = {}
    for table, body in raw.items():
        if table == "agents":
            sections["agents"] = _parse_agents(body, source)
            continue
        if table == "channels":
            sections["channels"] = parse_channels(body, source)
            continue
        if table not in SCHEMA:
            known = {**SCHEMA, "agents": None, "channels": None}
            raise ConfigError(f"{source}: unknown table [{table}]{_hint(table, known)}")
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: '{table}' must be a table, like [{table}]")
        cls, keys = SCHEMA[table]
        values: dict[str, Any] = {}
        for key, value in body.items():
            if key not in keys:
                raise ConfigError(f"{source}: unknown key '{table}.{key}'{_hint(key, keys)}")
            values[key] = _convert(keys[key], value, f"{table}.{key}", source)
        sections[table] = cls(**values)
    config = dataclasses.replace(Config(**sections), source=source)
    daemon, admin = config.daemon, config.admin
    check_paths(daemon.state_dir, daemon.master_key_file, admin.socket, source)
    check_listens(config.channels, admin.socket, daemon.state_dir, source)
    check_allowlist(config.gateway.mount_allowlist, daemon.master_key_file, source)
    return config


def load_config(path: Path) -> Config:
    """Read the config file; a missing file means defaults, an unreadable one is an error, and
    so is one that anyone but its reader's user or root may write: it names what the daemon
    runs as root (``sandbox.runsc``), so its writer owns the host (found by a review)."""
    try:
        # O_NONBLOCK: a FIFO there made open() wait for a writer (start, doctor); it is refused.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        with open(fd, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(f"{path}: not a regular file: expected the config file")
            if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
                raise ConfigError(
                    f"{path}: refusing a config file that others may write (owner uid "
                    f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}): it names what the "
                    "daemon runs as root; make it root's, mode 0644 or 0640"
                )
            text = file.read().decode("utf-8")
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    return parse_config(text, str(path))


def reference_markdown() -> str:
    """The config reference, generated from SCHEMA so the docs cannot drift."""
    lines = ["| key | default | expected | meaning |", "|---|---|---|---|"]
    defaults = Config()
    for table, (_cls, keys) in SCHEMA.items():
        section = getattr(defaults, table)
        for key, spec in keys.items():
            expected = _expected(spec)
            default = getattr(section, key)
            lines.append(f"| `{table}.{key}` | `{default}` | {expected} | {spec.doc} |")
    agent = AgentSpec("example")
    for key, spec in AGENT_KEYS.items():
        default = getattr(agent, key)
        lines.append(
            f"| `agents.NAME.{key}` | `{default!r:.40}` | {_expected(spec)} | {spec.doc} |"
        )
    lines.extend(channel_reference())
    return "\n".join(lines) + "\n"


def _hint(name: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    options = ", ".join(sorted(known))
    return (
        f" (did you mean '{close[0]}'? expected one of: {options})"
        if close
        else (f" (expected one of: {options})")
    )
