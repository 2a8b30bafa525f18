"""systemd's file descriptor store (``sd_pid_notify_with_fds(3)``, ``FDSTORE=1``; the unit's
``FileDescriptorStoreMax=``): sockets the daemon hands to systemd as it stops and takes back
when it starts again, so that what they connect survives a restart (systemd-python's
``sd_notify`` and ``sd_listen_fds_with_names``: no hand-written datagrams or environment parsing).

systemd keeps the store while the service restarts and empties it when the service stops for
good, closing what it holds; a stored socket whose peer hangs up is dropped from it. Only the
service's main process may add to it (``NotifyAccess=main``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket

from systemd import daemon

log = logging.getLogger("ironclawd.fdstore")

# sd_pid_notify_with_fds(3): a name is at most 255 ASCII characters, no control character and
# no ':' (the separator of $LISTEN_FDNAMES).
NAME_MAX = 255


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
        for fd, name in sorted(daemon.listen_fds_with_names(unset_environment=True).items()):
            try:
                sock = socket.socket(fileno=fd)
            except OSError as exc:
                log.warning("fd store: descriptor %d (%s) is not a socket (%s): closed", fd,
                            name, exc.strerror)  # fmt: skip
                with contextlib.suppress(OSError):
                    os.close(fd)
                continue
            taken.setdefault(name, []).append(sock)
        for name in taken:
            self.drop(name)
        return taken

    def put(self, name: str, fds: list[int]) -> bool:
        """Hand copies of ``fds`` to systemd under ``name``; False if there is no systemd to
        take them. The caller closes its own either way."""
        state = f"FDSTORE=1\nFDNAME={check_name(name)}"
        return bool(daemon.notify(state, fds=fds))

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
