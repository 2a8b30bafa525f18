"""Each registered stdio MCP server of each agent in its own hardened transient unit
(docs/mcp.md "Isolation"): the real ``McpLauncher``.

The daemon runs ``systemd-run --pipe --wait`` with the unit's properties and the server's argv;
systemd-run hands its stdin/stdout to the unit, so they are the MCP stdio transport. Why not
``StartTransientUnit`` with ``StandardInputFileDescriptor=`` over pystemd: systemd-run already
does exactly that (passing our pipe fds over D-Bus) and waits for the unit, and the properties
read in ``systemctl show`` form are what ``systemd-analyze security`` and the docs talk about;
pystemd's one-custom-property limit would need a second signature table for ~30 properties.

The transport (``bounded_stdio``) frames newline-delimited messages and hands every byte to the
SDK's own parser and serialiser (``mcp_types.jsonrpc_message_adapter``, ``model_dump_json``);
it exists instead of the SDK's ``stdio_client`` because that one buffers a line without bound
(a 50 MB answer would be held, copied and parsed in the daemon), and because stopping a server
here means stopping its unit, not signalling systemd-run.

Credentials (``--credential ENV=NAME``) never appear in an argv or in ``Environment=``: the
values go to a root-only (0600) file under /run/ironclaw/mcp-credentials that the unit names in
``EnvironmentFile=`` (systemd reads it as root when it starts the server; ``systemctl show``
shows the path only), and the file is deleted as soon as the server first writes. The value ends
in the server's environment, which root and the server's own dynamic user can read
(/proc/PID/environ). ``LoadCredential=`` would keep it out of the environment, but systemd 252
under the private systemd leaves the credentials directory unreadable to a ``DynamicUser=`` unit,
and the third-party servers read tokens from the environment anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ironclawd import lazy_re, paths
from ironclawd.domain.mcp import McpLimits, McpServer
from ironclawd.errors import McpServerFailed
from ironclawd.host.systemd import SystemdUnitManager
from ironclawd.ports import Credentials
from ironclawd.ports.mcp import McpTransport

if TYPE_CHECKING:
    from anyio.abc import Process
    from anyio.streams.memory import MemoryObjectSendStream
    from mcp.shared.message import SessionMessage

# anyio and the MCP SDK (~0.2-0.4 s of imports) are imported where a server is first spoken to,
# not when the daemon starts (issue 17).

log = logging.getLogger("ironclawd.mcp")

UNIT_PREFIX: Final = "ironclaw-mcp-"
CREDENTIALS_DIR: Final = paths.RUN_DIR / "mcp-credentials"
SYSTEMD_RUN: Final = "/usr/bin/systemd-run"
STDERR_TAIL: Final = 2048
# Lines on stdout that are not JSON-RPC messages a server may write over its life (a sloppy one
# prints a banner): each costs a parse and a task in the SDK, and a server writing them for ever
# held a daemon core while it counted as healthy (found by a review).
MAX_JUNK_LINES: Final = 16
# A credential value must read back as itself from an EnvironmentFile= line KEY='value'.
_PLAIN_VALUE = lazy_re.compile(r"[\x20-\x7e]{1,8192}")
# Where a server must never look, even if a permission slips (ProtectSystem=strict already makes
# everything read-only and ProtectHome=yes hides /home, /root and /run/user).
HIDDEN: Final = paths.PRIVATE_DIRS
_ADDRESS_RE = lazy_re.compile(r"^nameserver\s+(\S+)", re.M)
# The start of an answer: {"jsonrpc": "2.0", "id": ID, "result" (or "error"), the first member
# optional and either of the first two (the order the Python SDK writes). Every member before the
# id is a plain string, so the id found is the object's own, never one inside the result.
_W = r"[ \t\r]*"
_VERSION = rf'(?:{_W}"jsonrpc"{_W}:{_W}"2\.0"{_W},)?'
_ANSWER_ID = lazy_re.compile(
    rf'{_W}\{{{_VERSION}{_W}"id"{_W}:{_W}(-?[0-9]{{1,20}}|"[^"\\]{{0,128}}"){_W},{_VERSION}'
    rf'{_W}"(?:result|error)"{_W}:'
)


def unit_name(agent: str, server: str) -> str:
    """``ironclaw-mcp-<agent>_<server>.service``: ``_`` is in neither name, so it is unique."""
    return f"{UNIT_PREFIX}{agent}_{server}.service"


def unit_properties(
    limits: McpLimits,
    addresses: Sequence[str],
    env_file: Path | None,
    hidden: Sequence[str] = (),
) -> list[str]:
    """The unit's settings in ``systemd-run -p`` form. ``addresses``: the IPs the server may
    reach (empty: no network at all); ``env_file``: the credentials' file, if any; ``hidden``:
    more directories to make inaccessible (the agents' mount sources)."""
    props = [
        "Type=exec", "DynamicUser=yes", "ProtectSystem=strict", "ProtectHome=yes",
        "PrivateTmp=yes", "PrivateDevices=yes", "PrivateIPC=yes", "PrivateMounts=yes",
        "PrivateUsers=yes", "NoNewPrivileges=yes", "CapabilityBoundingSet=", "AmbientCapabilities=",
        "RestrictNamespaces=yes", "LockPersonality=yes", "RestrictRealtime=yes",
        "RestrictSUIDSGID=yes", "ProtectClock=yes", "ProtectHostname=yes",
        "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes", "ProtectProc=invisible", "ProcSubset=pid",
        "DevicePolicy=closed", "KeyringMode=private", "SystemCallArchitectures=native",
        "SystemCallFilter=@system-service", "SystemCallFilter=~@privileged @resources",
        "SystemCallErrorNumber=EPERM", "MemoryDenyWriteExecute=yes", "UMask=0077",
        "RemoveIPC=yes", "LimitCORE=0", "LimitFSIZE=64M", "LimitNOFILE=256",
        f"MemoryMax={limits.memory_max_bytes}", "MemorySwapMax=0",
        f"TasksMax={limits.tasks_max}", f"CPUQuota={limits.cpu_quota_percent}%",
        "KillMode=control-group", "TimeoutStopSec=5s", "StandardError=journal",
        *(f"InaccessiblePaths=-{p}" for p in (*HIDDEN, *hidden)),
    ]  # fmt: skip
    if addresses:
        props += [
            "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
            "IPAddressDeny=any",
            "IPAddressAllow=" + " ".join(addresses),
        ]
    else:
        props += ["RestrictAddressFamilies=AF_UNIX", "PrivateNetwork=yes", "IPAddressDeny=any"]
    if env_file is not None:
        props.append(f"EnvironmentFile={env_file}")
    return props


def run_argv(
    agent: str,
    server: McpServer,
    limits: McpLimits,
    addresses: Sequence[str],
    env_file: Path | None,
    *,
    hidden: Sequence[str] = (),
) -> list[str]:
    """The systemd-run command line that starts the server in its unit (no secret in it)."""
    return [
        SYSTEMD_RUN, "--pipe", "--quiet", "--wait", "--collect",
        f"--unit={unit_name(agent, server.name)}",
        f"--description=IronClaw MCP server {server.name} of agent {agent}",
        *(f"--setenv={k}={v}" for k, v in server.env),
        *(f"--property={p}" for p in unit_properties(limits, addresses, env_file, hidden)),
        "--", *server.command,
    ]  # fmt: skip


def resolve_allow(allow: Sequence[str]) -> list[str]:
    """The addresses of the registration's HOST:PORT list, plus the resolvers of
    /etc/resolv.conf so that the server can look the names up itself (docs/mcp.md: the unit's
    filter is by address only: ports are not enforced, and a resolver is reachable)."""
    out: dict[str, None] = {}
    for item in allow:
        host, _, port = item.rpartition(":")
        host = host.strip("[]")
        try:
            infos = socket.getaddrinfo(host, int(port), proto=socket.IPPROTO_TCP)
        except OSError as exc:
            raise McpServerFailed(f"cannot resolve allowed destination {item}: {exc}") from None
        for info in infos:
            out[str(info[4][0])] = None
    with contextlib.suppress(OSError):
        for ns in _ADDRESS_RE.findall(Path("/etc/resolv.conf").read_text()):
            out[ns] = None
    return list(out)


@dataclass
class StdioTransport(McpTransport):
    """What the supervisor needs of a running server: the SDK's streams and why it ended."""

    argv: list[str] = field(default_factory=list)
    pid: int = 0  # the process started (systemd-run's, for a unit)
    stderr_tail: bytearray = field(default_factory=bytearray)
    reason: str = ""
    done: bool = False
    cut_id: str | None = None  # the id of the answer cut at the cap, if it came before the cap

    def ended(self) -> bool:
        return self.done

    def over_cap(self) -> str | None:
        return self.cut_id

    def why(self) -> str:
        tail = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
        return "; ".join([r for r in [self.reason, *tail] if r]) or "the server closed its output"


@contextlib.asynccontextmanager
async def bounded_stdio(
    argv: Sequence[str],
    *,
    max_message_bytes: int,
    env: dict[str, str] | None = None,
    on_first_line: Callable[[], None] = lambda: None,
    on_close: Callable[[], object] | None = None,
) -> AsyncIterator[StdioTransport]:
    """Spawn ``argv`` and speak MCP over its stdin/stdout, one message per line, a line over
    ``max_message_bytes`` ending the transport. ``on_close`` (run in a thread) stops what the
    process started; then the process is killed if it is still there."""
    import anyio  # noqa: PLC0415 (see the module's imports)
    from mcp.shared.message import SessionMessage  # noqa: PLC0415

    try:
        process = await anyio.open_process(
            list(argv), env=env, stderr=subprocess.PIPE, start_new_session=True
        )
    except OSError as exc:
        raise McpServerFailed(f"cannot start {argv[0]}: {exc}") from None
    to_session, read = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write, from_session = anyio.create_memory_object_stream[SessionMessage](16)
    transport = StdioTransport(read=read, write=write, argv=list(argv), pid=process.pid)

    async def reader() -> None:
        try:
            async with to_session:
                await _read_lines(process, transport, to_session, max_message_bytes, on_first_line)
        finally:
            transport.done = True

    async def writer() -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")

    async def stderr() -> None:
        assert process.stderr is not None
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, OSError):
            async for chunk in process.stderr:
                transport.stderr_tail += chunk
                del transport.stderr_tail[:-STDERR_TAIL]

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            tasks.start_soon(writer)
            tasks.start_soon(stderr)
            try:
                yield transport
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(process, on_close)
                tasks.cancel_scope.cancel()
    finally:
        for stream in (read, write, to_session, from_session):
            stream.close()


async def _read_lines(
    process: Process,
    transport: StdioTransport,
    to_session: MemoryObjectSendStream[SessionMessage | Exception],
    max_message_bytes: int,
    on_first_line: Callable[[], None],
) -> None:
    """Hand each line to the SDK's parser; stop at a line longer than the cap (read in chunks,
    each byte scanned once, so a huge line costs memory up to the cap and no more), or past
    MAX_JUNK_LINES lines that are not messages."""
    import anyio  # noqa: PLC0415 (see the module's imports)

    assert process.stdout is not None
    buffer, scanned, first, junk = bytearray(), 0, True, 0
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError,
                             anyio.BrokenResourceError, OSError):  # fmt: skip
        async for chunk in process.stdout:
            if first:
                first = False
                on_first_line()
            buffer += chunk
            while (end := buffer.find(b"\n", scanned)) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                scanned = 0
                parsed = _parse(line)
                if isinstance(parsed, Exception):
                    junk += 1
                    if junk > MAX_JUNK_LINES:
                        transport.reason = (
                            f"the server wrote more than {MAX_JUNK_LINES} lines that are not "
                            "JSON-RPC messages to its stdout (MCP's stdio transport carries "
                            "messages only; logs go to stderr)"
                        )
                        return
                await to_session.send(parsed)
            scanned = len(buffer)
            if len(buffer) > max_message_bytes:
                transport.reason = (
                    f"the server sent a message over {max_message_bytes} bytes "
                    "([mcp] max_message_bytes)"
                )
                transport.cut_id = answer_id(bytes(buffer[:512]))
                return


def answer_id(start: bytes) -> str | None:
    """The id of the answer ``start`` begins, as text ("7", or a string id without its quotes),
    if it comes before the result (the Python SDK's order; the TypeScript SDK writes it after,
    past a cap, where it is never read); None if ``start`` is not the start of an answer."""
    found = _ANSWER_ID.match(start.decode("latin-1"))
    return found.group(1).strip('"') if found else None


def _parse(line: bytes) -> SessionMessage | Exception:
    import mcp_types as types  # noqa: PLC0415 (see the module's imports)
    from mcp.shared.message import SessionMessage  # noqa: PLC0415

    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _stop(process: Process, on_close: Callable[[], object] | None) -> None:
    import anyio  # noqa: PLC0415 (see the module's imports)

    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        if process.stdin is not None:
            await process.stdin.aclose()
    if on_close is not None:
        with anyio.move_on_after(15):
            await anyio.to_thread.run_sync(on_close, abandon_on_cancel=True)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    with anyio.move_on_after(5), contextlib.suppress(OSError):
        await process.aclose()  # waits for it, then closes our ends of its pipes
    # A descendant still holding a pipe (the unit is stopped, so only on a plain child) must
    # not keep the transport open: close it as the SDK's stdio client does.
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


class SystemdMcpLauncher:
    """``ports.McpLauncher`` over systemd-run and the host credential store."""

    def __init__(
        self, credentials: Credentials, limits: McpLimits, hidden: Sequence[str] = ()
    ) -> None:
        self._credentials = credentials
        self._limits = limits
        self._hidden = tuple(hidden)
        self._units = SystemdUnitManager()

    @contextlib.asynccontextmanager
    async def open(self, agent: str, server: McpServer) -> AsyncIterator[McpTransport]:
        if not server.command:
            raise McpServerFailed(f"MCP server {server.name} has no command to run")
        name = unit_name(agent, server.name)
        addresses = await asyncio.to_thread(resolve_allow, server.allow) if server.allow else []
        # A unit left by an earlier run (or a crash) would make systemd-run refuse the name.
        await asyncio.to_thread(self._clear, name)
        env_file = self._write_credentials(name, server)
        argv = run_argv(agent, server, self._limits, addresses, env_file, hidden=self._hidden)
        directory = CREDENTIALS_DIR / name
        try:
            async with bounded_stdio(
                argv, max_message_bytes=self._limits.max_message_bytes,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                on_first_line=lambda: shutil.rmtree(directory, ignore_errors=True),
                on_close=lambda: self._clear(name),
            ) as transport:  # fmt: skip
                yield transport
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _write_credentials(self, unit: str, server: McpServer) -> Path | None:
        if not server.credentials:
            return None
        lines = []
        for env, name in server.credentials:
            value = self._credentials.get(name)  # NotFound names the credential, not the value
            if _PLAIN_VALUE.fullmatch(value) is None or "'" in value or "\\" in value:
                raise McpServerFailed(
                    f"credential {name} (for {env}) has characters an environment file cannot "
                    "carry as they are (quotes, backslashes, newlines or other controls)"
                )
            lines.append(f"{env}='{value}'\n")
        directory = CREDENTIALS_DIR / unit
        CREDENTIALS_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(mode=0o700)
        path = directory / f"env.{secrets.token_hex(4)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("".join(lines))
        return path

    def _clear(self, name: str) -> None:
        self._units.stop(name, 10.0)
        with contextlib.suppress(Exception):
            self._units.reset_failed(name)

    async def stop(self, agent: str, server: str) -> None:
        await asyncio.to_thread(self._clear, unit_name(agent, server))

    async def stop_all(self) -> None:
        units = await asyncio.to_thread(self._units.list_units, f"{UNIT_PREFIX}*.service")
        for unit in units:
            await asyncio.to_thread(self._clear, unit.name)
