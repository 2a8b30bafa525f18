"""The ``run`` tool: execute a program from the agent's approved packages.

The host's image builder lists every program of the agent's package layers in
``/etc/ironclaw/programs.json`` (``{"programs": {"jq": "/usr/bin/jq"}}``), inside the read-only
image. Only a listed program can be named, by its key or by exactly its listed path; it is
executed by that absolute path with an argument list (never a shell, never a PATH search), in the
workspace, with a fixed environment and resource limits, as the leader of a session of its own
whose whole process group is killed at the timeout (agent/runner.py). Its exit status and
capped output come back as text for the model.

The box is the boundary (a read-only root, a noexec workspace, no shell and no interpreter in the
image, docs/threat-model.md); these checks refuse early, with a reason the model can read, what
the box refuses anyway, and bound what an approved program may cost.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from agent.runner import ProgramError, describe, execute

PROGRAMS_FILE = Path("/etc/ironclaw/programs.json")
WORKSPACE = Path("/workspace")
NO_PACKAGES = "error: this agent has no packages (ask for them with request_change)"

MAX_PROGRAMS_FILE = 1024 * 1024
MAX_ARGS = 64
MAX_ARG_CHARS = 4096
MAX_STDIN = 1024 * 1024
DEFAULT_TIMEOUT = 30
MAX_TIMEOUT = 120
LISTED_NAMES = 40  # how many available programs an error names
ARGUMENTS = frozenset({"program", "args", "stdin", "timeout_seconds"})


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
