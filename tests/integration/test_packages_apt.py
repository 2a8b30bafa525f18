"""ironclawd/host/pkg_apt.py against the real apt and the Debian archive this machine reaches, as
an unprivileged user (``nobody``, through setpriv), without systemd: what the helper unit runs.

The module runs as a stand-alone copy with Debian's own python3 (the helper needs only the
standard library and apt; ``nobody`` cannot reach the venv's interpreter under /root). The base
image is stood in for by a dpkg status holding only the host's libc6. Resolving reads the host's
package lists (no network); the download needs the archive: when it cannot be reached the
download test skips saying so, and under CI (or IRONCLAW_REQUIRE_REAL=1) it fails instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ironclawd.domain.packages import Candidate, candidate_from_mapping, check_resolved
from ironclawd.errors import PolicyDenied
from tests.harness.fixtures import ROOT, real_required

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"
USER = "nobody"
DRIVER = """\
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
import pkg_apt
request = json.load(sys.stdin)
try:
    if request["op"] == "resolve":
        out = pkg_apt.resolve(request["names"], request["status"], Path(request["workdir"]))
    else:
        out = str(pkg_apt.download(request["name"], request["version"], Path(request["workdir"])))
except ValueError as exc:
    json.dump({"error": str(exc), "type": type(exc).__name__}, sys.stdout)
else:
    json.dump({"ok": out}, sys.stdout)
"""
# apt's words for an archive it cannot reach, or lists that name versions it no longer has.
UNREACHABLE = ("Failed to fetch", "Could not resolve", "Temporary failure", "Unable to connect",
               "Could not connect", "Network is unreachable", "Connection failed")  # fmt: skip

Helper = Callable[..., dict[str, object]]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run the helper as nobody (setpriv)"
    for tool in ("setpriv", "apt-get", "apt-cache", "dpkg-query"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not any(Path("/var/lib/apt/lists").glob("*_Packages*")):
        return "needs apt's package lists of a Debian archive (apt-get update has not run)"
    if not os.access(PYTHON, os.X_OK):
        return f"needs Debian's {PYTHON} (nobody cannot run the venv's interpreter under /root)"
    return None


@pytest.fixture(scope="module")
def helper() -> Iterator[Helper]:
    """Runs pkg_apt's functions as nobody in a private directory; returns their JSON answer.
    ``offline=True`` runs it in a network namespace of its own, where no archive answers."""
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    home = Path(tempfile.mkdtemp(prefix="ironclaw-pkgapt-"))
    try:
        shutil.copy(ROOT / "ironclawd" / "host" / "pkg_apt.py", home / "pkg_apt.py")
        (home / "driver.py").write_text(DRIVER, encoding="utf-8")
        home.chmod(0o755)
        uid, gid = pwd.getpwnam(USER).pw_uid, pwd.getpwnam(USER).pw_gid
        os.chown(home, uid, gid)
        counter = iter(range(1000))

        def call(request: dict[str, object], offline: bool = False) -> dict[str, object]:
            workdir = home / f"work{next(counter)}"
            workdir.mkdir()
            os.chown(workdir, uid, gid)
            # offline: in a new network namespace with only a loopback that is down.
            argv = ["unshare", "--net"] if offline else []
            argv += ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
            argv += ["--", PYTHON, "-I", str(home / "driver.py")]
            proc = subprocess.run(
                argv, input=json.dumps({**request, "workdir": str(workdir)}), capture_output=True,
                text=True, timeout=300, check=False, cwd=home,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            answer: dict[str, object] = json.loads(proc.stdout)
            return answer

        yield call
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def status_text() -> str:
    """A dpkg status holding only the host's libc6: the base image's package list, stood in."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version} ${Architecture}", "libc6"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return (
        f"Package: libc6\nStatus: install ok installed\nPriority: optional\n"
        f"Version: {out[0]}\nArchitecture: {out[1]}\nMulti-Arch: same\n\n"
    )


# Every name the module resolves: each once, two at a time (apt spends seconds of CPU per
# resolution building its cache in memory; the machine has two cores).
NAMES = ("jq", "python3-yaml", "bash", "busybox-static", "ironclaw-no-such-package", "libjq.")
OFFLINE = "download jq offline"  # apt retries for seconds: it waits beside the resolutions


@pytest.fixture(scope="module")
def resolved(helper: Helper, status_text: str) -> Iterator[Callable[[str], dict[str, object]]]:
    """The helper's answer for each of NAMES (and OFFLINE), each computed once for the module."""

    def offline() -> dict[str, object]:
        (jq,) = [c for c in candidates(futures["jq"].result()) if c.name == "jq"]
        return helper({"op": "download", "name": "jq", "version": jq.version}, offline=True)

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            name: pool.submit(helper, {"op": "resolve", "names": [name], "status": status_text})
            for name in NAMES
        }
        futures[OFFLINE] = pool.submit(offline)
        yield lambda name: futures[name].result()


def candidates(answer: dict[str, object]) -> list[Candidate]:
    assert "ok" in answer, answer
    raw = answer["ok"]
    assert isinstance(raw, list)
    return [candidate_from_mapping(item, f"resolved[{i}]") for i, item in enumerate(raw)]


def apt_cache_show(found: list[Candidate]) -> dict[str, tuple[str, str]]:
    """Name -> (SHA256, Size) as apt-cache prints them, read here independently of pkg_apt."""
    text = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", *(f"{c.name}={c.version}" for c in found)],
        capture_output=True, text=True, check=True, env={**os.environ, "LC_ALL": "C"},
    ).stdout  # fmt: skip
    shown: dict[str, tuple[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if line[:1].isalnum())
        if fields:
            shown[fields["Package"]] = (fields["SHA256"], fields["Size"])
    return shown


def test_jq_resolves_to_jq_and_its_libraries_with_the_archive_hashes(
    resolved: Callable[[str], dict[str, object]],
) -> None:
    found = candidates(resolved("jq"))
    assert sorted(c.name for c in found) == ["jq", "libjq1", "libonig5"]
    assert apt_cache_show(found) == {c.name: (c.sha256, str(c.size)) for c in found}
    for c in found:
        assert c.architecture in ("amd64", "all")
        assert not c.essential
        assert c.priority == "optional"
    by_name = {c.name: c for c in found}
    assert "libjq1" in by_name["jq"].depends
    assert "libonig5" in by_name["libjq1"].depends
    approved = check_resolved(("jq",), found)
    assert [(p.name, p.requested) for p in approved] == [
        ("jq", True), ("libjq1", False), ("libonig5", False)
    ]  # fmt: skip


def test_python3_yaml_is_refused_naming_python3_and_what_pulled_it_in(
    resolved: Callable[[str], dict[str, object]],
) -> None:
    found = candidates(resolved("python3-yaml"))
    names = {c.name for c in found}
    assert {"python3-yaml", "python3", "libyaml-0-2"} <= names
    with pytest.raises(PolicyDenied) as info:
        check_resolved(("python3-yaml",), found)
    message = str(info.value)
    assert message.startswith(
        "package python3 (needed by python3-yaml) is an interpreter; nothing was queued; "
        "also refused: "
    ), message
    assert "python3.11" in message.split("also refused: ")[1].split(", ")


def test_bash_is_refused_as_an_essential_shell(
    resolved: Callable[[str], dict[str, object]],
) -> None:
    with pytest.raises(PolicyDenied) as info:
        check_resolved(("bash",), candidates(resolved("bash")))
    assert str(info.value).startswith(
        "package bash is a shell, is essential (Essential: yes) and has Priority: required; "
        "nothing was queued"
    ), info.value


def test_busybox_static_is_refused_as_a_shell(
    resolved: Callable[[str], dict[str, object]],
) -> None:
    with pytest.raises(PolicyDenied, match=r"^package busybox-static is a shell; nothing"):
        check_resolved(("busybox-static",), candidates(resolved("busybox-static")))


def test_an_unknown_name_and_a_pattern_are_clear_errors(
    resolved: Callable[[str], dict[str, object]],
) -> None:
    assert resolved("ironclaw-no-such-package") == {
        "error": "package ironclaw-no-such-package: not in the host's configured archives",
        "type": "AptError",
    }
    # apt reads "libjq." as a regular expression (libjq1, libjq-dev): refused, not guessed.
    answer = resolved("libjq.")
    assert str(answer.get("error", "")).startswith(
        "package libjq.: apt adds no package of exactly this name"
    ), answer


def test_download_gives_the_deb_with_the_resolved_hash(
    helper: Helper, resolved: Callable[[str], dict[str, object]]
) -> None:
    (jq,) = [c for c in candidates(resolved("jq")) if c.name == "jq"]
    answer = helper({"op": "download", "name": "jq", "version": jq.version})
    error = str(answer.get("error", ""))
    if any(word in error for word in UNREACHABLE):
        reason = f"the Debian archive is unreachable from this machine (apt: {error})"
        if real_required():
            pytest.fail(f"{reason}; CI needs it to download packages", pytrace=False)
        pytest.skip(reason)
    assert "ok" in answer, answer
    deb = Path(str(answer["ok"]))
    data = deb.read_bytes()
    assert deb.name.endswith("_amd64.deb")
    assert deb.stat().st_uid == pwd.getpwnam(USER).pw_uid
    assert hashlib.sha256(data).hexdigest() == jq.sha256
    assert len(data) == jq.size
    assert [p.name for p in deb.parent.iterdir()] == [deb.name]  # nothing else was written


def test_an_unreachable_archive_is_recognised_as_such(
    resolved: Callable[[str], dict[str, object]],
) -> None:
    """The control for the skip above: without a network, apt's error is one UNREACHABLE names
    (so that test skips, or fails under CI, rather than passing or failing on the wrong cause)."""
    (jq,) = [c for c in candidates(resolved("jq")) if c.name == "jq"]
    answer = resolved(OFFLINE)
    error = str(answer.get("error", ""))
    assert error.startswith(f"apt-get download jq={jq.version}: "), answer
    assert any(word in error for word in UNREACHABLE), error
