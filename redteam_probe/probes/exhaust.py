"""Exhaustion from inside: CPU, memory, processes, disk, inodes and the daemon's log. Each is
bounded here too (by count and time), so a wall that is missing shows as a number, not a hung
test; the tests compare the numbers with the unit's limits and check the host kept answering."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time

from redteam_probe.probes.base import Attack, Opts

WORKSPACE = "/workspace"


def cpu_spin(opts: Opts) -> object:
    """Spin ``spinners`` processes for ``spin_seconds``; the CPU time they got."""
    seconds, count = float(opts.get("spin_seconds", "5")), int(opts.get("spinners", "4"))
    start = time.monotonic()
    children = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                pass
            os._exit(0)
        children.append(pid)
    cpu = 0.0
    for pid in children:
        _, _, usage = os.wait4(pid, 0)
        cpu += usage.ru_utime + usage.ru_stime
    return {"cpu_seconds": round(cpu, 2), "wall_seconds": round(time.monotonic() - start, 2)}


def memory_balloon(opts: Opts) -> object:
    """Touch memory in a child until it is refused or ``balloon_mib`` is reached."""
    limit = int(opts.get("balloon_mib", "1024"))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(read_end)
        held = []
        try:
            for _mib in range(1, limit + 1):
                chunk = bytearray(1 << 20)
                for offset in range(0, len(chunk), 4096):
                    chunk[offset] = 1
                held.append(chunk)
                os.write(write_end, b".")
        except MemoryError:
            os.write(write_end, b"M")
        os._exit(0)
    os.close(write_end)
    got = bytearray()
    with os.fdopen(read_end, "rb") as pipe:
        while data := pipe.read(4096):
            got += data
    _, status = os.waitpid(pid, 0)
    return {"mib": got.count(b"."), "memory_error": b"M" in got, "status": status}


def fork_bomb(opts: Opts) -> object:
    """Fork sleeping children until fork fails or ``fork_max`` are alive."""
    cap = int(opts.get("fork_max", "1024"))
    read_end, write_end = os.pipe()
    children, error = [], None
    for _ in range(cap):
        try:
            pid = os.fork()
        except OSError as exc:
            error = exc.errno
            break
        if pid == 0:  # pragma: no cover - child
            os.close(write_end)
            os.read(read_end, 1)  # parked until the parent closes its end
            os._exit(0)
        children.append(pid)
    os.close(write_end)
    os.close(read_end)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return {"forked": len(children), "errno": error}


def _fill(make: object, cap: int) -> tuple[int, int | None]:
    made, error = 0, None
    for index in range(cap):
        try:
            made += make(index)  # type: ignore[operator]
        except OSError as exc:
            error = exc.errno
            break
    return made, error


def disk_fill(opts: Opts) -> object:
    cap = int(opts.get("disk_mib", "256"))
    directory = os.path.join(WORKSPACE, ".rt-fill")
    os.makedirs(directory, exist_ok=True)
    block = b"\xa5" * (1 << 20)
    path = os.path.join(directory, "blob")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written, error = _fill(lambda _i: os.write(fd, block), cap)
    finally:
        os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)
    return {"bytes": written, "errno": error}


def inode_fill(opts: Opts) -> object:
    cap = int(opts.get("inodes_max", "100000"))
    directory = os.path.join(WORKSPACE, ".rt-inodes")
    os.makedirs(directory, exist_ok=True)

    def make(index: int) -> int:
        os.close(os.open(os.path.join(directory, str(index)), os.O_CREAT | os.O_WRONLY, 0o600))
        return 1

    try:
        made, error = _fill(make, cap)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"files": made, "errno": error}


def log_flood(opts: Opts) -> object:
    """Control lines the daemon rejects, as fast as it takes them (each was a WARNING line).
    The daemon reads a session's lines at its call rate and leaves the rest in the socket: a
    send that waits ``paced_seconds`` for room ends the flood (``paced``), the lines sent
    before it counted."""
    count = int(opts.get("flood_lines", "20000"))
    start, sent, paced = time.monotonic(), 0, False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(float(opts.get("paced_seconds", "10")))
        sock.connect("/run/ironclaw/control.sock")
        sock.sendall(f"hello {os.getpid()} {os.getuid()}\n".encode())
        try:
            for _ in range(count // 500):
                sock.sendall(b"bogus 1\n" * 500)
                sent += 500
        except TimeoutError:
            paced = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
            while not paced and sock.recv(65536):
                pass
    return {"lines": sent, "paced": paced, "seconds": round(time.monotonic() - start, 2)}


ATTACKS: dict[str, Attack] = {
    "exhaustion.cpu-spin": cpu_spin,
    "exhaustion.memory-balloon": memory_balloon,
    "exhaustion.fork-bomb": fork_bomb,
    "exhaustion.disk-fill": disk_fill,
    "exhaustion.inode-fill": inode_fill,
    "exhaustion.log-flood": log_flood,
}
