"""systemd's file descriptor store (``sd_pid_notify_with_fds(3)``, ``FDSTORE=1``; the unit's
``FileDescriptorStoreMax=``): sockets the daemon hands to systemd as it stops and takes back
when it starts again, so that what they connect survives a restart (systemd-python's
``sd_notify`` and ``sd_listen_fds_with_names``: no hand-written datagrams or environment parsing).

systemd keeps the store while the service restarts and empties it when the service stops for
good, closing what it holds. Only the service's main process may add to it
(``NotifyAccess=main``).

**Bundles, not a descriptor per name** (``put_all``). Handing 1000 descriptors to systemd
252 one notification each took 0.51-0.56 s at 500 sessions (9-16 ms at 300): PID 1 checks each
new descriptor against every one it holds (``same_fd``), and the notifications queue behind
each other. So the descriptors travel *in flight*: they are sent as ``SCM_RIGHTS`` messages (at
most 253 a message, their names as the message's data) into a fresh ``SOCK_SEQPACKET``
socketpair, and systemd stores only its receiving end (``FDPOLL=0``: its writer is closed, which
is not a hang-up to act on). A bundle holds at most 8 messages (2024 descriptors), well inside a
socket's default send buffer (13 such messages fit in 208 KiB; the daemon may not raise it):
more sessions make more bundles, ``ironclawd.bundle.0``, ``.1``, ... The kernel keeps in-flight
descriptors open while the socket holding them lives; the next start reads them back
(``take``). If the store is emptied, the sockets and everything in flight in them are closed,
as stored descriptors would be. A descriptor whose peer hangs up meanwhile stays in its bundle
(systemd would have dropped it): the next start sees the hang-up when it uses it. What older
versions stored one by one is still taken back under its own name; an older version given a
bundle closes it, and its agents reconnect.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket

from systemd import daemon

log = logging.getLogger("ironclawd.fdstore")

# sd_pid_notify_with_fds(3): a name is at most 255 ASCII characters, no control character and
# no ':' (the separator of $LISTEN_FDNAMES).
NAME_MAX = 255
BUNDLE = "ironclawd.bundle."  # + a number: sockets whose queues hold descriptors in flight
MAX_FDS_PER_MESSAGE = 253  # SCM_MAX_FD: the kernel's limit on one message's descriptors
MESSAGES_PER_BUNDLE = 8
_MESSAGE_BYTES = 64 * 1024  # a message's names: at most 253 of at most 255 characters, as JSON


def check_name(name: str) -> str:
    if not name or len(name) > NAME_MAX or not name.isascii() or ":" in name:
        raise ValueError(f"fd store name: expected 1-{NAME_MAX} ASCII characters without ':', "
                         f"got {name!r}")  # fmt: skip
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ValueError(f"fd store name: control character in {name!r}")
    return name


class SystemdFdStore:
    """The store of the service this process is the main process of."""

    def take(self) -> dict[str, list[socket.socket]]:
        """What an earlier run of this service stored, by name (and dropped from the store: if
        this run dies before handing them back, their peers see the connection end). A
        descriptor that is not a socket is closed. Empty when not started by systemd."""
        taken: dict[str, list[socket.socket]] = {}
        stored: set[str] = set()
        for fd, name in sorted(daemon.listen_fds_with_names(unset_environment=True).items()):
            stored.add(name)
            sock = _socket(fd, name)
            if sock is None:
                continue
            if name.startswith(BUNDLE):
                with sock:
                    for inner, socks in unbundle(sock).items():
                        taken.setdefault(inner, []).extend(socks)
                continue
            taken.setdefault(name, []).append(sock)
        for name in stored:
            self.drop(name)
        if stored:
            log.info("fd store: took back %d socket(s) under %d stored name(s)",
                     sum(len(socks) for socks in taken.values()), len(stored))  # fmt: skip
        return taken

    def put(self, name: str, fds: list[int]) -> bool:
        """Hand copies of ``fds`` to systemd under ``name``; False if there is no systemd to
        take them. The caller closes its own either way."""
        state = f"FDSTORE=1\nFDNAME={check_name(name)}"
        return bool(daemon.notify(state, fds=fds))

    def put_all(self, entries: list[tuple[str, list[int]]]) -> bool:
        """Hand copies of every entry's descriptors to systemd in bundles (see the module's
        docstring): one stored descriptor per 2024. False if there is no systemd to take them,
        or a bundle could not be made: what was not stored is lost to the next start (its
        agents reconnect). The caller closes its own descriptors either way."""
        for name, fds in entries:
            check_name(name)
            if not 0 < len(fds) <= MAX_FDS_PER_MESSAGE:
                raise ValueError(f"fd store: {len(fds)} descriptors under {name!r}: expected "
                                 f"1-{MAX_FDS_PER_MESSAGE}")  # fmt: skip
        messages = _messages(entries)
        for number, start in enumerate(range(0, len(messages), MESSAGES_PER_BUNDLE)):
            try:
                reader = bundle(messages[start : start + MESSAGES_PER_BUNDLE])
            except OSError as exc:
                log.warning("fd store: bundling descriptors: %s", exc.strerror or exc)
                return False
            with reader:
                state = f"FDSTORE=1\nFDNAME={BUNDLE}{number}\nFDPOLL=0"
                if not daemon.notify(state, fds=[reader.fileno()]):
                    return False
        return True

    def drop(self, name: str) -> None:
        daemon.notify(f"FDSTOREREMOVE=1\nFDNAME={check_name(name)}")

    def barrier(self, timeout: float) -> bool:
        """Wait until systemd has processed every notification sent before this one
        (``sd_notify_barrier(3)``: it closes the pipe end sent with ``BARRIER=1``): what was
        stored is in the store before this process exits. False on a timeout or without
        systemd."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                sent = daemon.notify("BARRIER=1", fds=[write_end])
            finally:
                os.close(write_end)
            if not sent:
                return False
            # poll, not select: with hundreds of sessions the descriptor is above FD_SETSIZE.
            waiter = select.poll()
            waiter.register(read_end, select.POLLIN | select.POLLHUP)
            return bool(waiter.poll(timeout * 1000))
        finally:
            os.close(read_end)


def _messages(entries: list[tuple[str, list[int]]]) -> list[tuple[bytes, list[int]]]:
    """``entries`` as bundle messages: (JSON list of [name, count], descriptors), at most 253
    descriptors each. Each entry has 1-253 descriptors (``put_all`` checks)."""
    messages: list[tuple[bytes, list[int]]] = []
    names: list[list[str | int]] = []
    fds: list[int] = []
    for name, group in entries:
        if len(fds) + len(group) > MAX_FDS_PER_MESSAGE:
            messages.append((json.dumps(names).encode(), fds))
            names, fds = [], []
        names.append([name, len(group)])
        fds.extend(group)
    if fds:
        messages.append((json.dumps(names).encode(), fds))
    return messages


def bundle(messages: list[tuple[bytes, list[int]]]) -> socket.socket:
    """A socket with ``messages`` queued in it, their descriptors in flight: the receiving end
    of a SOCK_SEQPACKET pair whose sending end is closed. Nothing reads it until the next start,
    so a send that would block fails (OSError) instead of waiting."""
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        with writer:
            writer.setblocking(False)
            for data, fds in messages:
                socket.send_fds(writer, [data], fds)
    except BaseException:
        reader.close()
        raise
    return reader


def unbundle(reader: socket.socket) -> dict[str, list[socket.socket]]:
    """What ``bundle`` queued in ``reader``, by name. A message that is not what ``bundle``
    writes (or lost descriptors to truncation) has its descriptors closed, with a warning."""
    taken: dict[str, list[socket.socket]] = {}
    reader.setblocking(False)
    while True:
        try:
            data, fds, flags, _ = socket.recv_fds(reader, _MESSAGE_BYTES, MAX_FDS_PER_MESSAGE)
        except (BlockingIOError, InterruptedError):
            break
        except OSError as exc:
            log.warning("fd store: reading the bundle: %s", exc.strerror)
            break
        if not data and not fds:
            break  # the writer's end is closed and the queue is empty
        groups = _groups(data, len(fds))
        if groups is None or flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
            log.warning("fd store: a bundle message with %d descriptor(s) was not ours or was "
                        "cut short: closed", len(fds))  # fmt: skip
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            continue
        at = 0
        for name, count in groups:
            for fd in fds[at : at + count]:
                sock = _socket(fd, name)
                if sock is not None:
                    taken.setdefault(name, []).append(sock)
            at += count
    return taken


def _groups(data: bytes, fds: int) -> list[tuple[str, int]] | None:
    """The (name, count) list of a bundle message, if it is one and its counts add up."""
    try:
        parsed = json.loads(data)
    except ValueError:
        return None
    if not isinstance(parsed, list):
        return None
    groups: list[tuple[str, int]] = []
    for item in parsed:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], int) and item[1] > 0):  # fmt: skip
            return None
        groups.append((item[0], item[1]))
    return groups if sum(count for _, count in groups) == fds else None


def _socket(fd: int, name: str) -> socket.socket | None:
    """``fd`` as a socket object; a descriptor that is not a socket is closed."""
    try:
        return socket.socket(fileno=fd)
    except OSError as exc:
        log.warning("fd store: descriptor %d (%s) is not a socket (%s): closed", fd, name,
                    exc.strerror)  # fmt: skip
        with contextlib.suppress(OSError):
            os.close(fd)
        return None
