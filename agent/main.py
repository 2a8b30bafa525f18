"""The in-box agent: answers its session's messages, or reports its environment.

Normal mode: open the session's key and queues, connect to ``$IRONCLAW_CONTROL_SOCKET`` (a Unix
stream socket the host serves in the session's sockets directory), say ``hello <pid> <uid>`` and
answer every inbound message once, in order (agent/loop.py); when the host goes away (a daemon
restart), reconnect and say hello again so that the new daemon adopts this sandbox.
``--probe`` prints a JSON report of the sandbox as seen from inside and exits; the
containment tests run it with ``runsc exec``/``runsc run``.

Standard library only, and nothing of ``ironclawd`` (import-linter contract): this module is
frozen into a standalone executable that runs in a rootfs with no interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import sqlcipher3

from agent import attacks, probes
from agent.loop import Agent
from agent.probes.grep import grep_tree
from agent.queues import QueueError

DEFAULT_CONTROL_SOCKET = "/run/ironclaw/control.sock"
CONTROL_SOCKET_ENV = "IRONCLAW_CONTROL_SOCKET"

# The host creates the socket before starting the sandbox, but the agent must not race a host
# that is still binding it (or restarting): retry for a bounded time, then fail loudly.
CONNECT_FIRST_DELAY = 0.05
CONNECT_MAX_DELAY = 1.0
CONNECT_DEADLINE = 30.0
# After the host went away: how long a daemon restart may take before the agent gives up.
RECONNECT_DEADLINE = 600.0
# Errors that mean "not there yet": no socket file, or nobody listening on it.
_RETRYABLE_ERRNOS = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN})

# prctl(2): PR_GET_NO_NEW_PRIVS. gVisor (runsc 20221219) leaves NoNewPrivs and CapAmb out of
# /proc/self/status, so ask the kernel directly as well.
PR_GET_NO_NEW_PRIVS = 39

STATUS_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
_CAP_FIELDS = frozenset({"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"})

JSON = dict[str, object]


class AgentError(Exception):
    """The agent cannot go on; the message says what it was doing."""


def connect_control(
    path: str,
    *,
    deadline: float = CONNECT_DEADLINE,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> socket.socket:
    """Connect to the control socket at ``path``, retrying with capped exponential backoff."""
    give_up_at = monotonic() + deadline
    delay = CONNECT_FIRST_DELAY
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            if exc.errno not in _RETRYABLE_ERRNOS:
                raise AgentError(f"connecting to control socket {path}: {exc}") from exc
            remaining = give_up_at - monotonic()
            if remaining <= 0:
                raise AgentError(
                    f"connecting to control socket {path}: gave up after {deadline:g} s: {exc}"
                ) from exc
            sleep(min(delay, remaining))
            delay = min(delay * 2, CONNECT_MAX_DELAY)
        else:
            return sock


def run_control(path: str) -> int:
    """Say hello on the control socket and hold it open; when the host goes away (a daemon
    restart), reconnect and say hello again so the new daemon can adopt this sandbox. Returns
    only if the host stays away past RECONNECT_DEADLINE (raises AgentError)."""
    try:
        worker = Agent()
    except (OSError, ValueError, QueueError, sqlcipher3.Error) as exc:
        raise AgentError(f"opening the session's key and queues: {exc}") from exc
    deadline = CONNECT_DEADLINE
    while True:
        with (
            connect_control(path, deadline=deadline) as sock,
            contextlib.suppress(ConnectionResetError, BrokenPipeError),
        ):
            worker.serve(sock)
        deadline = RECONNECT_DEADLINE


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _parse_status(text: str | None) -> JSON:
    """Pick the privilege fields out of /proc/self/status (proc(5)); capability masks as ints."""
    found: JSON = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            value = value.strip()
            found[key] = int(value, 16) if key in _CAP_FIELDS else int(value)
    return found


def _net_dev_interfaces(text: str | None) -> list[str] | None:
    """Interface names from /proc/net/dev: two header lines, then ``name: counters``."""
    if text is None:
        return None
    return sorted(line.split(":", 1)[0].strip() for line in text.splitlines()[2:] if ":" in line)


def _sys_class_net() -> list[str] | None:
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError:
        return None


def _routes(text: str | None) -> list[str] | None:
    """Route lines of /proc/net/route, header dropped; empty means no IPv4 route at all."""
    if text is None:
        return None
    return [line.strip() for line in text.splitlines()[1:] if line.strip()]


def _routes6(text: str | None) -> list[str] | None:
    """Lines of /proc/net/ipv6_route (no header); None if the file is absent."""
    if text is None:
        return None
    return [line.strip() for line in text.splitlines() if line.strip()]


def _is_writable(directory: str) -> JSON:
    """Try to create (and remove) a file in ``directory``; report errno rather than guess."""
    probe = os.path.join(directory, f".ironclaw-probe-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return {"writable": False, "errno": errno.errorcode.get(exc.errno or 0, str(exc.errno))}
    os.close(fd)
    os.unlink(probe)
    return {"writable": True, "errno": None}


def _prctl_no_new_privs() -> int | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        value = int(libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0))
    except (OSError, AttributeError):
        return None
    return None if value < 0 else value


def _list_dir(path: str) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


# Where an attacker would look for a place to write; "/" stays in the report as "root" too.
WRITABLE_CANDIDATES = (
    "/", "/tmp", "/workspace", "/run", "/run/ironclaw", "/etc", "/app", "/lib", "/dev", "/dev/shm",
    "/sys", "/proc",
)  # fmt: skip


def _processes(pids: list[int] | None) -> list[JSON]:
    """Each visible process: pid, argv[0] and the IRONCLAW_SID in its environment, if readable."""
    found: list[JSON] = []
    for pid in pids or []:
        cmdline = _read_bytes(f"/proc/{pid}/cmdline")
        environ = _read_bytes(f"/proc/{pid}/environ")
        sid = None
        for item in (environ or b"").split(b"\0"):
            if item.startswith(b"IRONCLAW_SID="):
                sid = item.partition(b"=")[2].decode("utf-8", "replace")
        argv0 = (cmdline or b"").split(b"\0", 1)[0].decode("utf-8", "replace")
        found.append(
            {"pid": pid, "argv0": argv0, "sid": sid, "environ_readable": environ is not None}
        )
    return found


def _read_bytes(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def _proc_pids() -> list[int] | None:
    try:
        return sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return None


def probe(
    *,
    net_targets: Sequence[str] = (),
    unix_paths: Sequence[str] = (),
    look_paths: Sequence[str] = (),
    grep_needles: Sequence[bytes] = (),
    grpc_calls: Sequence[str] = (),
) -> JSON:
    """What the agent sees of its sandbox: identity, privileges, network, filesystem, kernel;
    plus the attempts asked for: IP connects to ``net_targets`` (TCP and UDP), Unix connects to
    ``unix_paths``, a look at each of ``look_paths``, and (if any ``grep_needles``) every
    readable file searched for them."""
    report = _passive_report()
    if grep_needles:
        report["grep"] = grep_tree(grep_needles)
    report.update(
        {
            "net": [
                attacks.try_connect_ip(target, kind)
                for target in net_targets
                for kind in ("tcp", "udp")
            ],
            "unix": [attacks.try_connect_unix(path) for path in unix_paths],
            "paths": {path: attacks.look_at(path) for path in look_paths},
            "grpc": [attacks.try_grpc_call(target) for target in grpc_calls],
        }
    )
    return report


def _passive_report() -> JSON:
    uname = os.uname()
    mounts = _read_text("/proc/self/mounts")
    return {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "egid": os.getegid(),
        "groups": os.getgroups(),
        "status": _parse_status(_read_text("/proc/self/status")),
        "no_new_privs": _prctl_no_new_privs(),
        "net_dev_interfaces": _net_dev_interfaces(_read_text("/proc/net/dev")),
        "sys_class_net": _sys_class_net(),
        "routes": _routes(_read_text("/proc/net/route")),
        "root": _is_writable("/"),
        "uname": {
            "sysname": uname.sysname,
            "release": uname.release,
            "version": uname.version,
            "machine": uname.machine,
        },
        "proc_version": (_read_text("/proc/version") or "").strip() or None,
        "resolv_conf_exists": os.path.lexists("/etc/resolv.conf"),
        "top_level": _list_dir("/"),
        "mounts": None if mounts is None else mounts.splitlines(),
        "executable": sys.executable,
        "frozen": bool(getattr(sys, "frozen", False)),
        "ipv6_routes": _routes6(_read_text("/proc/net/ipv6_route")),
        "hostname": uname.nodename,
        "proc_pids": _proc_pids(),
        "processes": _processes(_proc_pids()),
        "kernel_log": attacks.read_kernel_log(),
        "run_ironclaw": _list_dir("/run/ironclaw"),
        "writable": {path: _is_writable(path) for path in WRITABLE_CANDIDATES},
        "workspace_exec": attacks.try_exec_in("/workspace"),
    }


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="agent", description="IronClaw in-box agent")
    parser.add_argument(
        "--probe", action="store_true", help="print a JSON report of the sandbox and exit"
    )
    parser.add_argument(
        "--probe-net",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="with --probe: try TCP and UDP connects to HOST:PORT and report the errno",
    )
    parser.add_argument(
        "--probe-unix",
        action="append",
        default=[],
        metavar="PATH",
        help="with --probe: try connecting to the Unix socket PATH and report the errno",
    )
    parser.add_argument(
        "--probe-path",
        action="append",
        default=[],
        metavar="PATH",
        help="with --probe: report whether PATH exists, can be read (its SHA-256) or written",
    )
    parser.add_argument(
        "--probe-grep",
        action="append",
        default=[],
        metavar="HEX",
        help="with --probe: search every readable file (incl. /proc/*/environ and cmdline) for "
        "these bytes, given in hex so that this process's own argv does not hold them",
    )
    parser.add_argument(
        "--probe-grpc",
        action="append",
        default=[],
        metavar="PATH=METHOD[=HEX]",
        help="with --probe: call the gRPC METHOD (/pkg.Service/Name) on the Unix socket PATH "
        "with the request bytes HEX (default: none) and report the status code and response",
    )
    parser.add_argument(
        "--probe-attack",
        action="append",
        default=[],
        metavar="CATEGORY",
        help=f"with --probe: run every attack of CATEGORY ({', '.join(probes.CATEGORIES)})",
    )
    parser.add_argument(
        "--probe-opt", action="append", default=[], metavar="KEY=VALUE", help="attack options"
    )
    parser.add_argument(
        "--hog-mib", type=int, default=0, metavar="N", help="touch N MiB of memory and exit"
    )
    return parser.parse_args(argv)


def hog(mib: int) -> int:
    """Touch ``mib`` MiB of memory, one page at a time (the cgroup-limit test runs this with
    ``runsc exec``; it gives the agent nothing it could not do with a loop of its own)."""
    chunks = []
    for _ in range(mib):
        chunk = bytearray(1024 * 1024)
        for offset in range(0, len(chunk), 4096):
            chunk[offset] = 1
        chunks.append(chunk)
    print(f"hog: holding {mib} MiB", flush=True)
    return 0


def _grep_needles(hexes: Sequence[str]) -> list[bytes]:
    """The --probe-grep needles; ValueError says which one is bad."""
    needles = []
    for text in hexes:
        try:
            needle = bytes.fromhex(text)
        except ValueError as exc:
            raise ValueError(f"--probe-grep {text!r}: expected hex: {exc}") from None
        if not needle:
            raise ValueError("--probe-grep: expected at least one byte")
        needles.append(needle)
    return needles


def run_probe(args: argparse.Namespace) -> int:
    """``--probe``: print the JSON report; 2 for a bad probe argument."""
    try:
        for target in args.probe_net:
            attacks.parse_target(target)
        needles = _grep_needles(args.probe_grep)
        opts = dict(opt.partition("=")[::2] for opt in args.probe_opt)
        if args.probe_attack:  # attacks only: the passive report is another exec's job
            report: JSON = {"attacks": probes.run(args.probe_attack, opts)}
            json.dump(report, sys.stdout, sort_keys=True)
            sys.stdout.write("\n")
            return 0
    except ValueError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    report = probe(
        net_targets=args.probe_net,
        unix_paths=args.probe_unix,
        look_paths=args.probe_path,
        grep_needles=needles,
        grpc_calls=args.probe_grpc,
    )
    json.dump(report, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent; returns the process exit status."""
    args = _parse_args(argv)
    if args.hog_mib:
        return hog(args.hog_mib)
    if args.probe:
        return run_probe(args)
    path = os.environ.get(CONTROL_SOCKET_ENV) or DEFAULT_CONTROL_SOCKET
    try:
        return run_control(path)
    except AgentError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"agent: control socket {path}: {exc}", file=sys.stderr)
        return 1
