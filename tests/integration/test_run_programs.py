"""The agent's ``run`` tool with real programs (the host's coreutils, findutils and util-linux,
listed in a temporary programs.json the way the image builder lists a package's programs): exit
codes and signals are reported, stdin, environment, working directory and file descriptors are
what agent/runner.py promises, the limits are set and bite (memory, file size), a timeout kills
the whole process group, and a program flooding both output streams neither deadlocks the agent
nor floods the model. The same code in the box: the lead's end-to-end packages test (jq).

Needs root only to hand a listed file to another owner; nothing here boots systemd."""

from __future__ import annotations

import json
import operator
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import runner
from agent.tools import ToolError, run
from tests.harness.polling import wait_for

pytestmark = pytest.mark.integration

BIN = {
    name: f"/usr/bin/{name}"
    for name in ("true", "false", "cat", "head", "yes", "printenv", "pwd", "readlink", "xargs",
                 "dd", "prlimit")
}  # fmt: skip
INTERPRETER = b"/lib64/ld-linux-x86-64.so.2"
RESULT = re.compile(
    r"(?P<status>[^\n]+)\n--- stdout(?: \(truncated: \d+ bytes in all\))? ---\n(?P<stdout>.*?)"
    r"--- stderr(?: \(truncated: \d+ bytes in all\))? ---\n(?P<stderr>.*)",
    re.DOTALL,
)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "programs.json"
    path.write_text(json.dumps({"programs": BIN}))
    return path


def call(image: Path, workspace: Path, program: str, *args: str, **extra: object) -> str:
    return run({"program": program, "args": list(args), **extra}, image, workspace)


def blocks(result: str) -> tuple[str, str, str]:
    """(status line, stdout, stderr) of a result, its format checked."""
    match = RESULT.fullmatch(result)
    assert match, result[:300]
    return match["status"], match["stdout"], match["stderr"]


def test_exit_codes_are_reported(image: Path, workspace: Path) -> None:
    assert call(image, workspace, "true") == "exit code 0\n--- stdout ---\n--- stderr ---\n"
    assert call(image, workspace, "/usr/bin/false") == (
        "exit code 1\n--- stdout ---\n--- stderr ---\n"
    )
    result = call(image, workspace, "cat", "missing.json")
    assert result == (
        "exit code 1\n--- stdout ---\n--- stderr ---\n"
        "/usr/bin/cat: missing.json: No such file or directory\n"
    )


def test_stdin_is_the_argument_or_nothing(image: Path, workspace: Path) -> None:
    (workspace / "in.json").write_text('{"a": 1}\n')
    assert blocks(call(image, workspace, "cat", "in.json"))[1] == '{"a": 1}\n'
    assert blocks(call(image, workspace, "cat", stdin="from the model\n"))[1] == "from the model\n"
    # No stdin: /dev/null, so cat ends at once instead of waiting on the agent's own stdin.
    assert call(image, workspace, "cat", timeout_seconds=5) == (
        "exit code 0\n--- stdout ---\n--- stderr ---\n"
    )
    # 1 MiB offered, 5 bytes read: the program's exit ends the feeding, not an error.
    big = call(image, workspace, "head", "-c", "5", stdin="y" * (1024 * 1024))
    assert big == "exit code 0\n--- stdout ---\nyyyyy\n--- stderr ---\n"


def test_environment_directory_and_descriptors(image: Path, workspace: Path) -> None:
    assert sorted(blocks(call(image, workspace, "printenv"))[1].splitlines()) == [
        "HOME=" + str(workspace), "LANG=C.UTF-8", "PATH=/usr/bin:/bin", "TMPDIR=" + str(workspace)
    ]  # fmt: skip
    assert blocks(call(image, workspace, "pwd"))[1] == f"{workspace}\n"
    # An inheritable descriptor of the agent's, below the child's RLIMIT_NOFILE: not passed on.
    # (readlink, not ls: coreutils' ls fails inside gVisor, which lacks statx.)
    leak = os.dup2(os.open("/dev/null", os.O_RDONLY), 50, inheritable=True)
    try:
        assert blocks(call(image, workspace, "readlink", "/proc/self/fd/0"))[:2] == (
            "exit code 0",
            "/dev/null\n",
        )
        assert blocks(call(image, workspace, "readlink", "/proc/self/fd/50"))[:2] == (
            "exit code 1",
            "",
        )
    finally:
        os.close(leak)


def test_the_limits_are_set(image: Path, workspace: Path) -> None:
    shown = blocks(call(image, workspace, "prlimit", "--raw", "--noheadings",
                        "--output", "RESOURCE,SOFT,HARD", timeout_seconds=7))[1]  # fmt: skip
    limits = {line.split()[0]: tuple(line.split()[1:]) for line in shown.splitlines()}
    assert limits["AS"] == (str(256 * 2**20),) * 2
    assert limits["CPU"] == ("7", "8")
    assert limits["CORE"] == ("0", "0")
    assert limits["NOFILE"] == ("64", "64")
    assert limits["FSIZE"] == (str(16 * 2**20),) * 2


def test_memory_beyond_the_cap_fails_and_below_it_works(image: Path, workspace: Path) -> None:
    # dd allocates its whole block at once: 300 MiB is over RLIMIT_AS, 64 MiB is not.
    status, _, err = blocks(
        call(image, workspace, "dd", "bs=300M", "count=1", "if=/dev/zero", "of=/dev/null")
    )
    assert status == "exit code 1"
    assert "memory exhausted" in err
    assert (
        blocks(call(image, workspace, "dd", "bs=64M", "count=1", "if=/dev/zero", "of=/dev/null"))[0]
        == "exit code 0"
    )


def test_a_file_larger_than_the_cap_cannot_be_written(image: Path, workspace: Path) -> None:
    result = call(image, workspace, "dd", "if=/dev/zero", "of=big", "bs=1M", "count=17")
    assert result.startswith("killed by signal 25 (SIGXFSZ)\n")
    assert (workspace / "big").stat().st_size == runner.FILE_SIZE_LIMIT


def _processes() -> Iterator[tuple[int, list[bytes], str, int]]:
    """(pid, argv, state, process group) of every process visible now."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")[:-1]
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        yield int(entry.name), argv, fields[0], int(fields[2])


def test_a_timeout_kills_the_whole_process_group(image: Path, workspace: Path) -> None:
    # xargs forks sleep: a grandchild, in the program's process group, holding its pipes.
    marker = f"60.{time.time_ns() % 10**9:09d}"  # unique, and short-lived if left behind
    seen: list[tuple[int, int]] = []

    def watch() -> None:
        while not seen:
            seen.extend((pid, group) for pid, argv, _state, group in _processes()
                        if argv == [b"/usr/bin/sleep", marker.encode()])  # fmt: skip
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    result = call(image, workspace, "xargs", "/usr/bin/sleep", stdin=marker, timeout_seconds=2)
    elapsed = time.monotonic() - started
    watcher.join(timeout=5)
    assert result == "timed out after 2 s\n--- stdout ---\n--- stderr ---\n"
    assert 2 <= elapsed < 2 + runner.DRAIN_AFTER_KILL, elapsed  # killed, not drained to the end
    assert len(seen) == 1, "sleep never ran: the test would prove nothing"
    sleeper, group = seen[0]
    assert group != sleeper  # it was not a group leader of its own: xargs's group

    def alive() -> list[tuple[int, str]]:
        return [(pid, state) for pid, _argv, state, pgid in _processes()
                if pgid == group and state != "Z"]  # fmt: skip

    # Dead (a zombie until reaped). SIGKILL is sent by then, but a process can still show
    # "R" for a moment while it exits (seen in CI), so allow it a bounded moment.
    wait_for("the timed-out process group dead", alive, operator.not_, 5)


def test_a_flood_on_both_streams_neither_deadlocks_nor_floods_the_model(
    image: Path, workspace: Path
) -> None:
    # cat writes ~250 KiB of errors on stderr, then 1 MiB on stdout: an agent reading one pipe
    # at a time would block on a full stderr pipe while cat blocks on it in turn.
    (workspace / "big").write_bytes(b"0123456789abcde\n" * 65536)
    names = ["x" * 4000] * 63
    started = time.monotonic()
    result = call(image, workspace, "cat", *names, "big", timeout_seconds=30)
    assert time.monotonic() - started < 15
    status, stdout, stderr = blocks(result)
    assert status == "exit code 1"
    assert "--- stdout (truncated: 1048576 bytes in all) ---\n" in result
    assert stdout == "0123456789abcde\n" * 4096  # the first 64 KiB
    assert "--- stderr (truncated: " in result
    assert len(stderr) == runner.OUTPUT_CAP + 1  # plus the newline the format adds
    assert stderr.startswith("/usr/bin/cat: xxxx")


def test_endless_output_until_the_timeout(image: Path, workspace: Path) -> None:
    result = call(image, workspace, "yes", timeout_seconds=1)
    assert result.startswith("timed out after 1 s\n--- stdout (truncated: ")
    assert len(result) < runner.OUTPUT_CAP + 200


def _broken_copy(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    path.chmod(0o755)
    return str(path)


def test_a_program_that_cannot_be_executed_says_why(tmp_path: Path, workspace: Path) -> None:
    elf = Path(BIN["true"]).read_bytes()
    assert elf.count(INTERPRETER) == 1
    no_loader = _broken_copy(
        tmp_path, "noloader", elf.replace(INTERPRETER, b"/lib64/ld-gone-x86-64.so.2")
    )
    garbage = _broken_copy(tmp_path, "garbage", b"\x7fELF but not really")
    image = tmp_path / "broken.json"
    image.write_text(json.dumps({"programs": {"noloader": no_loader, "garbage": garbage}}))
    with pytest.raises(ToolError) as caught:
        call(image, workspace, "noloader")
    assert str(caught.value) == (
        f"program {no_loader}: cannot be executed: not found (the program, its ELF interpreter "
        "or a library is missing)"
    )
    with pytest.raises(ToolError, match="garbage: cannot be executed: Exec format error"):
        call(image, workspace, "garbage")


def test_a_listed_file_the_agent_owns_is_refused(tmp_path: Path, workspace: Path) -> None:
    # What a file the agent wrote would look like in the box: owned by its uid, 10000.
    mine = workspace / "tool"
    shutil.copy(BIN["true"], mine)
    os.chown(mine, 10000, 10000)
    image = tmp_path / "mine.json"
    image.write_text(json.dumps({"programs": {"tool": str(mine)}}))
    with pytest.raises(ToolError, match="tool: owned by uid 10000, not root"):
        call(image, workspace, "tool")
