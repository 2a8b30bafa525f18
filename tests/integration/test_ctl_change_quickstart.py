"""The commands of IronClaw's published quickstart, as written, against the real daemon:
``ironctl change submit --kind persona --group demo --by alice`` opens alice's $EDITOR on the
current persona (on a terminal: a pseudo-terminal here, with a scripted editor) and
``ironctl change approve ID --by alice`` asks and applies. ``--by`` naming anyone but the caller
the kernel reports is refused, and off a terminal the missing persona is named."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("roomy_gateway")]

CHANGE_ID = re.compile(r"chg-[0-9a-f]{12}")
WORK = "/tmp/ironctl-editor"
# The scripted editor: records the file's mode, owner and text, then does what EDIT_MODE says.
EDITOR = f"""#!/bin/sh
stat -c '%a %U' "$1" > {WORK}/saw
cat "$1" >> {WORK}/saw
case $EDIT_MODE in
  replace) printf '%s\\n' "$NEW_PERSONA" > "$1" ;;
  empty) : > "$1" ;;
esac
"""


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode() + (proc.stderr or b"").decode()


def ctl_json(daemon: Any, *argv: str, user: str | None = None) -> Any:
    proc = daemon.run(["ironctl", "--json", *argv], user=user, timeout=120)
    assert proc.returncode == 0, out(proc)
    return json.loads(proc.stdout)


def on_pty(
    daemon: Any, argv: list[str], env: dict[str, str], answers: list[list[str]] | None = None
) -> dict[str, Any]:
    spec = {"argv": ["ironctl", *argv], "env": env, "answers": answers or []}
    proc = daemon.run(
        [".venv/bin/python", "tests/integration/ctl_pty_driver.py", json.dumps(spec)],
        user="alice",
        timeout=180,
    )
    assert proc.returncode == 0, out(proc)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def pending(daemon: Any) -> list[str]:
    return [c["id"] for c in ctl_json(daemon, "change", "pending")["changes"]]


@pytest.fixture
def editor(daemon: Any) -> Iterator[dict[str, str]]:
    """The scripted editor (EDITOR) for alice; demo's persona is put back afterwards."""
    original = ctl_json(daemon, "agent", "show", "demo")["persona"]
    script = f"mkdir -p {WORK} && chmod 0777 {WORK} && cat > {WORK}/edit && chmod 0755 {WORK}/edit"
    daemon.run(["sh", "-c", script], input=EDITOR.encode(), check=True)
    yield {"EDITOR": f"{WORK}/edit", "VISUAL": ""}
    daemon.run(["rm", "-rf", WORK], check=True)
    if ctl_json(daemon, "agent", "show", "demo")["persona"] != original:
        back = ctl_json(daemon, "change", "submit", "--kind", "persona", "--agent", "demo",
                        "--persona", original, "--reason", "test: put back")  # fmt: skip
        ctl_json(daemon, "change", "approve", back["id"], "--yes")
    for change_id in pending(daemon):
        ctl_json(daemon, "change", "reject", change_id, "--yes")


def test_the_quickstart_as_written_edits_submits_and_approves(
    daemon: Any, editor: dict[str, str]
) -> None:
    before = ctl_json(daemon, "agent", "show", "demo")["persona"]
    persona = f"You are terse. Marker {secrets.token_hex(4)}."
    env = {**editor, "EDIT_MODE": "replace", "NEW_PERSONA": persona}
    quick = ["change", "submit", "--kind", "persona", "--group", "demo", "--by", "alice"]
    shown = on_pty(daemon, quick, env)
    assert shown["rc"] == 0, shown["out"]
    assert "is pending a human decision" in shown["out"]
    change_id = CHANGE_ID.findall(shown["out"])[0]
    saw = daemon.run(["cat", f"{WORK}/saw"], check=True).stdout.decode()
    # A private temporary file of alice's, holding the current persona.
    assert saw == f"600 alice\n{before}\n"
    held = ctl_json(daemon, "change", "show", change_id)
    assert re.fullmatch(r"uid:\d+\(alice\)", held["submitter"]), held
    assert f"+persona: {json.dumps(persona)}" in held["diff"]
    approved = on_pty(daemon, ["change", "approve", change_id, "--by", "alice"], {},
                      answers=[["[y/N]", "y\n"]])  # fmt: skip
    assert approved["rc"] == 0, approved["out"]
    assert f"change {change_id}: applied" in approved["out"]
    assert ctl_json(daemon, "agent", "show", "demo")["persona"] == persona


@pytest.mark.parametrize(("mode", "why"), [("keep", "unchanged"), ("empty", "is empty")])
def test_an_unchanged_or_emptied_persona_submits_nothing(
    daemon: Any, editor: dict[str, str], mode: str, why: str
) -> None:
    before = pending(daemon)
    argv = ["change", "submit", "--kind", "persona", "--group", "demo"]
    shown = on_pty(daemon, argv, {**editor, "EDIT_MODE": mode})
    assert shown["rc"] == 1, shown["out"]
    assert f"persona of demo {why}: nothing submitted" in shown["out"]
    assert pending(daemon) == before


def test_without_an_editor_the_operator_is_told_how_to_set_one(
    daemon: Any, editor: dict[str, str]
) -> None:
    argv = ["change", "submit", "--kind", "persona", "--group", "demo"]
    shown = on_pty(daemon, argv, {"EDITOR": "", "VISUAL": ""})
    assert shown["rc"] == 2, shown["out"]
    assert "no editor: set VISUAL or EDITOR" in shown["out"]


def test_by_someone_else_is_refused_naming_the_kernel(daemon: Any) -> None:
    before = pending(daemon)
    argv = ["ironctl", "change", "submit", "--kind", "persona", "--group", "demo",
            "--by", "alice", "--persona", "Not alice's."]  # fmt: skip
    proc = daemon.run(argv, timeout=120)  # as root
    assert proc.returncode == 4, out(proc)
    assert "--by alice: the daemon sees you as uid 0 (root), not alice" in out(proc)
    assert "identity comes from the kernel (SO_PEERCRED" in out(proc)
    proc = daemon.run(["ironctl", "change", "approve", "chg-000000000000", "--by", "root",
                       "--yes"], user="alice", timeout=120)  # fmt: skip
    assert proc.returncode == 4, out(proc)
    assert "the daemon sees you as uid " in out(proc)
    assert "(alice), not root" in out(proc)
    assert pending(daemon) == before


def test_off_a_terminal_the_missing_persona_is_named(daemon: Any) -> None:
    argv = ["ironctl", "change", "submit", "--kind", "persona", "--group", "demo", "--by", "alice"]
    proc = daemon.run(argv, user="alice", timeout=120)
    assert proc.returncode == 2, out(proc)
    assert (
        "no persona given, and no editor can open off a terminal: pass --persona-file FILE, "
        "--persona - (standard input) or --persona TEXT"
    ) in out(proc)
