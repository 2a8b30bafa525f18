"""``ironctl change submit --payload`` is the whole change: with it, --persona, --persona-file
and --tools were read (a file even opened and checked) and then dropped without a word, so the
operator was told a change was pending that did not hold what they typed (found by a review).
They are now a usage error naming both options, before anything is read or sent."""

from __future__ import annotations

import pytest

from ironclawd.ctl import exitcodes
from ironclawd.ctl.main import main

NO_DAEMON = ["--socket", "/nonexistent/ironclaw-admin.sock"]
SUBMIT = ["change", "submit", "--kind", "tools", "--agent", "demo"]


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--tools", "read_file"], "--tools"),
        (["--persona", "You are terse."], "--persona"),
        (["--persona-file", "/nonexistent/persona.md"], "--persona-file"),
    ],
)
@pytest.mark.parametrize("payload_first", [True, False], ids=["payload-first", "payload-last"])
def test_payload_with_a_shortcut_is_a_usage_error_naming_both(
    capsys: pytest.CaptureFixture[str], extra: list[str], option: str, payload_first: bool
) -> None:
    payload = ["--payload", '{"tools": []}']
    argv = [*SUBMIT, *(payload + extra if payload_first else extra + payload), *NO_DAEMON]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == exitcodes.USAGE, (code, out, err)
    assert option in err
    assert "--payload" in err
    assert err.count("\n") == 1, err


def test_the_shortcuts_together_still_reach_the_daemon(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["change", "submit", "--kind", "create_agent", "--agent", "helper", "--persona", "P",
            "--tools", "read_file", *NO_DAEMON]  # fmt: skip
    assert main(argv) == exitcodes.UNAVAILABLE
    assert "/nonexistent/ironclaw-admin.sock" in capsys.readouterr().err
