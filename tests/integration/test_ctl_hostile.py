"""Every ironctl sub-command (read from its parser, so new ones are covered) with hostile
arguments against the real daemon, piped, with stdout closed early, and on a terminal: never a
traceback, always a documented exit code, JSON under --json, escapes shown, never sent.

The cases run inside the test's systemd from one driver (tests/integration/ctl_hostile_driver.py),
three at a time, to keep the file under a few minutes on a shared two-core machine.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from ironclawd.ctl import exitcodes
from tests.harness.ctl_commands import Command, commands

pytestmark = pytest.mark.usefixtures("daemon")

NOT_UTF8 = b"\xff\xfeabc"
SURROGATE = b"\xed\xa0\x80"  # a lone surrogate, UTF-8-encoded: not UTF-8 either
ESCAPES = b"\x1b[2J\x1b]0;pwned\x07\xe2\x80\xae"  # clear screen, set title, right-to-left
HOSTILE = [NOT_UTF8, SURROGATE, ESCAPES, b"A" * 10_240, b'{"persona": "\\ud800"}', b"-5", b""]
PER_COMMAND = 3  # hostile values per command, rotating, so that every value meets every mode
NEVER_SHOWN = (b"\x1b[2J", b"\x1b]0;", b"\xe2\x80\xae", b"Traceback", b"internal error in ironctl")
DOCUMENTED = set(range(14)) | {exitcodes.PIPE_CLOSED}
STDIN = b"\xff\xfe not UTF-8\n"
MODES = ("pipe", "closed", "pty")


@dataclass
class Case:
    argv: list[bytes]
    mode: str
    expect: int | None = None  # the exit code, when the input decides it
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def as_json(self) -> bool:
        return b"--json" in self.argv

    def expected(self) -> int | None:
        # A JSON error goes to stdout: with stdout closed, the closed pipe is what ends it.
        if self.expect is not None and self.as_json and self.mode == "closed":
            return exitcodes.PIPE_CLOSED
        return self.expect

    def describe(self) -> str:
        shown = [a[:40] + (b"..." if len(a) > 40 else b"") for a in self.argv]
        return f"ironctl {b' '.join(shown)!r} [{self.mode}]"


def cases() -> list[Case]:
    found: list[Case] = []
    for i, command in enumerate(commands()):
        found += _value_cases(i, command)
        found += _option_cases(i, command)
    found += [
        Case([b"send", b"abcdefgh", b"-", b"--json"], "pipe", exitcodes.INVALID),
        Case([b"send", b"abcdefgh", b"-"], "pty", exitcodes.INVALID),
        Case([b"chat", b"abcdefgh", b"--json"], "pipe", exitcodes.INVALID),
        *(Case([b"status", b"--socket", v], MODES[j % 3]) for j, v in enumerate(HOSTILE[2:5])),
    ]
    # Real output into a closed pipe (| head -c0): the closed pipe ends it, quietly.
    for argv in (b"status", b"session list", b"agent list", b"audit list --limit 5",
                 b"change list --json", b"agent show demo", b"--help",
                 b"session logs --help"):  # fmt: skip
        found.append(Case(argv.split(), "closed", exitcodes.PIPE_CLOSED))
    return found


def _value_cases(i: int, command: Command) -> list[Case]:
    found = []
    for j in range(i, i + PER_COMMAND):
        value = HOSTILE[j % len(HOSTILE)]
        argv = [w.encode() for w in command.words] + [value for _ in command.positionals]
        for option in command.valued:
            if option in ("--socket", "--timeout"):
                continue
            if option in command.required or j % 2 == 0:
                argv += [option.encode(), value]
        argv += [b"--timeout", b"5"] + ([b"--json"] if (j // 2) % 2 == 0 else [])
        not_text = value in (NOT_UTF8, SURROGATE) and len(argv) > len(command.words) + 3
        found.append(Case(argv, MODES[(i + j) % 3], exitcodes.USAGE if not_text else None))
    return found


def _option_cases(i: int, command: Command) -> list[Case]:
    words = [w.encode() for w in command.words]
    filler = [b"x" for _ in command.positionals] + [
        a for option in command.required for a in (option.encode(), b"x")
    ]
    timeouts = (b"inf", b"nan", b"-1", b"1e999", b"0", b"86401")
    json_flag = [b"--json"] if i % 2 else []
    found = [
        Case([*words, *filler, b"--timeout=" + timeouts[i % 6], *json_flag], MODES[i % 3],
             exitcodes.USAGE),
    ]  # fmt: skip
    for k, option in enumerate(command.numeric):
        for bad in (b"-5", b"1" + b"0" * 25, b"1e3"):
            found.append(Case([*words, *filler, option.encode(), bad], MODES[k % 3],
                              exitcodes.USAGE))  # fmt: skip
    return found


def run_all(daemon: Any, all_cases: list[Case]) -> None:
    doc = [{"argv": [a.hex() for a in c.argv], "stdin": STDIN.hex(), "mode": c.mode}
           for c in all_cases]  # fmt: skip
    workdir = str(daemon.workdir)
    proc = daemon.run(
        ["env", f"PYTHONPATH={workdir}", ".venv/bin/python",
         "tests/integration/ctl_hostile_driver.py", ".venv/bin/ironctl"],
        input=json.dumps(doc).encode(), timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    for case, result in zip(all_cases, json.loads(proc.stdout), strict=True):
        case.result = result


def problems(case: Case) -> list[str]:
    rc = case.result["rc"]
    out = base64.b64decode(case.result["out"])
    err = base64.b64decode(case.result["err"])
    found = []
    if rc not in DOCUMENTED:
        found.append(f"exit {rc} is not a documented exit code")
    if case.expected() is not None and rc != case.expected():
        found.append(f"exit {rc}, expected {case.expected()}")
    found += [f"printed {bad!r}" for bad in NEVER_SHOWN if bad in out + err]
    for name, data in (("stdout", out), ("stderr", err)):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            found.append(f"{name} is not UTF-8: {exc}")
    if case.as_json and case.mode == "pipe":
        found += _json_problems(rc, out)
    return [f"{case.describe()}: {p}; stderr {err[:300]!r}" for p in found]


def _json_problems(rc: int, out: bytes) -> list[str]:
    text = out.decode("utf-8", "replace").strip()
    try:
        docs = (
            [json.loads(text)]
            if text.startswith(("{", "[")) and "\n{" not in text
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    except json.JSONDecodeError as exc:
        return [f"--json output is not JSON ({exc}): {out[:300]!r}"]
    if rc in (0, 1, exitcodes.ESCAPED, exitcodes.INCONCLUSIVE):
        return []
    errors = [d.get("error") for d in docs if isinstance(d, dict)]
    if not any(isinstance(e, dict) and e.get("exit") == rc for e in errors):
        return [f"exit {rc} under --json without an error document saying so: {out[:300]!r}"]
    return []


def test_every_command_survives_hostile_arguments_piped_closed_and_on_a_pty(daemon: Any) -> None:
    all_cases = cases()
    run_all(daemon, all_cases)
    found = [p for case in all_cases for p in problems(case)]
    assert not found, f"{len(found)} of {len(all_cases)} cases went wrong:\n" + "\n".join(found)
    # The cases really covered every command in every mode (so none passed by not running).
    assert {c.mode for c in all_cases} == set(MODES)
    assert {tuple(c.argv[: len(cmd.words)]) for c in all_cases for cmd in commands()} >= {
        tuple(w.encode() for w in cmd.words) for cmd in commands()
    }
