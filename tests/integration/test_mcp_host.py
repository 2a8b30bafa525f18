"""MCP servers host-side against the real daemon and the real PyPI servers, in a private systemd
(docs/mcp.md "Which test proves what").

- An operator registers ``mcp-server-time`` with ``ironctl mcp add``: the daemon probes it in a
  hardened unit, the pending change shows its tools with descriptions and schemas, approval
  registers it, a grant pins the definitions the approver saw, and the real McpClients call it.
- ``mcp-server-git`` reads the repository it is pointed at, and cannot write to it.
- The hostile server (tests/harness/mcp_hostile.py) is contained: /etc/shadow, the daemon's
  state, another agent's files and the network stay out of reach (with ``--allow``, all but the
  allowed address); a 50 MB answer, a hang and a
  crash loop cost only its own calls while another agent's server keeps answering promptly; its
  credential reaches its environment and nowhere else. ``systemd-analyze security`` is printed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.mcp_venv import mcp_venv

CONFIG = "/etc/ironclaw/ironclawd.toml"

pytestmark = pytest.mark.integration


def _out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def _sh(sysd: Any, script: str) -> str:
    proc = sysd.run(["bash", "-c", script], timeout=120)
    assert proc.returncode == 0, _out(proc)
    return str(proc.stdout.decode())


def _driver(sysd: Any, *args: str) -> dict[str, Any]:
    proc = sysd.run([".venv/bin/python", "-m", "tests.integration.mcp_driver", *args], timeout=600)
    assert proc.returncode == 0, _out(proc)
    result: dict[str, Any] = json.loads(proc.stdout.decode().splitlines()[-1])
    return result


def _ctl(sysd: Any, *args: str) -> dict[str, Any]:
    proc = sysd.run(["ironctl", "--json", *args], timeout=300)
    assert proc.returncode == 0, (args, _out(proc))
    doc: dict[str, Any] = json.loads(proc.stdout.decode())
    return doc


def _approve(sysd: Any, change: dict[str, Any]) -> None:
    decided = _ctl(sysd, "change", "approve", change["id"], "--yes")
    assert decided["state"] == "applied", decided


def test_hostile_server_is_contained_and_other_servers_stay_healthy(private_systemd: Any) -> None:
    venv = mcp_venv()
    other = "/srv/agent-b-files"
    _sh(private_systemd, f"mkdir -p {other} && echo b-secret > {other}/notes.txt && "
                         f"chmod 755 {other} && chmod 644 {other}/notes.txt")  # fmt: skip
    d = _driver(private_systemd, "hostile", str(venv), other)
    print(d["analyze"])  # the unit's exposure, as docs/mcp.md lists it
    # Nothing of the host it should not see, even world-readable files of another agent.
    for key in ("read_shadow", "read_state", "read_run", "read_other_tmp", "read_other_agent",
                "read_root_home", "write_etc"):  # fmt: skip
        assert d[key]["text"].startswith("DENIED"), (key, d[key])
    # No network at all: not even the host's loopback.
    for key in ("connect", "connect_out"):
        assert d[key]["text"].startswith("DENIED"), (key, d[key])
    # A server registered with --allow 127.0.0.1:PORT reaches that address and no other.
    assert d["allowed_connect"]["text"] == "CONNECTED", d["allowed_connect"]
    assert d["allowed_connect_other"]["text"].startswith("DENIED"), d["allowed_connect_other"]
    # Its credential is in its environment, and in no argv and no `systemctl show`.
    assert d["credential_in_env"]["text"] == "mcp-secret-value-7f3a9c"
    assert d["secret_in_systemctl_show"] is False
    assert d["secret_in_any_argv"] is False
    # 50 MB: refused at the message cap; the server is stopped, the other one unaffected.
    assert "message over 4194304 bytes" in d["big"]["failed"]
    assert d["good_after_big"]["text"] == "ok"
    # A hang: its caller waits the call time-out; meanwhile the other server answers promptly.
    assert "did not answer calling hang within 8s" in d["hang"]["failed"]
    assert d["good_during_hang_calls"] >= 5
    assert d["good_during_hang_max_seconds"] < 2.0
    # A crash loop: starts fail and restarts are held off in between (no tight loop).
    loop = d["crash_loop"]
    assert all("failed" in r for r in loop), loop
    assert any("not restarted for another" in r["failed"] for r in loop), loop
    assert d["good_at_end"]["text"] == "still here"
    assert d["running"] == [["agent-b", "good"]]
    assert d["units_left"] == ""  # close() stopped every server unit
    score = re.search(r"Overall exposure level for ironclaw-mcp-agent-b_good\.service: ([\d.]+)",
                      d["analyze"])  # fmt: skip
    assert score is not None, d["analyze"]
    assert float(score.group(1)) <= 1.0, d["analyze"]


def test_git_server_reads_the_repository_it_is_given_and_cannot_write_it(
    private_systemd: Any,
) -> None:
    venv = mcp_venv()
    repo = "/srv/mcp-repo"
    _sh(private_systemd, f"rm -rf {repo} && git init -q {repo} && cd {repo} && echo hi > a.txt "
                         "&& git add a.txt && git -c user.name=t -c user.email=t@t commit -qm "
                         f"'first commit from the test' && chmod -R a+rX {repo}")  # fmt: skip
    d = _driver(private_systemd, "git", str(venv), repo)
    assert {"git_log", "git_status", "git_diff", "git_commit"} <= set(d["tools"]), d["tools"]
    assert "first commit from the test" in d["log"]["text"], d["log"]
    assert "failed" not in d["status"], d["status"]
    assert not d["status"]["is_error"], d["status"]
    commit = d["commit"]
    assert commit.get("is_error") or "failed" in commit, commit
    head = _sh(private_systemd, f"git -C {repo} log --oneline | wc -l").strip()
    assert head == "1"


@pytest.fixture
def operator(daemon: Any) -> Iterator[Any]:
    """The daemon with room for this test's submissions: the gateway counts an hour of root's
    changes in its store, across modules and restarts, and a whole run submits far more than
    the default 20."""
    _sh(daemon, f"printf '[gateway]\\nsubmissions_per_hour = 1000\\n' > {CONFIG}; "
                "systemctl restart ironclawd")  # fmt: skip
    yield daemon
    _sh(daemon, f"rm -f {CONFIG}; systemctl restart ironclawd")


def test_operator_registers_probes_grants_and_the_real_clients_call_the_time_server(
    operator: Any,
) -> None:
    daemon = operator
    venv = mcp_venv()
    exe = str(venv / "bin" / "mcp-server-time")
    change = _ctl(daemon, "mcp", "add", "time", "--agent", "demo", "--env", "TZ=UTC",
                  "--reason", "clock", "--command", f"{exe} --local-timezone UTC")  # fmt: skip
    assert change["state"] == "pending"
    diff = "\n".join(change["diff"])
    # The approver sees the command, the network (none), and every tool with its description.
    for needle in (exe, "get_current_time", "convert_time", "IANA timezone name",
                   "Get current time in a specific timezone"):  # fmt: skip
        assert needle in diff, (needle, diff)
    assert re.search(r'"network":\s*"none"', diff), diff
    assert re.search(r'"TZ":\s*"UTC"', diff), diff
    # The probe's unit is gone once it answered.
    assert _sh(daemon, "systemctl list-units --all --plain --no-legend 'ironclaw-mcp-*'") == ""
    _approve(daemon, change)
    grant = _ctl(daemon, "mcp", "grant", "time", "--agent", "demo", "get_current_time")
    assert "mcp__time__get_current_time" in "\n".join(grant["diff"])
    _approve(daemon, grant)
    shown = _ctl(daemon, "mcp", "show", "time", "--agent", "demo")
    assert [g["name"] for g in shown["grants"]] == ["get_current_time"]
    spec = json.dumps({"name": "time", "command": shown["server"]["command"]})
    d = _driver(daemon, "time", str(venv), spec)
    # The live definition is the one pinned at approval; the call answers.
    assert d["tools"]["get_current_time"] == shown["grants"][0]["digest"]
    assert json.loads(d["now"]["text"])["timezone"] == "UTC", d["now"]
    # Unregistering drops the server and its grants.
    _approve(daemon, _ctl(daemon, "mcp", "remove", "time", "--agent", "demo"))
    assert _ctl(daemon, "mcp", "list", "--agent", "demo") == {
        "agent": "demo", "servers": [], "grants": []}  # fmt: skip
    assert _ctl(daemon, "status")["state"] == "running"
