"""Issue 7 item 4, the ``mounts`` applier, against the real daemon under a private systemd.

An operator allowlists a host directory (``[gateway] mount_allowlist``); a ``mounts`` change
naming a directory below it is held, approved, and the agent's next session sees it read-only at
``/mnt/<name>`` (checked from inside with the red-team probe). A source outside the allowlist, one
reached through a symlink and one with ``..`` are refused at submission. The shared agent rootfs
gains no entry from a session with grants: runsc 20221219 creates missing mountpoints in the host
rootfs, so the grants sit on a per-session frame bound at /mnt (ironclawd/bundle/spec.py).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_gateway import (
    CONFIG,
    configure,
    create_session,
    ctl,
    ok,
    out,
    probe,
    remove_sessions,
    sh,
)

pytestmark = pytest.mark.integration

STATE = "/var/lib/ironclaw"


def submit_mounts(sysd: Any, *mounts: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    payload = json.dumps({"mounts": list(mounts)})
    code, doc = ctl(sysd, "change", "submit", "--kind", "mounts", "--agent", "demo",
                    "--payload", payload, "--reason", "test")  # fmt: skip
    assert isinstance(doc, dict)
    return code, doc


def rootfs_entries(sysd: Any) -> list[str]:
    proc = sh(sysd, f"cd {STATE}/rootfs && find . -mindepth 1 | sort")
    assert proc.returncode == 0, out(proc)
    entries: list[str] = proc.stdout.decode().splitlines()
    return entries


@pytest.fixture(scope="module")
def allowlisted(daemon: Any) -> Iterator[tuple[Any, str]]:
    """The daemon configured (once per module: restarts are rate-limited) with an allowlist."""
    base = f"/srv/ironclaw-grants-{secrets.token_hex(4)}"
    remove_sessions(daemon)
    configure(
        daemon,
        f'[gateway]\nsubmissions_per_hour = 1000\nmount_allowlist = ["{base}/allowed"]\n',
    )
    yield daemon, base
    sh(daemon, f"rm -rf {base}; rm -f {CONFIG}; systemctl restart ironclawd")


@pytest.fixture
def grants(allowlisted: tuple[Any, str]) -> Iterator[tuple[Any, str]]:
    """Below the allowlisted directory a shared file and a symlink to a directory outside it;
    the demo agent has no grants before and after."""
    daemon, base = allowlisted
    script = f"""
        set -e
        rm -rf {base}
        mkdir -p {base}/allowed/share {base}/outside
        echo 'granted file' > {base}/allowed/share/hello.txt
        echo 'host secret' > {base}/outside/secret.txt
        ln -s {base}/outside {base}/allowed/escape
        chmod -R a+rX {base}
    """
    proc = sh(daemon, script)
    assert proc.returncode == 0, out(proc)
    try:
        yield daemon, base
    finally:
        remove_sessions(daemon)
        code, doc = submit_mounts(daemon)  # back to no grants (refused if already none)
        if code == 0:
            ok(daemon, "change", "approve", doc["id"], "--yes")
        for pending in ok(daemon, "change", "pending")["changes"]:
            ok(daemon, "change", "reject", pending["id"], "--yes", "--note", "test cleanup")


def test_sources_outside_the_allowlist_via_symlinks_or_dotdot_are_refused(
    grants: tuple[Any, str],
) -> None:
    sysd, base = grants
    for source, needle in [
        (f"{base}/outside", "not below [gateway] mount_allowlist"),
        (f"{base}/allowed/escape", "resolves to"),
        (f"{base}/allowed/share/../../outside", "expected an absolute, normalised"),
        (f"{base}/allowed/missing", "No such file"),
        ("/etc", "not below [gateway] mount_allowlist"),
    ]:
        code, doc = submit_mounts(sysd, {"source": source, "name": "x"})
        assert code != 0, (source, doc)
        assert needle in doc["error"]["message"], (source, doc)
    assert ok(sysd, "change", "pending")["changes"] == []


def test_an_approved_mount_is_read_only_at_mnt_and_the_shared_rootfs_is_untouched(
    grants: tuple[Any, str],
) -> None:
    sysd, base = grants
    before = rootfs_entries(sysd)
    assert any(e.endswith("/mnt") for e in before), before
    code, doc = submit_mounts(sysd, {"source": f"{base}/allowed/share", "name": "share"})
    assert code == 0, doc
    assert doc["state"] == "pending", doc
    assert ok(sysd, "change", "approve", doc["id"], "--yes")["state"] == "applied"

    sid = create_session(sysd, "mnt")
    report = probe(sysd, sid, "--probe-path=/mnt/share/hello.txt", "--probe-path=/mnt/share",
                   "--probe-path=/mnt/other", "--probe-path=/mnt")  # fmt: skip
    seen = report["paths"]
    hello = seen["/mnt/share/hello.txt"]
    assert hello["readable"] is True, seen
    assert hello["sha256"] == hashlib.sha256(b"granted file\n").hexdigest(), seen
    assert hello["writable"] is False, seen
    assert seen["/mnt/share"]["type"] == "dir", seen
    assert seen["/mnt/share"]["writable"] is False, seen
    assert seen["/mnt/other"]["exists"] is False, seen
    assert seen["/mnt"]["writable"] is False, seen
    frame = sh(sysd, f"ls -A {STATE}/mount-frames/{sid}")
    assert frame.returncode == 0, out(frame)
    assert frame.stdout.decode().split() == ["share"], out(frame)

    assert ctl(sysd, "session", "rm", "--force", sid)[0] == 0
    assert rootfs_entries(sysd) == before
    assert sh(sysd, f"test -e {STATE}/mount-frames/{sid}").returncode != 0
    # Nothing of the host file changed either.
    assert sh(sysd, f"cat {base}/allowed/share/hello.txt").stdout == b"granted file\n"


def test_a_grant_whose_source_became_a_symlink_stops_the_next_session(
    grants: tuple[Any, str],
) -> None:
    sysd, base = grants
    code, doc = submit_mounts(sysd, {"source": f"{base}/allowed/share", "name": "share"})
    assert code == 0, doc
    assert ok(sysd, "change", "approve", doc["id"], "--yes")["state"] == "applied"
    share = f"{base}/allowed/share"
    swap = f"mv {share} {share}.old && ln -s {base}/outside {share}"
    assert sh(sysd, swap).returncode == 0
    code, doc = ctl(
        sysd, "session", "create", "--agent", "demo", "--sid", f"mnt{secrets.token_hex(4)}"
    )
    assert code != 0, doc
    assert "resolves to" in json.dumps(doc), doc
