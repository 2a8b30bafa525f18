"""Attacks by an unprivileged host user on a running session and the daemon; run as that user
with the host's /usr/bin/python3 (standard library only), parameters as JSON on stdin, a JSON
map of attack id -> {ok, errno, detail} on stdout (the shape of redteam_probe/probes/base.py)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import grpc  # the checkout's virtualenv is on PYTHONPATH (the test puts it there)


class Refused(Exception):
    pass


CODE_CACHE = "/var/cache/ironclaw/dataclasses.bin"


def _attempt(fn: Callable[[], object]) -> dict[str, Any]:
    try:
        detail = fn()
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        return {"ok": False, "errno": name, "detail": str(exc)[:300]}
    except Refused as exc:
        return {"ok": False, "errno": None, "detail": str(exc)[:300]}
    except Exception as exc:
        return {"ok": None, "errno": None, "detail": f"probe error: {exc!r}"[:300]}
    return {"ok": True, "errno": None, "detail": str(detail)[:300]}


def _read(path: str) -> str:
    with open(path, "rb") as handle:
        return f"read {len(handle.read(4096))} bytes of {path}"


def _grpc(path: str, method: str, body: bytes = b"") -> str:
    """A raw gRPC call (bytes in, bytes out); refused unless the server answered OK."""
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            response = call(body, timeout=10)
        except grpc.RpcError as err:
            raise Refused(f"{err.code().name}: {str(err.details())[:200]}") from None
    return f"OK: {bytes(response)[:80].hex()}"


def _ptrace(pid: int) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    # PTRACE_SEIZE: the same permission check as PTRACE_ATTACH, but the tracee is not stopped
    # (root's control run must not freeze the daemon); the tracer's exit detaches.
    if libc.ptrace(0x4206, pid, None, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return f"attached to {pid}"


def _open_for_writing(path: str) -> str:
    """Opening is the check (the file's mode); nothing is written, so not even root's control
    run moves itself into the unit."""
    os.close(os.open(path, os.O_WRONLY))
    return f"opened {path} for writing"


def _create_in(directory: str) -> str:
    path = os.path.join(directory, "planted")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    os.unlink(path)
    return f"created a file in {directory}"


def _journal(sid: str) -> str:
    proc = subprocess.run(
        ["journalctl", "--no-pager", "-o", "cat", "-u", "ironclawd.service", "-n", "200"],
        capture_output=True, check=False, timeout=30,
    )  # fmt: skip
    text = proc.stdout.decode(errors="replace")
    if sid not in text and "session" not in text:
        raise Refused(f"no daemon entries visible ({len(text)} bytes, exit {proc.returncode})")
    return "daemon journal entries visible"


def _admin(path: str) -> str:
    return _grpc(path, "/ironclaw.admin.v1.AdminService/ListSessions")


def _sandbox_mem(pid: int) -> str:
    """The sandbox process's memory (runsc runs it as host uid 65534): 16 bytes of its first
    readable mapping (root's control run reads them; a guard page would give EIO)."""
    with open(f"/proc/{pid}/maps") as maps:
        readable = [line.split() for line in maps if line.split()[1].startswith("r")]
    if not readable:
        raise RuntimeError(f"no readable mapping in /proc/{pid}/maps")  # proves nothing
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(int(readable[0][0].split("-")[0], 16))
        return f"read {len(mem.read(16))} bytes of the sandbox's memory"


def attacks(p: dict[str, Any]) -> dict[str, Callable[[], object]]:
    sid, run = p["sid"], f"/run/ironclaw/sessions/{p['sid']}"
    return {
        "host-users.admin.call": lambda: _admin("/run/ironclaw/admin.sock"),
        "host-users.admin.internal-socket": lambda: _admin(
            "/run/ironclaw/internal/admin-grpc.sock"
        ),
        "host-users.model.call": lambda: _grpc(
            f"{run}/model.sock", "/ironclaw.model.v1.ModelService/GetProfile"
        ),
        "host-users.gateway.submit": lambda: _grpc(
            f"{run}/gateway.sock",
            "/ironclaw.gateway.v1.GatewayService/SubmitChange",
            b'\x0a\x07persona\x12\x13{"persona": "pwn"}',
        ),
        "host-users.sockets.list": lambda: sorted(os.listdir("/run/ironclaw/sessions")),
        "host-users.sockets.plant": lambda: _create_in(run),
        "host-users.keys.read": lambda: _read(f"/run/ironclaw/keys/{sid}"),
        # outbound.db is on a tmpfs in the daemon's own mount namespace: reached through its
        # thread there (/proc/<tid>/root), or by entering that namespace through its pin.
        "host-users.queues.read-outbound": lambda: _read(
            f"/proc/{p['mntns_tid']}/root/var/lib/ironclaw/queues/{sid}/outbound/outbound.db"
        ),
        "host-users.mntns.open-pin": lambda: _read_ns("/run/ironclaw/mntns/ns"),
        # Opening is the check: root's control run must not corrupt the queue it opens.
        "host-users.queues.write-inbound": lambda: _open_for_writing(
            f"/var/lib/ironclaw/queues/{sid}/inbound/inbound.db"
        ),
        "host-users.audit.read": lambda: _read("/var/lib/ironclaw/audit.log"),
        # Compiled code the root daemon runs at its next start (ironclawd/dataclass_cache.py).
        "host-users.code-cache.write": lambda: _open_for_writing(CODE_CACHE),
        "host-users.code-cache.plant": lambda: _create_in(os.path.dirname(CODE_CACHE)),
        "host-users.cgroup.join-unit": lambda: _open_for_writing(p["cgroup_procs"]),
        "host-users.ptrace.daemon": lambda: _ptrace(int(p["daemon_pid"])),
        "host-users.proc.daemon-environ": lambda: _read(f"/proc/{p['daemon_pid']}/environ"),
        "host-users.proc.gofer-root": lambda: os.listdir(f"/proc/{p['gofer_pid']}/root/"),
        "host-users.proc.sandbox-mem": lambda: _sandbox_mem(int(p["sandbox_pid"])),
        "host-users.journal.read": lambda: _journal(sid),
        "host-users.netns.setns": lambda: _setns(f"/proc/{p['runsc_pid']}/ns/net"),
    }


def _read_ns(path: str) -> str:
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)
    return f"opened {path} (what setns() takes)"


def _setns(path: str) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
    finally:
        os.close(fd)
    return "joined the session's netns"


def main() -> int:
    params = json.load(sys.stdin)
    results = {name: _attempt(fn) for name, fn in attacks(params).items()}
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
