"""The shipped agent has one mode: it takes no option but ``-h``, so nothing in the box can ask it
for the red-team probe's report, attacks or memory hog (those live in redteam_probe/)."""

from __future__ import annotations

import pytest

from agent import main as agent_main


@pytest.mark.parametrize(
    "argv", [["--probe"], ["--probe-attack=network"], ["--hog-mib", "600"], ["--probe-path=/"]]
)
def test_agent_refuses_the_probe_options(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        agent_main.main(argv)
    assert exited.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_agent_help_names_no_probe_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        agent_main.main(["-h"])
    assert exited.value.code == 0
    usage = capsys.readouterr().out
    assert "usage: agent" in usage
    assert "probe" not in usage
    assert "hog" not in usage
