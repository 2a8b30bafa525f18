"""journald MESSAGE_IDs from the real daemon under the private systemd's journald: an operator's
``journalctl MESSAGE_ID=...`` finds the event, and with units/ironclaw.catalog installed where
the package puts it (and ``journalctl --update-catalog`` run), ``journalctl -x`` explains it,
with the entry's own fields filled in."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from ironclawd.domain.message_ids import MessageId

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("roomy_gateway")]

CATALOG_DIR = "/usr/lib/systemd/catalog"


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode() + (proc.stderr or b"").decode()


def run(sysd: Any, *argv: str) -> str:
    proc = sysd.run(list(argv), timeout=120)
    assert proc.returncode == 0, out(proc)
    return str(proc.stdout.decode())


# Matches only, no --after-cursor: systemd 252's journalctl (Debian 12) prints nothing for
# --after-cursor together with a field match when the cursor's own entry does not match.
def entries(sysd: Any, event: MessageId, *matches: str) -> list[dict[str, Any]]:
    # journalctl(1) --sync: returns once everything logged before it is in the journal files.
    run(sysd, "journalctl", "--sync")
    text = run(sysd, "journalctl", "--no-pager", "-o", "json", f"MESSAGE_ID={event.value}",
               *matches)  # fmt: skip
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def explained(sysd: Any, event: MessageId, *matches: str) -> str:
    return run(sysd, "journalctl", "--no-pager", "-x", "-n", "1", f"MESSAGE_ID={event.value}",
               *matches)  # fmt: skip


@pytest.fixture
def catalog(daemon: Any) -> Iterator[None]:
    """The catalog where the package installs it, indexed as the package's trigger does."""
    daemon.run(["mkdir", "-p", CATALOG_DIR], check=True)
    daemon.run(["cp", "units/ironclaw.catalog", f"{CATALOG_DIR}/ironclaw.catalog"], check=True)
    run(daemon, "journalctl", "--update-catalog")
    yield
    daemon.run(["rm", "-f", f"{CATALOG_DIR}/ironclaw.catalog"], check=True)
    run(daemon, "journalctl", "--update-catalog")


def test_catalog_entries_are_indexed(daemon: Any, catalog: None) -> None:
    listed = run(daemon, "journalctl", "--list-catalog")
    for event in MessageId:
        assert event.value in listed, event


def test_a_reload_is_found_by_its_id_and_explained(daemon: Any, catalog: None) -> None:
    before = entries(daemon, MessageId.CONFIG_RELOADED)
    run(daemon, "systemctl", "reload", "ironclawd")
    after = entries(daemon, MessageId.CONFIG_RELOADED)
    assert after[: len(before)] == before
    (entry,) = after[len(before) :]
    assert entry["MESSAGE"].startswith("configuration reloaded from")
    assert entry["SYSLOG_IDENTIFIER"] == "ironclawd"
    text = explained(daemon, MessageId.CONFIG_RELOADED)
    assert "Subject: ironclawd reloaded its configuration" in text
    assert "Documentation: man:ironclawd.toml(5)" in text
    assert "changes take effect on restart" in text


def test_a_change_is_found_by_its_ids_and_explained_with_its_fields(
    daemon: Any, catalog: None
) -> None:
    shown = run(daemon, "ironctl", "--json", "change", "submit", "--kind", "tools", "--agent",
                "demo", "--tools", "read_file", "--reason", "catalog test")  # fmt: skip
    change_id = json.loads(shown)["id"]
    run(daemon, "ironctl", "change", "reject", change_id, "--yes", "--note", "catalog test")
    this = f"IRONCLAW_CHANGE={change_id}"
    (pending,) = entries(daemon, MessageId.CHANGE_PENDING, this)
    assert pending["IRONCLAW_AGENT"] == "demo"
    assert pending["MESSAGE"].startswith(f"change {change_id} (tools on demo) submitted by ")
    (rejected,) = entries(daemon, MessageId.CHANGE_REJECTED, this)
    assert rejected["MESSAGE"] == f"change {change_id} (tools on demo) rejected by uid:0(root)"
    text = explained(daemon, MessageId.CHANGE_PENDING, this)
    assert f"Subject: Change {change_id} to agent demo needs a human decision" in text
    assert f"ironctl change approve {change_id}" in text
    text = explained(daemon, MessageId.CHANGE_REJECTED, this)
    assert f"Subject: Change {change_id} to agent demo was rejected" in text


def test_a_sessions_start_and_stop_are_found_by_their_ids_and_explained(
    daemon: Any, catalog: None
) -> None:
    sid = "catalog" + secrets.token_hex(4)
    run(daemon, "ironctl", "session", "create", "--agent", "demo", "--sid", sid)
    try:
        run(daemon, "ironctl", "session", "stop", sid)
    finally:
        daemon.run(["ironctl", "session", "rm", "--force", sid], timeout=120)
    this = f"IRONCLAW_SID={sid}"
    (started,) = entries(daemon, MessageId.SESSION_STARTED, this)
    assert started["MESSAGE"] == f"session {sid} running"
    (stopped,) = entries(daemon, MessageId.SESSION_STOPPED, this)
    assert stopped["MESSAGE"] == f"session {sid} stopped"
    assert entries(daemon, MessageId.SESSION_FAILED, this) == []
    assert f"Subject: Session {sid} is running" in explained(
        daemon, MessageId.SESSION_STARTED, this
    )
    assert f"ironctl session start {sid} starts it" in explained(
        daemon, MessageId.SESSION_STOPPED, this
    )
