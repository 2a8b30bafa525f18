"""Issue 13, skills, against the real daemon (private systemd, real runsc sandboxes): a signed
skill is held for a human with every file hash and grant in its diff; a trojaned skill asking for
egress to evil.example shows that host and, rejected, grants nothing; approved, the skill and its
egress grant take effect together (the agent's next session gets an egress socket) and removing
it takes the grant away; unsigned, untrusted, tampered, symlinked and executable skills are
refused with their reason and nothing is queued; the agent may ask for a skill itself, and that
too waits for a human.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_gateway import (
    approve,
    create_session,
    ctl,
    gw,  # noqa: F401 - the fixture, used by name
    module_daemon,  # noqa: F401 - gw's fixture
    ok,
    out,
    refused,
    remove_sessions,
    request_change,
    sh,
)
from tests.unit import skill_samples as s

pytestmark = pytest.mark.integration

TRUSTED_DIR = "/etc/ironclaw/skills.d/trusted"
SKILLS_DIR = "/var/tmp/ironclaw-skill-tests"


@pytest.fixture
def skills(gw: Any) -> Iterator[Any]:  # noqa: F811
    """The gateway's daemon with the tests' key trusted and no skills installed before or after."""
    proc = sh(
        gw,
        f"rm -rf {SKILLS_DIR} && mkdir -p {TRUSTED_DIR} {SKILLS_DIR} && "
        f"cat > {TRUSTED_DIR}/tests.pub",
        input=s.KEY.public_key().to_file().encode(),
    )
    assert proc.returncode == 0, out(proc)
    yield gw
    remove_sessions(gw)
    for skill in ok(gw, "skill", "list", "--agent", "demo")["skills"]:
        doc = ok(gw, "skill", "remove", skill["name"], "--agent", "demo")
        assert approve(gw, doc["id"])["state"] == "applied"
    sh(gw, f"rm -rf {TRUSTED_DIR} {SKILLS_DIR}")


def folder(sysd: Any, case: str, **kwargs: Any) -> str:
    """A skill folder written inside the private systemd; its path there."""
    parent = sysd.host_path(f"{SKILLS_DIR}/{case}")
    parent.mkdir(parents=True)
    written = s.write_folder(Path(parent), **kwargs)
    return f"{SKILLS_DIR}/{case}/{written.name}"


def has_egress_socket(sysd: Any, sid: str) -> bool:
    path: Path = sysd.host_path(f"/run/ironclaw/sessions/{sid}/egress.sock")
    return path.exists()


def installed(sysd: Any) -> list[dict[str, Any]]:
    skills: list[dict[str, Any]] = ok(sysd, "skill", "list", "--agent", "demo")["skills"]
    return skills


def test_a_trojaned_skill_shows_its_host_and_rejected_grants_nothing(skills: Any) -> None:
    path = folder(skills, "trojan", skill_files=s.files(ironclaw=s.EVIL_GRANTS))
    change = ok(skills, "skill", "add", path, "--agent", "demo", "--reason", "weather")
    assert (change["state"], change["kind"]) == ("pending", "skills")
    (grants,) = [line for line in change["diff"] if line.startswith("+skills.weather.grants:")]
    assert '"host": "evil.example"' in grants
    assert '"methods": ["POST"]' in grants
    (meta,) = [line for line in change["diff"] if line.startswith("+skills.weather:")]
    assert s.KEY.public_key().id_hex in meta
    assert "reference/cities.csv" in meta
    # What an operator reads without --json shows the host too.
    proc = skills.run(["ironctl", "change", "diff", change["id"]])
    assert proc.returncode == 0, out(proc)
    assert "evil.example" in proc.stdout.decode()
    # Nothing is granted while it waits, nor after it is rejected.
    sid = create_session(skills, "skw")
    assert not has_egress_socket(skills, sid)
    rejected = ok(skills, "change", "reject", change["id"], "--yes", "--note", "trojan")
    assert rejected["state"] == "rejected"
    assert installed(skills) == []
    assert "skills." not in ok(skills, "agent", "show", "demo")["view_json"]
    assert not has_egress_socket(skills, create_session(skills, "skr"))


def test_approved_the_skill_and_its_egress_take_effect_and_removal_takes_them_away(
    skills: Any,
) -> None:
    path = folder(skills, "good", skill_files=s.files(ironclaw=s.EVIL_GRANTS))
    change = ok(skills, "skill", "add", path, "--agent", "demo")
    assert approve(skills, change["id"])["state"] == "applied"
    (skill,) = installed(skills)
    assert (skill["name"], skill["version"]) == ("weather", "1.2.0")
    assert skill["signer"] == s.KEY.public_key().id_hex
    assert [r["host"] for r in skill["grants"]["egress"]] == ["evil.example"]
    shown = ok(skills, "skill", "show", "weather", "--agent", "demo")
    assert [f["path"] for f in shown["files"]] == ["SKILL.md", "reference/cities.csv"]
    # The agent's effective egress includes the skill's rule: its sessions get egress.sock.
    sid = create_session(skills, "ska")
    assert has_egress_socket(skills, sid)
    removal = ok(skills, "skill", "remove", "weather", "--agent", "demo")
    assert '"host": "evil.example"' in "\n".join(removal["diff"])
    assert approve(skills, removal["id"])["state"] == "applied"
    assert installed(skills) == []
    assert not has_egress_socket(skills, create_session(skills, "skb"))


def test_refused_skills_say_why_and_queue_nothing(skills: Any) -> None:
    unsigned = folder(skills, "unsigned", signature=None)
    refused(skills, ("skill", "add", unsigned, "--agent", "demo"), 7, "unsigned")
    stranger = folder(skills, "stranger", signature=s.sign("weather", s.files(), s.STRANGER))
    refused(
        skills,
        ("skill", "add", stranger, "--agent", "demo"),
        4,
        f"signed by key {s.STRANGER.public_key().id_hex}, which is not a trusted",
    )
    tampered = folder(skills, "tampered")
    skills.host_path(f"{tampered}/reference/cities.csv").write_text("city,country\nEvil,XX\n")
    refused(skills, ("skill", "add", tampered, "--agent", "demo"), 4, "changed after signing")
    added = folder(skills, "added")
    skills.host_path(f"{added}/extra.md").write_text("smuggled\n")
    refused(skills, ("skill", "add", added, "--agent", "demo"), 4, "changed after signing")
    linked = folder(skills, "linked")
    skills.host_path(f"{linked}/shadow.md").symlink_to("/etc/shadow")
    refused(skills, ("skill", "add", linked, "--agent", "demo"), 7, "a symlink")
    executable = folder(skills, "exec")
    skills.host_path(f"{executable}/SKILL.md").chmod(0o755)
    refused(skills, ("skill", "add", executable, "--agent", "demo"), 7, "executable")
    big = folder(
        skills,
        "big",
        skill_files={**s.files(), "huge.md": b"x" * (300 * 1024)},
        signature=s.sign("weather", s.files()),
    )
    refused(skills, ("skill", "add", big, "--agent", "demo"), 7, "more than 262144 bytes")
    assert ok(skills, "change", "pending")["changes"] == []
    # With no trusted key at all, even a well-signed skill is refused.
    sh(skills, f"rm -f {TRUSTED_DIR}/tests.pub")
    good = folder(skills, "untrusted-now")
    refused(skills, ("skill", "add", good, "--agent", "demo"), 4, "(0 key files)")


def test_the_agent_may_ask_for_a_skill_and_it_waits_for_a_human(skills: Any) -> None:
    sid = create_session(skills, "skq")
    said = request_change(
        skills, sid, "skills", s.payload("weather", s.files(ironclaw=s.EVIL_GRANTS))
    )
    assert "pending" in said, said
    (pending,) = ok(skills, "change", "pending")["changes"]
    change = ok(skills, "change", "show", pending["id"])
    assert change["submitter"] == f"session:{sid}"
    assert any("evil.example" in line for line in change["diff"])
    assert installed(skills) == []
    code, _ = ctl(skills, "change", "reject", pending["id"], "--yes")
    assert code == 0
