"""The ``run`` tool: execute a program from the agent's approved packages.

The host's image builder lists every program of the agent's package layers in
``/etc/ironclaw/programs.json`` (``{"programs": {"jq": "/usr/bin/jq"}}``), inside the read-only
image. Only a listed program can be named, by its key or by exactly its listed path; it is
executed by that absolute path with an argument list (never a shell, never a PATH search), in the
workspace, with a fixed environment and resource limits, as the leader of a session of its own
whose whole process group is killed at the timeout. Its exit status and capped output come back
as text for the model.

The box is the boundary (a read-only root, a noexec workspace, no shell and no interpreter in the
image, docs/threat-model.md); these checks refuse early, with a reason the model can read, what
the box refuses anyway, and bound what an approved program may cost.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import selectors
import signal
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROGRAMS_FILE = Path("/etc/ironclaw/programs.json")
WORKSPACE = Path("/workspace")
NO_PACKAGES = "error: this agent has no packages (ask for them with request_change)"

MAX_PROGRAMS_FILE = 1024 * 1024
MAX_ARGS = 64
MAX_ARG_CHARS = 4096
MAX_STDIN = 1024 * 1024
DEFAULT_TIMEOUT = 30
MAX_TIMEOUT = 120
OUTPUT_CAP = 64 * 1024  # per stream, in bytes kept and in characters returned
MEMORY_LIMIT = 256 * 1024 * 1024  # RLIMIT_AS
FILE_SIZE_LIMIT = 16 * 1024 * 1024  # RLIMIT_FSIZE: the largest file a program may write
OPEN_FILES_LIMIT = 64
LISTED_NAMES = 40  # how many available programs an error names
ARGUMENTS = frozenset({"program", "args", "stdin", "timeout_seconds"})
# After a kill, how long the output pipes may stay open (held by a process that left the group).
DRAIN_AFTER_KILL = 1.0


class ProgramError(Exception):
    """The program cannot be run as asked; the message says why, for the model."""


@dataclass(frozen=True)
class Outcome:
    """How a program ended: ``returncode`` as subprocess reports it (negative: a signal)."""

    pid: int
    returncode: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_total: int
    stderr_total: int


def load_programs(path: Path = PROGRAMS_FILE) -> dict[str, str] | None:
    """The image's program list, or None when the image has none (an agent without packages)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink, which the image builder never writes
        raise ProgramError(f"{path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProgramError(f"{path}: not a regular file")
        data = os.read(fd, MAX_PROGRAMS_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_PROGRAMS_FILE:
        raise ProgramError(f"{path}: larger than {MAX_PROGRAMS_FILE} bytes")
    try:
        programs = json.loads(data)["programs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProgramError(f'{path}: malformed (expected {{"programs": {{...}}}})') from exc
    if not isinstance(programs, dict) or not all(
        isinstance(name, str) and name and isinstance(where, str) and _is_clean_path(where)
        for name, where in programs.items()
    ):
        raise ProgramError(f"{path}: malformed (expected names mapped to absolute paths)")
    return programs


def _is_clean_path(path: str) -> bool:
    return path.startswith("/") and "\0" not in path and os.path.normpath(path) == path


def _available(programs: dict[str, str]) -> str:
    names = sorted(programs)
    shown = ", ".join(names[:LISTED_NAMES])
    more = len(names) - LISTED_NAMES
    return f"{shown} and {more} more" if more > 0 else shown or "none"


def resolve(program: object, programs: dict[str, str]) -> str:
    """The absolute path of ``program`` (a listed name, or exactly a listed path), checked."""
    if not isinstance(program, str) or not program:
        raise ProgramError(
            f"program: expected the name of an approved program ({_available(programs)})"
        )
    if program in programs:
        path = programs[program]
    elif program in programs.values():
        path = program
    else:
        raise ProgramError(
            f"program {program!r}: not from an approved package; only these can be run: "
            f"{_available(programs)}"
        )
    check_executable(path)
    return path


def check_executable(path: str) -> None:
    """``path`` is a regular file (not a symlink), owned by root, writable by nobody else (the
    agent is never root), not setuid/setgid, and executable by this process."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ProgramError(f"program {path}: listed but not usable: {exc.strerror}") from None
    mode = info.st_mode
    if not stat.S_ISREG(mode):
        raise ProgramError(f"program {path}: not a regular file")
    if info.st_uid != 0:
        raise ProgramError(f"program {path}: owned by uid {info.st_uid}, not root")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ProgramError(f"program {path}: writable by group or others ({stat.S_IMODE(mode):o})")
    if mode & (stat.S_ISUID | stat.S_ISGID):
        raise ProgramError(f"program {path}: setuid/setgid ({stat.S_IMODE(mode):o})")
    if not os.access(path, os.X_OK):
        raise ProgramError(f"program {path}: not executable")


def check_args(raw: object) -> list[str]:
    """The argument list: strings only (no shell parses them), bounded, no NUL."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ProgramError(
            "args: expected a list of strings (an argument list, not a command line)"
        )
    if len(raw) > MAX_ARGS:
        raise ProgramError(f"args: at most {MAX_ARGS} arguments, got {len(raw)}")
    for index, arg in enumerate(raw):
        if not isinstance(arg, str):
            raise ProgramError(f"args[{index}]: expected a string, got {type(arg).__name__}")
        if len(arg) > MAX_ARG_CHARS:
            raise ProgramError(f"args[{index}]: longer than {MAX_ARG_CHARS} characters")
        if "\0" in arg:
            raise ProgramError(f"args[{index}]: contains NUL")
        _encode(arg, f"args[{index}]")
    return list(raw)


def _encode(text: str, where: str) -> bytes:
    # surrogateescape: a JSON "\udcff" passes the byte 0xff through, as os.fsencode does.
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ProgramError(f"{where}: not encodable as UTF-8 (a lone surrogate)") from None


def check_stdin(raw: object) -> bytes:
    if raw is None:
        return b""
    if not isinstance(raw, str):
        raise ProgramError("stdin: expected a string")
    data = _encode(raw, "stdin")
    if len(data) > MAX_STDIN:
        raise ProgramError(f"stdin: larger than {MAX_STDIN} bytes")
    return data


def check_timeout(raw: object) -> int:
    if raw is None:
        return DEFAULT_TIMEOUT
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_TIMEOUT:
        raise ProgramError(f"timeout_seconds: expected an integer from 1 to {MAX_TIMEOUT}")
    return raw


def run(
    args: dict[str, object], programs_file: Path = PROGRAMS_FILE, workspace: Path = WORKSPACE
) -> str:
    """The ``run`` tool: check the call, run the program, describe how it ended."""
    programs = load_programs(programs_file)
    if programs is None:
        return NO_PACKAGES
    unexpected = sorted(set(args) - ARGUMENTS)
    if unexpected:
        raise ProgramError(
            f"unexpected argument {unexpected[0]!r} (expected {', '.join(sorted(ARGUMENTS))})"
        )
    path = resolve(args.get("program"), programs)
    argv = [path, *check_args(args.get("args"))]
    data = check_stdin(args.get("stdin"))
    timeout = check_timeout(args.get("timeout_seconds"))
    return describe(execute(argv, data, timeout, workspace), timeout)


def environment(workspace: Path) -> dict[str, str]:
    """The program's whole environment: nothing of the agent's own."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(workspace), "LANG": "C.UTF-8",
            "TMPDIR": str(workspace)}  # fmt: skip


def _set_limit(which: int, soft: int, hard: int) -> None:
    # Never ask for more than the agent itself may have: raising a hard limit fails.
    _, current = resource.getrlimit(which)
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(which, (soft, hard))


def _limits(timeout: int) -> None:
    """Runs in the child between fork and exec: only setrlimit calls on already imported
    modules, so it takes no lock another thread of the agent (gRPC's) could hold."""
    _set_limit(resource.RLIMIT_AS, MEMORY_LIMIT, MEMORY_LIMIT)
    # SIGXCPU at the timeout, SIGKILL a second later: a program with many threads burns CPU
    # time faster than the wall clock runs.
    _set_limit(resource.RLIMIT_CPU, timeout, timeout + 1)
    _set_limit(resource.RLIMIT_CORE, 0, 0)
    _set_limit(resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT, OPEN_FILES_LIMIT)
    _set_limit(resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT, FILE_SIZE_LIMIT)


def _spawn(
    argv: Sequence[str], piped_stdin: bool, timeout: int, workspace: Path
) -> subprocess.Popen[bytes]:
    path = argv[0]
    try:
        # An absolute path from the image's list, an argument list, no shell.
        return subprocess.Popen(
            argv,
            executable=path,
            stdin=subprocess.PIPE if piped_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workspace,
            env=environment(workspace),
            close_fds=True,
            start_new_session=True,
            preexec_fn=lambda: _limits(timeout),  # noqa: PLW1509 -- see _limits
        )
    except OSError as exc:
        if exc.filename is not None and str(exc.filename) == str(workspace):
            raise ProgramError(
                f"running {path}: the workspace {workspace}: {exc.strerror}"
            ) from None
        if exc.errno == errno.EACCES:
            why = (
                "permission denied (only approved packages' programs run; the workspace is noexec)"
            )
        elif exc.errno == errno.ENOENT:
            why = "not found (the program, its ELF interpreter or a library is missing)"
        else:
            why = exc.strerror or str(exc)
        raise ProgramError(f"program {path}: cannot be executed: {why}") from None
    except subprocess.SubprocessError as exc:  # preexec_fn failed: no program ran
        raise ProgramError(f"program {path}: cannot set its limits: {exc}") from None


class _Capture:
    """The first OUTPUT_CAP bytes of a stream; the rest is counted and dropped."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = OUTPUT_CAP - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]


def execute(argv: Sequence[str], data: bytes, timeout: int, workspace: Path) -> Outcome:
    """Run ``argv`` (checked by the caller) and collect its output until it exits or the
    timeout ends it; whatever is left of its process group is killed either way."""
    proc = _spawn(argv, bool(data), timeout, workspace)
    if proc.stdout is None or proc.stderr is None:  # never: both are pipes
        raise ProgramError(f"program {argv[0]}: its output is not piped")
    out, err = _Capture(), _Capture()
    captures: dict[object, _Capture] = {proc.stdout: out, proc.stderr: err}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        selector.register(proc.stderr, selectors.EVENT_READ)
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            selector.register(proc.stdin, selectors.EVENT_WRITE)
        try:
            finished = _pump(selector, captures, data, deadline) and _exited(proc.pid, deadline)
            if not finished:
                _kill_group(proc.pid)
                _pump(selector, captures, b"", time.monotonic() + DRAIN_AFTER_KILL)
        finally:
            _kill_group(proc.pid)  # what the program left behind, or all of it on an error
            for key in list(selector.get_map().values()):
                selector.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
            returncode = proc.wait()
    return Outcome(proc.pid, returncode, not finished, bytes(out.kept), bytes(err.kept),
                   out.total, err.total)  # fmt: skip


def _kill_group(pid: int) -> None:
    # Only before the leader is reaped: until then its pid, the group's id, cannot be reused.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _pump(
    selector: selectors.BaseSelector, captures: dict[object, _Capture], data: bytes,
    deadline: float,
) -> bool:  # fmt: skip
    """Feed stdin and read stdout and stderr, all at once (a program blocked writing one stream
    while this side waits on the other would never finish), until every pipe is closed. False if
    the deadline came first."""
    offset = 0
    view = memoryview(data)
    while selector.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        for key, _events in selector.select(remaining):
            stream = key.fileobj
            if stream in captures:
                chunk = os.read(key.fd, 65536)
                if chunk:
                    captures[stream].add(chunk)
                    continue
            else:
                try:
                    offset += os.write(key.fd, view[offset : offset + 65536])
                except BlockingIOError:
                    continue
                except BrokenPipeError:  # the program stopped reading: not an error
                    offset = len(data)
                if offset < len(data):
                    continue
            selector.unregister(stream)
            stream.close()  # type: ignore[union-attr]
    return True


def _exited(pid: int, deadline: float) -> bool:
    """Wait, without reaping, until ``pid`` has exited (True) or the deadline passed (False).
    Its pipes are closed by now, so this is normally immediate."""
    delay = 0.001
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)


def _text(kept: bytes, total: int) -> tuple[str, bool]:
    text = kept.decode("utf-8", "backslashreplace")
    # Escapes can make 64 KiB of bytes four times as many characters: cap those too, so both
    # streams together stay well under what the model proxy accepts for one message.
    return text[:OUTPUT_CAP], total > len(kept) or len(text) > OUTPUT_CAP


def _block(name: str, kept: bytes, total: int) -> str:
    text, truncated = _text(kept, total)
    header = f"--- {name} (truncated: {total} bytes in all) ---" if truncated else f"--- {name} ---"
    if text and not text.endswith("\n"):
        text += "\n"
    return f"{header}\n{text}"


def status_line(outcome: Outcome, timeout: int) -> str:
    if outcome.timed_out:
        return f"timed out after {timeout} s"
    if outcome.returncode < 0:
        number = -outcome.returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {number} ({name})"
    return f"exit code {outcome.returncode}"


def describe(outcome: Outcome, timeout: int) -> str:
    """The tool's result: how the program ended, then its stdout, then its stderr."""
    return (
        f"{status_line(outcome, timeout)}\n"
        + _block("stdout", outcome.stdout, outcome.stdout_total)
        + _block("stderr", outcome.stderr, outcome.stderr_total)
    )
