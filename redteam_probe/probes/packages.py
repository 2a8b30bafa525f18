"""Attacks from a session whose image holds approved packages (jq): change the layer or the list
of runnable programs, make the layer setuid, run a copy of a granted program from the writable
places (/workspace, /tmp: noexec), and look for a shell or an interpreter anywhere in the image.
Options: ``program`` (a granted program's path, default ``/usr/bin/jq``).
``packages.layer.run`` is a look, not an attack: the granted program itself does run."""

from __future__ import annotations

import contextlib
import os
import re
import shutil

from redteam_probe.probes.base import Attack, Opts, Refused

PROGRAMS = "/etc/ironclaw/programs.json"
# As tests/integration/test_rootfs.py names them.
SHELL_NAME = re.compile(r"[a-z]*sh(\d[\d.]*)?|busybox|toybox")
INTERPRETER_NAME = re.compile(
    r"(python|pypy|perl|ruby|node|nodejs|deno|bun|lua|luajit|php|tclsh|wish|java|"
    r"awk|gawk|mawk|nawk|sed|env|expect)[\d.]*m?"
)
SKIP = ("/proc", "/sys", "/dev", "/queue", "/run", "/workspace", "/tmp", "/skills", "/mnt")


def _program(opts: Opts) -> str:
    return opts.get("program", "/usr/bin/jq")


def _spawn(path: str) -> int:
    quiet = [(os.POSIX_SPAWN_OPEN, n, os.devnull, os.O_WRONLY, 0) for n in (1, 2)]
    pid = os.posix_spawn(path, [path, "--version"], {}, file_actions=quiet)
    return os.waitpid(pid, 0)[1]


def overwrite_layer(opts: Opts) -> str:
    fd = os.open(_program(opts), os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.write(fd, b"\x7fELF")
    finally:
        os.close(fd)
    return f"wrote {_program(opts)}"


def setuid_layer(opts: Opts) -> str:
    os.chmod(_program(opts), 0o4755)  # noqa: S103 - the attack
    return f"made {_program(opts)} setuid"


def replace_programs(_opts: Opts) -> str:
    fd = os.open(PROGRAMS, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        os.write(fd, b'{"programs": {"agent": "/app/agent/agent"}}')
    finally:
        os.close(fd)
    return f"rewrote {PROGRAMS}"


def _run_copy(opts: Opts, directory: str) -> str:
    copy = f"{directory}/copied-program"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(copy)
    shutil.copyfile(_program(opts), copy)
    os.chmod(copy, 0o755)  # noqa: S103 - the attack
    try:
        status = _spawn(copy)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(copy)
    return f"ran a copy of {_program(opts)} from {directory} (status {status})"


def run_from_workspace(opts: Opts) -> str:
    return _run_copy(opts, "/workspace")


def run_from_tmp(opts: Opts) -> str:
    return _run_copy(opts, "/tmp")


def shell_search(_opts: Opts) -> str:
    found = []
    for directory, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(directory, d) not in SKIP]
        for name in files:
            if SHELL_NAME.fullmatch(name) or INTERPRETER_NAME.fullmatch(name):
                found.append(os.path.join(directory, name))
    if not found:
        raise Refused("no shell or interpreter by name anywhere in the image")
    return "found: " + ", ".join(sorted(found))


def run_layer(opts: Opts) -> str:
    status = _spawn(_program(opts))
    return f"{_program(opts)} --version: status {status}"


ATTACKS: dict[str, Attack] = {
    "packages.layer.overwrite": overwrite_layer,
    "packages.layer.setuid": setuid_layer,
    "packages.programs.overwrite": replace_programs,
    "packages.workspace.run-copy": run_from_workspace,
    "packages.tmp.run-copy": run_from_tmp,
    "packages.image.shell-search": shell_search,
    "packages.layer.run": run_layer,
}
