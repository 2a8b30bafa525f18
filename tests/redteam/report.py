"""The containment report of a red-team run: a ledger the attacks record into, the versions of
what was attacked, and the signed report (JSON, a text table, a minisign signature).

Signing key: ``$IRONCLAW_CONTAINMENT_KEY`` (an unencrypted minisign secret key file, e.g. CI's) if
set, else ``build/containment/minisign.key``, made on first use with mode 0600 (build/ is
gitignored). Its public half is written beside the report; verify with
``ironctl containment verify containment-report.json --pubkey TRUSTED.pub``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import stat
import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import ironclawd
from ironclawd.atomic import atomic_write
from ironclawd.formats import containment, minisign
from ironclawd.formats.containment import AttackResult
from ironclawd.host.runsc import parse_version

__all__ = ["AttackResult", "Ledger", "collect_versions", "load_or_create_key", "write_report"]

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "IRONCLAW_CONTAINMENT_KEY"
DEFAULT_KEY = ROOT / "build" / "containment" / "minisign.key"
REPORT_JSON = "containment-report.json"
REPORT_TEXT = "containment-report.txt"
PUBLIC_KEY = "containment-report.pub"

Run = Callable[[list[str]], "subprocess.CompletedProcess[bytes]"]


class Ledger:
    """Attack results of one run, in the order first recorded. Thread-safe; recording an id
    again replaces the earlier result (a retried test)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: dict[str, AttackResult] = {}

    def record(self, result: AttackResult) -> None:
        with self._lock:
            self._results[result.id] = result

    def results(self) -> list[AttackResult]:
        with self._lock:
            return list(self._results.values())


def collect_versions(run: Run) -> dict[str, str]:
    """What was attacked: runsc, systemd, kernel, runsc platform, os, python, ironclaw.

    ``run`` executes inside the private systemd (``SystemdHarness.run``). A fact that cannot be
    read is reported as ``unknown (why)`` rather than failing the report."""
    status = _status_json(run)
    return {
        "runsc": _fact(lambda: parse_version(_stdout(run, ["runsc", "--version"]))[0]),
        "systemd": _fact(lambda: _stdout(run, ["systemctl", "--version"]).splitlines()[0]),
        "kernel": _fact(lambda: _stdout(run, ["uname", "-r"]).strip()),
        "platform": _fact(lambda: _platform(run, status)),
        "os": _fact(lambda: _os_release(_stdout(run, ["cat", "/etc/os-release"]))),
        "python": platform.python_version(),
        "ironclaw": str(status.get("version") or ironclawd.__version__),
    }


def write_report(
    attacks: list[AttackResult],
    negative_control: list[AttackResult],
    versions: dict[str, str],
    out_dir: Path,
) -> Path:
    """Write the report, its text table, signature and public key into ``out_dir``; return the
    JSON's path."""
    doc = containment.build(attacks, negative_control, versions, datetime.now(UTC))
    data = (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()
    report = containment.parse(json.loads(data))  # what ironctl will read, checked now
    key = load_or_create_key()
    comment = f"timestamp:{int(datetime.now(UTC).timestamp())}\tfile:{REPORT_JSON}\thashed"
    signature = minisign.sign(key, data, comment)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT_JSON
    _write(path, data)
    _write(out_dir / (REPORT_JSON + minisign.SIG_SUFFIX), signature.to_file().encode())
    _write(out_dir / REPORT_TEXT, containment.render(report).encode())
    _write(out_dir / PUBLIC_KEY, key.public_key().to_file().encode())
    # What lies on disk now is what ironctl will check: prove it verifies before saying done.
    written = minisign.parse_signature((out_dir / (REPORT_JSON + minisign.SIG_SUFFIX)).read_text())
    minisign.verify(key.public_key(), path.read_bytes(), written, allow_legacy=False)
    return path


def load_or_create_key(env: dict[str, str] | None = None) -> minisign.SecretKey:
    """The build's signing key (see the module docstring). A key file others can read is
    refused: it would sign reports nobody ran."""
    env = dict(os.environ) if env is None else env
    configured = env.get(KEY_ENV)
    path = Path(configured) if configured else DEFAULT_KEY
    if not configured and not path.exists():
        _create_key(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RuntimeError(f"reading containment signing key {path}: {exc.strerror}") from None
    with os.fdopen(fd, "r") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise RuntimeError(
                f"containment signing key {path}: mode {stat.filemode(mode)}: expected no access "
                f"for group or others (chmod 600 {path})"
            )
        key = minisign.parse_secret_key(handle.read())
    if not configured:
        # The trusted half beside the build's key, from the key that won any race to be made.
        public = path.parent / "minisign.pub"
        if not public.exists() or public.read_text() != key.public_key().to_file():
            _write(public, key.public_key().to_file().encode())
    return key


def _create_key(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = minisign.generate_key()
    # replace=False: never replaces a key another run made meanwhile.
    atomic_write(path, key.to_file().encode(), mode=0o600, replace=False)


def _write(path: Path, data: bytes) -> None:
    atomic_write(path, data, mode=0o644)


def _stdout(run: Run, argv: list[str]) -> str:
    proc = run(argv)
    text = (proc.stdout or b"").decode(errors="replace")
    if proc.returncode != 0:
        err = (proc.stderr or b"").decode(errors="replace").strip()
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err[:200]}")
    return text


def _fact(read: Callable[[], str]) -> str:
    try:
        return read()
    except Exception as exc:  # a report with one unknown fact beats no report
        return f"unknown ({exc})"


def _status_json(run: Run) -> dict[str, Any]:
    try:
        doc = json.loads(_stdout(run, ["ironctl", "status", "--json"]))
    except (RuntimeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _platform(run: Run, status: dict[str, Any]) -> str:
    """The runsc platform ironclawd runs sandboxes with: what its status or its sessions say
    (what was really used), else the choice ``ironctl doctor`` reports."""
    if status.get("runsc_platform"):
        return str(status["runsc_platform"])
    listing = json.loads(_stdout(run, ["ironctl", "session", "list", "--json"]))
    used = sorted({s["platform"] for s in listing.get("sessions", []) if s.get("platform")})
    if used:
        return ",".join(used)
    doctor = json.loads(_stdout(run, ["ironctl", "doctor", "--json", "--only", "runsc.platform"]))
    for check in doctor.get("checks", []):
        found = re.search(r"will use '([^']+)'", check.get("detail", ""))
        if check.get("name") == "runsc.platform" and found:
            return found.group(1)
    raise RuntimeError("neither ironctl status, session list nor doctor names the runsc platform")


def _os_release(text: str) -> str:
    found = re.search(r'^PRETTY_NAME="?([^"\n]*)"?$', text, re.MULTILINE)
    if found is None:
        raise RuntimeError("/etc/os-release has no PRETTY_NAME")
    return found.group(1)
