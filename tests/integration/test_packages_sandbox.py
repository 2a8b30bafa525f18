"""Issue 14 against the real daemon, real apt and the real Debian archive, real runsc: an agent
gains ``jq`` only through the gateway and runs it from inside its sandbox.

- ``ironctl package add jq``: the pending change's diff lists jq and the libraries apt resolved,
  each with version, architecture, size and the SHA-256 of its ``.deb``; approval builds the
  agent's image and ``ironctl package list`` shows it.
- Through the mock model, the agent writes a JSON file in its workspace and ``run``s jq on it:
  the reply holds jq's answer. It cannot ``run`` a file it wrote, the agent binary or anything
  not in the layer; the red-team probe finds no shell or interpreter in the image either.
- Refused with a reason, nothing queued: python3, bash, busybox-static, an essential package, a
  version, a URL, 33 names, an unknown name; a ``resolved`` set of the submitter's own.
- Revoking (``package set`` with none) moves the agent back to the base image, its session
  restarted, and the unused image is collected. The base image is unchanged throughout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_gateway import (
    CONFIG,
    approve,
    configure,
    create_session,
    ctl,
    ok,
    out,
    probe,
    remove_sessions,
    send,
    sh,
)

pytestmark = pytest.mark.integration

AGENT = "packaged"
STATE = "/var/lib/ironclaw"
AGENTS = f"""
[gateway]
submissions_per_hour = 1000

[agents.{AGENT}]
tools = ["read_file", "write_file", "list_files", "run"]
"""
BASE_DIGEST = (
    "import sys; from pathlib import Path; from ironclawd.bundle.image import content_digest; "
    "print(content_digest(Path(sys.argv[1])))"
)


def _base(sysd: Any) -> tuple[str, str]:
    """The daemon's base image and a digest of every byte and mode in it."""
    proc = sh(sysd, f"ls -d {STATE}/rootfs/*/ | grep -v unavailable | head -1")
    base = proc.stdout.decode().strip().rstrip("/")
    assert proc.returncode == 0, out(proc)
    assert base, out(proc)
    digest = sysd.run([".venv/bin/python", "-c", BASE_DIGEST, base], timeout=120)
    assert digest.returncode == 0, out(digest)
    return base, digest.stdout.decode().strip()


def _images(sysd: Any) -> list[str]:
    proc = sh(sysd, f"ls -A {STATE}/images 2>/dev/null | grep -v '^.lock$' || true")
    return sorted(proc.stdout.decode().split())


@pytest.fixture(scope="module")
def packaged(daemon: Any) -> Iterator[tuple[Any, str]]:
    """An agent with the run tool whose jq change was approved; the base image's digest."""
    remove_sessions(daemon)
    configure(daemon, AGENTS)
    _, before = _base(daemon)
    code, change = ctl(daemon, "package", "add", "jq", "--agent", AGENT, "--reason", "json")
    assert code == 0, change
    assert change["state"] == "pending", change
    shown = ok(daemon, "change", "show", change["id"])
    after = {p["name"]: p for p in json.loads(shown["after_json"])["packages"]}
    # The diff the approver reads names every .deb to be unpacked, with its hash.
    diff = "\n".join(shown["diff"])
    assert all(p["sha256"] in diff for p in after.values()), diff
    assert {"jq", "libjq1", "libonig5"} <= set(after), after
    assert after["jq"]["requested"] is True
    assert after["libonig5"]["requested"] is False
    for p in after.values():
        assert (len(p["sha256"]), p["architecture"]) == (64, "amd64"), p
        assert p["size"] > 0, p
    assert approve(daemon, change["id"])["state"] == "applied"
    yield daemon, before
    remove_sessions(daemon)
    sh(daemon, f"rm -f {CONFIG}; systemctl restart ironclawd")


def test_the_approved_set_is_listed_with_versions_and_hashes(packaged: tuple[Any, str]) -> None:
    sysd, _ = packaged
    listed = ok(sysd, "package", "list", "--agent", AGENT)["packages"]
    names = {p["name"]: p for p in listed}
    assert {"jq", "libjq1", "libonig5"} <= set(names), listed
    assert all(p["agent"] == AGENT and len(p["sha256"]) == 64 for p in listed)
    assert [p["name"] for p in listed if p["requested"]] == ["jq"]
    assert len(_images(sysd)) == 1


def test_the_agent_runs_jq_on_a_file_it_wrote_and_nothing_else(packaged: tuple[Any, str]) -> None:
    sysd, _ = packaged
    sid = create_session(sysd, "pkg", AGENT)
    document = json.dumps({"order": {"id": 7341, "items": ["tea", "rice"]}})
    write = json.dumps({"path": "order.json", "content": document})
    assert "said:" in send(sysd, sid, f"/tool write_file {write}")
    run = json.dumps({"program": "jq", "args": ["-r", '.order.items | join("+")', "order.json"]})
    reply = send(sysd, sid, f"/tool run {run}")
    assert "exit code 0" in reply, reply
    assert "tea+rice" in reply, reply
    # A program of its own making: written, then refused by the tool (not in the layer) and by
    # the kernel (the workspace is noexec), whatever path it is named by.
    fake = json.dumps({"path": "jq", "content": "#!/bin/jq\n"})
    send(sysd, sid, f"/tool write_file {fake}")
    for program in ("/workspace/jq", "./jq", "/app/agent/agent", "/usr/bin/env", "sh", "../jq"):
        reply = send(sysd, sid, "/tool run " + json.dumps({"program": program, "args": []}))
        assert "error" in reply, (program, reply)
        assert "exit code" not in reply, (program, reply)
    # jq itself cannot reach outside its caps: no network in the box, a bounded run.
    reply = send(sysd, sid, "/tool run " + json.dumps({"program": "jq", "args": ["-n", "1+1"]}))
    assert "exit code 0" in reply, reply
    assert "2" in reply, reply


def test_from_inside_the_layer_is_read_only_and_nothing_else_runs(
    packaged: tuple[Any, str],
) -> None:
    """The red-team probe, as the agent's uid in a session on the jq image."""
    sysd, _ = packaged
    sid = create_session(sysd, "prb", AGENT)
    found = probe(sysd, sid, "--probe-attack", "packages")["attacks"]
    assert found["packages.layer.run"]["ok"] is True, found  # the granted program does run
    for attack in ("packages.layer.overwrite", "packages.layer.setuid",
                   "packages.programs.overwrite", "packages.workspace.run-copy",
                   "packages.tmp.run-copy", "packages.image.shell-search"):  # fmt: skip
        assert found[attack]["ok"] is False, (attack, found[attack])
    # Refused by the kernel of the box, not by our tool: the writable places are noexec.
    assert found["packages.workspace.run-copy"]["errno"] == "EACCES", found
    assert found["packages.tmp.run-copy"]["errno"] == "EACCES", found


def test_refused_with_a_reason_and_nothing_queued(packaged: tuple[Any, str]) -> None:
    sysd, _ = packaged
    pending = len(ok(sysd, "change", "pending")["changes"])
    cases = {
        "python3": "interpreter",
        "bash": "bash",
        "busybox-static": "busybox",
        "coreutils": "essential",
        "jq=1.6": "packages",
        "http://deb.debian.org/jq.deb": "packages",
        "ironclaw-no-such-package": "ironclaw-no-such-package",
    }
    for name, reason in cases.items():
        code, doc = ctl(sysd, "package", "set", name, "--agent", AGENT)
        assert code != 0, (name, doc)
        assert reason in json.dumps(doc).lower(), (name, doc)
    many = [f"pkg{n}" for n in range(33)]
    code, doc = ctl(sysd, "package", "set", *many, "--agent", AGENT)
    assert code != 0, doc
    assert "32" in json.dumps(doc), doc
    # The host resolves; a submitter may not hand it a set of its own.
    forged = {"packages": ["jq"], "resolved": []}
    code, doc = ctl(sysd, "change", "submit", "--kind", "packages", "--agent", AGENT,
                    "--payload", json.dumps(forged))  # fmt: skip
    assert code != 0, doc
    assert "resolved" in json.dumps(doc), doc
    assert len(ok(sysd, "change", "pending")["changes"]) == pending


def test_revoking_moves_back_to_the_base_and_the_image_is_collected(
    packaged: tuple[Any, str],
) -> None:
    sysd, before = packaged
    sid = create_session(sysd, "rev", AGENT)
    change = ok(sysd, "package", "set", "--agent", AGENT)
    assert approve(sysd, change["id"])["state"] == "applied"
    assert ok(sysd, "package", "list", "--agent", AGENT)["packages"] == []
    reply = send(sysd, sid, "/tool run " + json.dumps({"program": "jq", "args": ["-n", "1"]}))
    assert "no packages" in reply, reply
    assert _images(sysd) == []
    assert _base(sysd)[1] == before  # the shared base image, byte for byte
