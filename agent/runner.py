"""How the ``run`` tool runs one program that agent/programs.py has checked: a fixed environment,
resource limits set between fork and exec, a session of its own whose whole process group is
killed at the timeout (and any of it left behind afterwards), stdin fed and both output streams
read at once with a cap on what is kept, and the result as text for the model."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

OUTPUT_CAP = 64 * 1024  # per stream, in bytes kept and in characters returned
MEMORY_LIMIT = 256 * 1024 * 1024  # RLIMIT_AS
FILE_SIZE_LIMIT = 16 * 1024 * 1024  # RLIMIT_FSIZE: the largest file a program may write
OPEN_FILES_LIMIT = 64
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
