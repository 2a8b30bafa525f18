"""Kernel-derived caller identity for the admin socket.

grpcio does not expose a connection's SO_PEERCRED. So the daemon owns the public socket itself:
for each accepted connection it reads SO_PEERCRED and SO_PEERGROUPS (socket(7)), records a
:class:`Caller` under a fresh random nonce, and splices the bytes to the real gRPC server, which
listens in a root-only directory. The splice's client end is bound to the abstract address
``ironclaw-peer/<nonce>``; grpcio reports that address as the call's ``peer()``, and the
interceptor (``api/auth.py``) maps it back to the Caller. A client cannot use a nonce: the names
are not secret (``/proc/net/unix`` lists them), but only root can connect to the internal
socket. See docs/admin-identity.md.
"""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
import functools
import grp
import logging
import pwd
import secrets
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from ironclawd import ratelog
from ironclawd.api.sockets import serve_unix
from ironclawd.api.splice import splice_to

log = logging.getLogger("ironclawd.admin")

_ABSTRACT_PREFIX = "ironclaw-peer/"
# Not exported by Python's socket module; value from <asm-generic/socket.h> (Linux >= 4.13).
_SO_PEERGROUPS = 59
_NGROUPS_MAX = 65536


@dataclass(frozen=True)
class Caller:
    """Who the kernel says is on the other end of an admin connection."""

    uid: int
    gid: int
    pid: int
    groups: tuple[int, ...]
    user_name: str
    authorized: bool

    def describe(self) -> str:
        return f"uid {self.uid} ({self.user_name}) pid {self.pid}"

    @functools.cached_property
    def group_names(self) -> frozenset[str]:
        """The names of the groups the kernel said the caller is in at connect time (primary
        and supplementary; a gid without a name has none). Looked up on first use and kept for
        the connection: the gids are the connection's already, and each lookup reads the group
        database (~0.1-0.2 ms here, and every SendMessage asks)."""
        names: set[str] = set()
        for gid in {self.gid, *self.groups}:
            with contextlib.suppress(KeyError):
                names.add(grp.getgrgid(gid).gr_name)
        return frozenset(names)


def read_peer(sock: socket.socket, admin_gid: int) -> Caller:
    """Read the peer's credentials and supplementary groups from the kernel."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    groups = _peer_groups(sock)
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid{uid}"
    authorized = uid == 0 or gid == admin_gid or admin_gid in groups
    return Caller(uid, gid, pid, groups, name, authorized)


def _peer_groups(sock: socket.socket) -> tuple[int, ...]:
    size = 64
    while size <= _NGROUPS_MAX:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, size * 4)
        except OSError as exc:
            if exc.errno != 34:  # ERANGE: buffer too small, retry larger
                raise
            size *= 4
            continue
        return tuple(array.array("I", raw))
    return ()


class Shares:
    """How much of a limited thing (admin connections, calls in flight) each caller holds. A
    user other than root holds at most a quarter of ``limit``, and all of them together leave
    an eighth to root: one member of the admin group (or a few) cannot lock the others, or root,
    out of the admin API. A caller outside the group holds at most one: it is answered
    PERMISSION_DENIED, and needs no more to read that."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.per_user = max(1, limit // 4)
        self.for_root = limit // 8
        self._held: collections.Counter[int] = collections.Counter()
        self._total = 0

    def take(self, caller: Caller) -> str | None:
        """Take one for ``caller``; or why not (nothing is taken then)."""
        if caller.uid == 0:
            if self._total >= self.limit:
                return f"all {self.limit} in use"
        else:
            mine = self._held[caller.uid]
            if mine >= (self.per_user if caller.authorized else 1):
                return f"uid {caller.uid} holds {mine}, its most"
            if self._total >= self.limit - self.for_root:
                return f"{self._total} of {self.limit} in use; the rest is kept for root"
        self._held[caller.uid] += 1
        self._total += 1
        return None

    def give(self, caller: Caller) -> None:
        self._held[caller.uid] -= 1
        if self._held[caller.uid] <= 0:
            del self._held[caller.uid]
        self._total -= 1

    def held(self, uid: int) -> int:
        return self._held[uid]


class PeerRegistry:
    """Maps the nonce of each spliced connection to the Caller read when it was accepted."""

    def __init__(self) -> None:
        self._callers: dict[str, Caller] = {}

    def register(self, caller: Caller) -> str:
        nonce = secrets.token_hex(16)
        self._callers[nonce] = caller
        return nonce

    def forget(self, nonce: str) -> None:
        self._callers.pop(nonce, None)

    def resolve(self, peer: str) -> Caller | None:
        """Return the Caller for a grpc ``context.peer()`` string, or None if unknown."""
        scheme, _, address = peer.partition(":")
        if scheme != "unix-abstract" or not address.startswith(_ABSTRACT_PREFIX):
            return None
        return self._callers.get(address[len(_ABSTRACT_PREFIX) :])

    def __len__(self) -> int:
        return len(self._callers)


class PeerFront:
    """Accepts admin connections, identifies each peer, splices it to the internal server."""

    def __init__(
        self,
        listener: socket.socket,
        internal_socket: Path,
        registry: PeerRegistry,
        admin_gid: int,
        max_connections: int,
    ) -> None:
        self._listener = listener
        self._internal = internal_socket
        self._registry = registry
        self._admin_gid = admin_gid
        self.shares = Shares(max_connections)
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await serve_unix(self._handle, self._listener)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock: socket.socket = writer.get_extra_info("socket")
        try:
            caller = read_peer(sock, self._admin_gid)
        except OSError as exc:
            log.warning("admin connection dropped: reading peer credentials: %s", exc)
            writer.close()
            return
        why = self.shares.take(caller)
        if why is not None:
            # Each user decides how often it is refused: its lines go through the throttle.
            ratelog.warning(log, f"uid{caller.uid}", "admin connections",
                            "admin connection of %s refused: %s", caller.describe(),
                            why)  # fmt: skip
            writer.close()
            return
        try:
            # Even an unauthorized caller is spliced through: the interceptor answers it with a
            # clear PERMISSION_DENIED instead of a bare connection reset.
            nonce = self._registry.register(caller)
            try:
                await splice_to(self._internal, _ABSTRACT_PREFIX + nonce, reader, writer)
            finally:
                self._registry.forget(nonce)
        finally:
            self.shares.give(caller)
