"""The agent's ``run`` tool refuses, before anything is executed, every program that is not listed
in the image's programs.json (by name or exact path) or not a root-owned, read-only executable,
and every malformed call; and it describes how a program ended in a fixed format. Running real
programs (limits, timeout, output caps) is tests/integration/test_run_programs.py: this tier starts
no process, so every refusal here is also proof that nothing was started."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

import pytest

from agent import programs, runner
from agent.main import wait_for_key
from agent.runner import OUTPUT_CAP, Outcome, ProgramError, describe
from agent.tools import TOOLS, run, run_tool
from ironclawd.domain.tools import CATALOG

TRUE = "/usr/bin/true"
HEAD = "/usr/bin/head"


def listing(tmp_path: Path, entries: dict[str, str]) -> Path:
    path = tmp_path / "programs.json"
    path.write_text(json.dumps({"programs": entries}))
    return path


@pytest.fixture
def image(tmp_path: Path) -> Path:
    return listing(tmp_path, {"true": TRUE, "head": HEAD})


def refused(image: Path, workspace: Path, args: dict[str, object]) -> str:
    result = run_tool_with(image, workspace, args)
    assert result.startswith("error: "), result
    return result


def run_tool_with(image: Path, workspace: Path, args: dict[str, object]) -> str:
    try:
        return run(args, programs_file=image, root=workspace)
    except Exception as exc:
        return f"error: {exc}"


def test_the_tool_is_in_the_catalog_and_the_agent_has_it() -> None:
    assert "run" in TOOLS
    schema = json.loads(CATALOG["run"].parameters_json)
    assert schema["required"] == ["program"]
    assert schema["properties"]["args"] == {"type": "array", "items": {"type": "string"}}
    assert schema["additionalProperties"] is False


def test_no_programs_file_means_no_packages(tmp_path: Path) -> None:
    assert run({"program": "jq"}, programs_file=tmp_path / "absent", root=tmp_path) == (
        "error: this agent has no packages (ask for them with request_change)"
    )
    assert str(programs.PROGRAMS_FILE) == "/etc/ironclaw/programs.json"


def test_refusals_reach_the_model_as_text(
    image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(TOOLS, "run", partial(run, programs_file=image, root=tmp_path))
    assert run_tool("run", '{"program": "/app/agent/agent", "args": ["-h"]}') == (
        "error: program '/app/agent/agent': not from an approved package; only these can be "
        "run: head, true"
    )


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        '{"other": {}}',
        '{"programs": []}',
        '{"programs": {"jq": "usr/bin/jq"}}',  # relative
        '{"programs": {"jq": "/usr/bin/../bin/jq"}}',  # not normalised
        '{"programs": {"jq": 1}}',
        '{"programs": {"": "/usr/bin/jq"}}',
    ],
)
def test_a_malformed_programs_file_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "programs.json"
    path.write_text(content)
    with pytest.raises(ProgramError, match="malformed"):
        programs.load_programs(path)


def test_a_programs_file_that_is_a_symlink_or_too_large_is_refused(tmp_path: Path) -> None:
    real = listing(tmp_path, {"true": TRUE})
    os.symlink(real, tmp_path / "link.json")
    with pytest.raises(ProgramError, match=r"link\.json: Too many levels of symbolic links"):
        programs.load_programs(tmp_path / "link.json")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (programs.MAX_PROGRAMS_FILE + 1))
    with pytest.raises(ProgramError, match="larger than"):
        programs.load_programs(big)


@pytest.mark.parametrize(
    "program",
    [
        "jq",  # not listed
        "/usr/bin/jq",
        "/app/agent/agent",  # the agent itself
        "/usr/bin/../bin/true",  # a listed path, spelt differently
        "/usr/bin//true",
        "usr/bin/true",
        "./true",
        "TRUE",
        "tool",  # a file the agent wrote in its workspace
        "/workspace/tool",
        "",
    ],
)
def test_only_a_listed_name_or_exactly_a_listed_path_is_accepted(
    image: Path, tmp_path: Path, program: str
) -> None:
    tool = tmp_path / "tool"
    tool.write_bytes(Path(TRUE).read_bytes())
    tool.chmod(0o755)
    result = refused(image, tmp_path, {"program": program})
    assert "only these can be run: head, true" in result or "expected the name" in result


@pytest.mark.parametrize("program", [None, 1, ["true"], {"true": 1}])
def test_program_must_be_a_string(image: Path, tmp_path: Path, program: object) -> None:
    assert "program: expected the name of an approved program (head, true)" in refused(
        image, tmp_path, {"program": program}
    )


def test_the_error_names_at_most_forty_programs(tmp_path: Path) -> None:
    image = listing(tmp_path, {f"p{i:03}": TRUE for i in range(100)})
    result = refused(image, tmp_path, {"program": "nope"})
    assert "p000, p001" in result
    assert result.endswith("p039 and 60 more")


def _listed(tmp_path: Path, name: str, mode: int) -> Path:
    path = tmp_path / name
    path.write_bytes(Path(TRUE).read_bytes())
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        (0o775, "writable by group or others (775)"),
        (0o757, "writable by group or others (757)"),
        (0o644, "not executable"),
        (0o4755, "setuid/setgid (4755)"),
        (0o2755, "setuid/setgid (2755)"),
    ],
)
def test_a_listed_file_must_be_a_read_only_executable(
    tmp_path: Path, mode: int, reason: str
) -> None:
    if os.geteuid() != 0:  # the runner's own file fails the owner check first
        reason = f"owned by uid {os.geteuid()}, not root"
    path = _listed(tmp_path, "prog", mode)
    image = listing(tmp_path, {"prog": str(path)})
    assert f"program {path}: {reason}" in refused(image, tmp_path, {"program": "prog"})


def test_a_listed_symlink_directory_or_missing_file_is_refused(tmp_path: Path) -> None:
    os.symlink(TRUE, tmp_path / "link")
    (tmp_path / "dir").mkdir()
    image = listing(
        tmp_path,
        {"link": str(tmp_path / "link"), "dir": str(tmp_path / "dir"),
         "gone": str(tmp_path / "gone")},
    )  # fmt: skip
    assert "link: not a regular file" in refused(image, tmp_path, {"program": "link"})
    assert "dir: not a regular file" in refused(image, tmp_path, {"program": "dir"})
    assert "gone: listed but not usable: No such file or directory" in refused(
        image, tmp_path, {"program": "gone"}
    )


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ("-n 1 file", "args: expected a list of strings (an argument list, not a command line)"),
        ({"a": "b"}, "args: expected a list of strings (an argument list, not a command line)"),
        ([1], "args[0]: expected a string, got int"),
        (["ok", None], "args[1]: expected a string, got NoneType"),
        (["x"] * 65, "args: at most 64 arguments, got 65"),
        (["x" * 4097], "args[0]: longer than 4096 characters"),
        (["a\0b"], "args[0]: contains NUL"),
        (["\ud800"], "args[0]: not encodable as UTF-8 (a lone surrogate)"),
    ],
)
def test_arguments_are_a_bounded_list_of_strings(
    image: Path, tmp_path: Path, args: object, reason: str
) -> None:
    assert refused(image, tmp_path, {"program": "true", "args": args}) == f"error: {reason}"


def test_argument_bounds_are_inclusive() -> None:
    assert programs.check_args(["x" * 4096] * 64) == ["x" * 4096] * 64
    assert programs.check_args(None) == []
    assert programs.check_args(["\udcff"]) == ["\udcff"]  # the byte 0xff, as fsencode passes it


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("stdin", 5, "stdin: expected a string"),
        ("stdin", "x" * (1024 * 1024 + 1), "stdin: larger than 1048576 bytes"),
        ("stdin", "\ud800", "stdin: not encodable as UTF-8 (a lone surrogate)"),
        ("timeout_seconds", 0, "timeout_seconds: expected an integer from 1 to 120"),
        ("timeout_seconds", 121, "timeout_seconds: expected an integer from 1 to 120"),
        ("timeout_seconds", True, "timeout_seconds: expected an integer from 1 to 120"),
        ("timeout_seconds", 2.5, "timeout_seconds: expected an integer from 1 to 120"),
        ("timeout_seconds", "30", "timeout_seconds: expected an integer from 1 to 120"),
        ("shell", True, "unexpected argument 'shell'"),
    ],
)
def test_stdin_timeout_and_unknown_arguments_are_checked(
    image: Path, tmp_path: Path, field: str, value: object, reason: str
) -> None:
    result = refused(image, tmp_path, {"program": "true", field: value})
    assert result.startswith(f"error: {reason}"), result


def test_stdin_and_timeout_defaults() -> None:
    assert programs.check_stdin(None) == b""
    assert programs.check_stdin("é") == "é".encode()
    assert len(programs.check_stdin("x" * 1024 * 1024)) == 1024 * 1024
    assert programs.check_timeout(None) == 30
    assert programs.check_timeout(120) == 120
    assert programs.check_timeout(1) == 1


def test_the_environment_is_fixed(tmp_path: Path) -> None:
    assert runner.environment(tmp_path) == {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "TMPDIR": str(tmp_path),
    }


def outcome(returncode: int = 0, out: bytes = b"", err: bytes = b"", **kw: object) -> Outcome:
    fields: dict[str, object] = {
        "pid": 1, "returncode": returncode, "timed_out": False, "stdout": out, "stderr": err,
        "stdout_total": len(out), "stderr_total": len(err),
    }  # fmt: skip
    fields.update(kw)
    return Outcome(**fields)  # type: ignore[arg-type]


def test_the_result_format() -> None:
    assert describe(outcome(0, b"3\n"), 30) == "exit code 0\n--- stdout ---\n3\n--- stderr ---\n"
    assert describe(outcome(2, b"", b"jq: error"), 30) == (
        "exit code 2\n--- stdout ---\n--- stderr ---\njq: error\n"
    )
    assert describe(outcome(-9), 30).startswith("killed by signal 9 (SIGKILL)\n")
    assert describe(outcome(-25), 30).startswith("killed by signal 25 (SIGXFSZ)\n")
    assert describe(outcome(-9, b"partial", timed_out=True), 5) == (
        "timed out after 5 s\n--- stdout ---\npartial\n--- stderr ---\n"
    )


def test_output_that_is_not_utf8_is_escaped_and_capped_in_characters_too() -> None:
    assert describe(outcome(0, b"a\xffb\n"), 30).split("\n")[2] == "a\\xffb"
    binary = b"\xff" * OUTPUT_CAP  # 64 KiB of bytes, four times as many characters escaped
    text = describe(outcome(0, binary, stdout_total=OUTPUT_CAP), 30)
    assert "--- stdout (truncated: 65536 bytes in all) ---\n" in text
    assert len(text) < 2 * OUTPUT_CAP
    big = describe(outcome(0, b"x" * OUTPUT_CAP, stdout_total=10**6), 30)
    assert big.startswith("exit code 0\n--- stdout (truncated: 1000000 bytes in all) ---\n")


def test_a_pooled_agent_waits_until_its_key_file_holds_a_whole_key(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"")
    polls: list[float] = []

    def claim_on_the_second_poll(seconds: float) -> None:
        polls.append(seconds)
        key.write_bytes(b"ab" * (16 if len(polls) == 1 else 32))  # half a key, then a whole one

    wait_for_key(key, poll=0.02, sleep=claim_on_the_second_poll)
    assert polls == [0.02, 0.02]
