"""Active containment probes of the red-team probe: what an attacker in the box would try.

Each probe attempts one thing and reports the errno it got (``None`` on success) rather than a
verdict: the red-team tests decide what must fail. Network probes only ever target what the test
names (loopback, or a documentation range that no route can reach: RFC 5737 TEST-NET-2,
RFC 3849 2001:db8::/32); they never pick an address of their own.

Standard library only, but for grpc (the raw gRPC call probe).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import socket
import stat

import grpc

JSON = dict[str, object]

CONNECT_TIMEOUT = 3.0
# A script, not an ELF: the kernel checks the mount's noexec flag before it reads the "#!" line,
# so EACCES here means noexec refused it. "-h" makes the agent exit at once if it ever ran.
_EXEC_SCRIPT = b"#!/app/agent/agent -h\n"


def _errno_name(exc: OSError) -> str:
    if isinstance(exc, TimeoutError) and exc.errno is None:
        return "ETIMEDOUT"
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def parse_target(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); ValueError if malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def try_connect_ip(target: str, kind: str) -> JSON:
    """Connect a ``kind`` ("tcp"/"udp") socket to ``target``; for UDP also try one send.

    connect(2) on a UDP socket sends nothing; it fails only when there is no route, which is
    what this probe is for. The datagram is sent only if connect succeeded.
    """
    host, port = parse_target(target)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock_type = socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM
    result: JSON = {"target": target, "proto": kind, "connected": False, "errno": None}
    try:
        with socket.socket(family, sock_type) as sock:
            sock.settimeout(CONNECT_TIMEOUT)
            sock.connect((host, port))
            result["connected"] = True
            if kind == "udp":
                sock.send(b"ironclaw-probe")
    except OSError as exc:
        result["errno"] = _errno_name(exc)
    return result


def try_connect_unix(path: str) -> JSON:
    """Connect a Unix stream socket to ``path``; errno None means someone accepted."""
    result: JSON = {"path": path, "connected": False, "errno": None}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(CONNECT_TIMEOUT)
            sock.connect(path)
            result["connected"] = True
    except OSError as exc:
        result["errno"] = _errno_name(exc)
    return result


def try_grpc_call(target: str) -> JSON:
    """``PATH=METHOD[=HEX]``: call the gRPC ``METHOD`` (``/pkg.Service/Name``) over the Unix
    socket ``PATH`` with the request bytes ``HEX`` (empty if not given), raw (no stub needed, so
    methods that exist nowhere can be tried too); report the status code and details, and the
    response bytes in hex if it was served (``OK``)."""
    path, _, rest = target.partition("=")
    method, _, body = rest.partition("=")
    result: JSON = {"path": path, "method": method, "code": None, "details": None}
    try:
        with grpc.insecure_channel(f"unix:{path}") as channel:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            response = call(bytes.fromhex(body), timeout=CONNECT_TIMEOUT * 3)
        result["code"] = "OK"
        result["response_hex"] = bytes(response).hex()
    except grpc.RpcError as err:
        result["code"] = err.code().name
        result["details"] = err.details()
    except ValueError as exc:
        result["details"] = f"request is not hex: {exc}"
    return result


# A file's digest is reported so tests can tell whose key a sandbox sees without printing it.
_DIGEST_MAX_BYTES = 1 << 20


def look_at(path: str) -> JSON:
    """Whether ``path`` exists (lstat), its type, whether it can be read or listed (and, for a
    small regular file, the SHA-256 of its contents), and whether it can be written: a file is
    opened for writing without truncation, a directory gets a probe file created and removed."""
    result: JSON = {
        "exists": False, "errno": None, "type": None, "readable": False, "sha256": None,
        "writable": False, "write_errno": None,
    }  # fmt: skip
    try:
        st = os.lstat(path)
    except OSError as exc:
        result["errno"] = _errno_name(exc)
        return result
    result["exists"] = True
    result["type"] = _file_type(st.st_mode)
    try:
        if stat.S_ISDIR(st.st_mode):
            os.listdir(path)
        else:
            with open(path, "rb") as handle:
                data = handle.read(_DIGEST_MAX_BYTES + 1)
            if stat.S_ISREG(st.st_mode) and len(data) <= _DIGEST_MAX_BYTES:
                result["sha256"] = hashlib.sha256(data).hexdigest()
        result["readable"] = True
    except OSError as exc:
        result["errno"] = _errno_name(exc)
    result.update(_try_write(path, st.st_mode))
    return result


def _try_write(path: str, mode: int) -> JSON:
    try:
        if stat.S_ISDIR(mode):
            probe = os.path.join(path, f".ironclaw-write-probe-{os.getpid()}")
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.close(fd)
            os.unlink(probe)
        elif stat.S_ISREG(mode):
            os.close(os.open(path, os.O_WRONLY | os.O_NOFOLLOW))
        else:
            return {"writable": False, "write_errno": None}
    except OSError as exc:
        return {"writable": False, "write_errno": _errno_name(exc)}
    return {"writable": True, "write_errno": None}


def _file_type(mode: int) -> str:
    for name, test in (
        ("dir", stat.S_ISDIR),
        ("file", stat.S_ISREG),
        ("symlink", stat.S_ISLNK),
        ("socket", stat.S_ISSOCK),
        ("char", stat.S_ISCHR),
        ("block", stat.S_ISBLK),
        ("fifo", stat.S_ISFIFO),
    ):
        if test(mode):
            return name
    return "other"


def try_exec_in(directory: str) -> JSON:
    """Write an executable script into ``directory`` and try to execve it."""
    path = os.path.join(directory, f".ironclaw-exec-probe-{os.getpid()}")
    result: JSON = {"written": False, "executed": False, "errno": None}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    except OSError as exc:
        result["errno"] = _errno_name(exc)
        return result
    try:
        os.write(fd, _EXEC_SCRIPT)
        os.close(fd)
        result["written"] = True
        # The child's output must not mix with the JSON report on stdout.
        quiet = [(os.POSIX_SPAWN_OPEN, n, os.devnull, os.O_WRONLY, 0) for n in (1, 2)]
        pid = os.posix_spawn(path, [path], {}, file_actions=quiet)
        os.waitpid(pid, 0)
        result["executed"] = True
    except OSError as exc:
        result["errno"] = _errno_name(exc)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return result


# syslog(2): SYSLOG_ACTION_READ_ALL. Read-only; gVisor answers with its own boot messages.
_SYSLOG_ACTION_READ_ALL = 3
_KERNEL_LOG_BYTES = 4096


def read_kernel_log() -> JSON:
    """The kernel log as dmesg(1) would read it (klogctl(3)), or the errno it failed with."""
    result: JSON = {"text": None, "errno": None}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(_KERNEL_LOG_BYTES)
        size = int(libc.klogctl(_SYSLOG_ACTION_READ_ALL, buf, _KERNEL_LOG_BYTES))
    except (OSError, AttributeError) as exc:
        result["errno"] = str(exc)
        return result
    if size < 0:
        result["errno"] = errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    else:
        result["text"] = buf.raw[:size].decode("utf-8", "replace")
    return result
