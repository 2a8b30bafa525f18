"""What every attack module shares: the outcome shape, raw syscalls, a forked attempt."""

from __future__ import annotations

import ctypes
import errno
import json
import os
from collections.abc import Callable, Mapping

JSON = dict[str, object]
Opts = Mapping[str, str]
Attack = Callable[[Opts], object]

_DETAIL_MAX = 600
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long

# x86_64 system call numbers (asm/unistd_64.h) for calls glibc has no wrapper for, or whose
# wrapper hides the errno.
SYS = {
    "ptrace": 101, "personality": 135, "iopl": 172, "init_module": 175, "delete_module": 176,
    "kexec_load": 246, "add_key": 248, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
    "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310, "finit_module": 313,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "pivot_root": 155, "chroot": 161,
    "mount": 165, "umount2": 166, "reboot": 169, "sethostname": 170, "settimeofday": 164,
    "setuid": 105, "setgid": 106, "capget": 125, "capset": 126, "mknod": 133, "syslog": 103,
    "acct": 163,
    "swapon": 167, "clock_settime": 227, "setresuid": 117, "name_to_handle_at": 303,
}  # fmt: skip


class Refused(Exception):
    """The attempt did not do what the attacker wanted, without an errno to say so."""


class MissingTarget(Exception):
    """What the attack aims at is not where the probe looks (or not what it expects there):
    a probe error, never a refusal, so a target that moved cannot pass for a wall."""


def target(path: str, is_kind: Callable[[int], bool], what: str) -> str:
    """``path``, once lstat(2) shows it exists and ``is_kind(st_mode)`` holds; else
    MissingTarget. Attacks call it first, so that their own ENOENT means only a refusal."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise MissingTarget(f"{path}: {exc.strerror}: expected the {what} there") from None
    if not is_kind(mode):
        raise MissingTarget(f"{path}: expected the {what}, found mode {mode:o}")
    return path


def errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))


def attempt(fn: Callable[[], object]) -> JSON:
    """Run one attack: ``ok`` if it returned, else the errno (or the refusal) it met."""
    try:
        detail = fn()
    except OSError as exc:
        if isinstance(exc, TimeoutError) and exc.errno is None:
            return {"ok": False, "errno": "ETIMEDOUT", "detail": "timed out"}
        name = errno_name(exc.errno) if exc.errno is not None else None
        return {"ok": False, "errno": name, "detail": str(exc)[:_DETAIL_MAX]}
    except Refused as exc:
        return {"ok": False, "errno": None, "detail": str(exc)[:_DETAIL_MAX]}
    except Exception as exc:  # a probe bug is reported, never taken for containment
        return {"ok": None, "errno": None, "detail": f"probe error: {exc!r}"[:_DETAIL_MAX]}
    text = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    return {"ok": True, "errno": None, "detail": text[:_DETAIL_MAX]}


def syscall(name: str, *args: object) -> int:
    """The raw system call ``name``; OSError with its errno if it fails."""
    conv = [
        ctypes.c_long(a) if isinstance(a, int) else ctypes.c_char_p(a) if isinstance(a, bytes)
        else a for a in args
    ]  # fmt: skip
    ctypes.set_errno(0)
    result = int(_LIBC.syscall(ctypes.c_long(SYS[name]), *conv))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")
    return result


def in_child(fn: Callable[[], object]) -> object:
    """Run ``fn`` in a forked child (namespace and credential changes stay there); its return
    value or its OSError comes back through a pipe as JSON."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(read_end)
        try:
            result: JSON = {"ok": True, "value": fn()}
        except OSError as exc:
            result = {"ok": False, "errno": exc.errno, "text": str(exc)}
        except Refused as exc:
            result = {"ok": "refused", "text": str(exc)}
        except Exception as exc:
            result = {"ok": None, "text": repr(exc)}
        os.write(write_end, json.dumps(result, default=str).encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    os.waitpid(pid, 0)
    raw = b"".join(chunks)
    if not raw:
        raise Refused("child died without a result")
    result = json.loads(raw)
    if result["ok"] is True:
        return result["value"]
    if result["ok"] is False:
        raise OSError(result["errno"], result["text"])
    if result["ok"] == "refused":
        raise Refused(result["text"])
    raise RuntimeError(result["text"])
