"""Host-user attacks on what the other host-user tests leave out (docs/threat-model.md A4, B1, B5,
A§4, A§8), in the egress world of tests/integration/test_egress.py: a session whose agent has
egress rules (so it has an ``egress.sock``), three egress credentials in
``/etc/ironclaw/credentials``.

As ``outsider`` and ``nobody``, each with root's run as the control that the target is there:

- call ``Fetch`` on the session's ``egress.sock`` (refused to root too, as ``model.sock`` is: the
  daemon's journal names the refusal);
- list the credentials directory, read an egress credential and the master key;
- create a file in ``/run/ironclaw/ingest``, where root makes and then opens private copies;
- search every ``/proc/*/cmdline`` and ``systemctl show`` of the sandbox unit and the daemon
  (what any host user may read) for the session's key and the three credentials, with the
  session id as the positive control (it is in runsc's argv);
- call the admin API on every TCP port ironclawd listens on (the admin API is the Unix socket
  only): with no such port, the attempt says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.harness.fixtures import ROOT
from tests.harness.private_systemd import SystemdHarness
from tests.integration.test_egress import CREDENTIALS, World
from tests.integration.test_egress import world as egress_world  # noqa: F401 - a fixture
from tests.redteam.conftest import (
    RUNNING,
    Sandbox,
    journal_cursor,
    journal_with,
    out,
    record,
)
from tests.redteam.report import Ledger

pytestmark = pytest.mark.redteam

PYTHON = "/usr/bin/python3"
USERS = ("outsider", "nobody")
CREDENTIALS_DIR = "/etc/ironclaw/credentials"
# Where the daemon takes its master key from: systemd's credential first, then the file.
MASTER_KEYS = ("/run/credentials/ironclawd.service/master.key", f"{CREDENTIALS_DIR}/master.key")
INGEST = "/run/ironclaw/ingest"

TITLES = {
    "host-users.egress.fetch": "call Fetch on a session's egress.sock",
    "host-users.credentials.list": "list the credentials directory",
    "host-users.credentials.read": "read an egress credential",
    "host-users.master-key.read": "read the master key",
    "host-users.ingest.plant": "create a file where root makes the private copies it ingests",
    "host-users.secrets.argv-and-units": "find the session key or a credential in any process's "
    "argv or in systemctl show of the units",
    "host-users.admin.tcp": "call the admin API on a TCP port of ironclawd",
}
# Refused to root as well: egress.sock admits only the session's unit; the secrets are in no
# argv or unit property for root either; the admin API is on no TCP port for anyone.
ROOT_REFUSED = frozenset(
    {"host-users.egress.fetch", "host-users.secrets.argv-and-units", "host-users.admin.tcp"}
)

# Run as each user with the host's python3 (grpc from the checkout's virtualenv), parameters as
# JSON on stdin, a JSON map of attack id -> {ok, errno, detail} out: host_attacks.py's shape.
SCRIPT = r"""
import json, os, subprocess, sys
import grpc
# The attempt wrapper and the read and plant attacks of host_attacks.py, shared (the checkout
# is on PYTHONPATH; that module runs nothing when imported).
from tests.redteam.host_attacks import Refused, _attempt as attempt, _create_in as plant
from tests.redteam.host_attacks import _read as read

def fetch(path):
    with grpc.insecure_channel(f"unix:{path}") as channel:
        call = channel.unary_stream("/ironclaw.egress.v1.EgressService/Fetch",
                                    request_serializer=None, response_deserializer=None)
        try:
            got = [bytes(m) for m in call(b"", timeout=10)]
        except grpc.RpcError as err:
            raise Refused(f"{err.code().name}: {str(err.details())[:200]}") from None
    return f"OK: {len(got)} messages"

def scan(p):
    needles = {name: bytes.fromhex(h) for name, h in p["needles"].items()}
    control = p["sid"].encode()
    hits, argv_seen, sid_in_argv = [], 0, False
    try:
        runsc_visible = bool(open(f"/proc/{p['runsc_pid']}/cmdline", "rb").read())
    except OSError:
        runsc_visible = False
    me = str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if pid == me:
            continue
        try:
            data = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        argv_seen += 1
        sid_in_argv = sid_in_argv or control in data
        hits += [f"argv of {pid}: {n}" for n, b in needles.items() if b in data]
    shown = 0
    for unit in p["units"]:
        proc = subprocess.run(["systemctl", "show", unit], capture_output=True, timeout=30)
        if proc.returncode == 0 and proc.stdout:
            shown += 1
        hits += [f"systemctl show {unit}: {n}" for n, b in needles.items() if b in proc.stdout]
    summary = {"argv": argv_seen, "sid_in_argv": sid_in_argv, "runsc_visible": runsc_visible,
               "units": shown}
    if hits:
        return json.dumps({**summary, "hits": hits})
    raise Refused(json.dumps(summary))

def admin_tcp(addresses):
    if not addresses:
        raise Refused("ironclawd listens on no TCP port")
    answers = []
    for address in addresses:
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary("/ironclaw.admin.v1.AdminService/ListSessions",
                                       request_serializer=None, response_deserializer=None)
            try:
                call(b"", timeout=10)
            except grpc.RpcError as err:
                answers.append(f"{address}: {err.code().name}")
                continue
        return f"{address}: the admin API answered"
    raise Refused("; ".join(answers))

p = json.load(sys.stdin)
run = f"/run/ironclaw/sessions/{p['sid']}"
attacks = {
    "host-users.egress.fetch": lambda: fetch(f"{run}/egress.sock"),
    "host-users.credentials.list": lambda: sorted(os.listdir(p["credentials_dir"])),
    "host-users.credentials.read": lambda: read(p["credential"]),
    "host-users.master-key.read": lambda: read(p["master_key"]),
    "host-users.ingest.plant": lambda: plant(p["ingest"]),
    "host-users.secrets.argv-and-units": lambda: scan(p),
    "host-users.admin.tcp": lambda: admin_tcp(p["tcp"]),
}
json.dump({name: attempt(fn) for name, fn in attacks.items()}, sys.stdout)
"""


@dataclass
class Target:
    box: Sandbox
    params: dict[str, Any]


def _root(sysd: SystemdHarness, *argv: str) -> str:
    proc = sysd.run(list(argv))
    assert proc.returncode == 0, f"control ({' '.join(argv)}): {out(proc)}"
    return out(proc)


def _tcp_listeners(sysd: SystemdHarness, pid: str) -> list[str]:
    """Every TCP address ironclawd listens on, as a gRPC target a client can dial."""
    # Control: ss names the daemon's sockets at all (its admin socket, a Unix one).
    unix = _root(sysd, "ss", "-Hlxp")
    assert any(f"pid={pid}," in line and "admin.sock" in line for line in unix.splitlines()), (
        f"control: ss shows no admin.sock of ironclawd (pid {pid}): {unix[-600:]}"
    )
    addresses = []
    for line in _root(sysd, "ss", "-Hltnp").splitlines():
        if f"pid={pid}," not in line:
            continue
        local = line.split()[3]
        host, _, port = local.rpartition(":")
        host = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(host, host)
        addresses.append(f"{host.split('%')[0]}:{port}")
    return addresses


@pytest.fixture(scope="module")
def target(egress_world: World) -> Iterator[Target]:  # noqa: F811 - the fixture above
    sysd = egress_world.sysd
    sid = egress_world.create()
    box = Sandbox(sysd, sid)
    try:
        run = f"/run/ironclaw/sessions/{sid}"
        assert sysd.run(["test", "-S", f"{run}/egress.sock"]).returncode == 0, "control"
        # Control: the box's own agent is served on egress.sock (and a reply was ingested, so
        # the daemon has made its private-copy directory).
        reply = egress_world.fetch(sid, {"url": "https://keyed.egress.test/v1/hello"})
        assert "HTTP 200" in reply, reply
        masters = [m for m in MASTER_KEYS if sysd.run(["test", "-f", m]).returncode == 0]
        assert masters, f"control: no master key at {MASTER_KEYS}"
        name, value = next(iter(CREDENTIALS.items()))
        credential = f"{CREDENTIALS_DIR}/{name}"
        assert _root(sysd, "cat", credential) == value, "control: the credential file"
        assert sysd.run(["test", "-d", INGEST]).returncode == 0, f"control: {INGEST}"
        key = _root(sysd, "cat", f"/run/ironclaw/keys/{sid}").strip()
        assert len(key) == 64, "control: the session key, in hex"
        needles = {"session-key": key.encode().hex()}
        needles |= {f"credential-{n}": v.encode().hex() for n, v in CREDENTIALS.items()}
        pid = _root(sysd, "systemctl", "show", "-P", "MainPID", "ironclawd").strip()
        runsc = _root(sysd, "systemctl", "show", "-P", "MainPID", box.unit).strip()
        params = {
            "sid": sid,
            "credentials_dir": CREDENTIALS_DIR,
            "credential": credential,
            "master_key": masters[0],
            "ingest": INGEST,
            "needles": needles,
            "units": [box.unit, "ironclawd.service"],
            "tcp": _tcp_listeners(sysd, pid),
            "runsc_pid": runsc,
        }
        yield Target(box, params)
    finally:
        egress_world.remove(sid)


def attack_as(sysd: SystemdHarness, user: str, params: dict[str, Any]) -> dict[str, Any]:
    site = sysd.run([str(ROOT / ".venv/bin/python"), "-c", "import grpc;print(grpc.__file__)"])
    packages = out(site).strip().rsplit("/grpc/", 1)[0]
    argv = ["env", f"PYTHONPATH={packages}:{ROOT}", PYTHON, "-c", SCRIPT]
    proc = sysd.run(argv, user=user, input=json.dumps(params).encode(), timeout=180)
    assert proc.returncode == 0, out(proc)
    results: dict[str, Any] = json.loads(proc.stdout)
    return results


def _scan_control(result: dict[str, Any], *, as_root: bool) -> bool:
    """The argv scan saw runsc's argv (the session id is in it) and, for root, both units. A
    user for whom /proc hides runsc's process (hidepid) could not see its argv at all: that is
    the wall too, not a blind scan."""
    try:
        seen = json.loads(result["detail"])
    except ValueError:
        return False
    if as_root:
        return bool(seen.get("sid_in_argv")) and seen.get("units") == 2
    return bool(seen.get("sid_in_argv")) or seen.get("runsc_visible") is False


def test_root_control_every_attack_works_for_root(
    target: Target,
    egress_world: World,  # noqa: F811 - the fixture above
) -> None:
    results = attack_as(egress_world.sysd, "root", target.params)
    assert set(results) == set(TITLES)
    failed = {n: r for n, r in results.items() if not r["ok"] and n not in ROOT_REFUSED}
    assert not failed, failed
    # Root's scan is the control of everyone's: it sees what a user may, and finds nothing.
    scan = results["host-users.secrets.argv-and-units"]
    assert scan["ok"] is False, f"a secret in an argv or a unit property: {scan}"
    assert _scan_control(scan, as_root=True), scan


@pytest.mark.parametrize("user", USERS)
def test_unprivileged_host_user_s50(
    target: Target,
    egress_world: World,  # noqa: F811 - the fixture above
    ledger: Ledger,
    user: str,
) -> None:
    sysd = egress_world.sysd
    mark = journal_cursor(sysd)
    results = attack_as(sysd, user, target.params)
    journal = journal_with(sysd, mark, ["refused a egress.sock connection"])
    assert set(results) == set(TITLES)
    escaped = []
    for attack_id, r in sorted(results.items()):
        contained = r["ok"] is False
        evidence = f"as {user}: {r['errno'] or 'refused'}: {r['detail']}"
        if attack_id == "host-users.egress.fetch":
            # Refused at the door (the cgroup check aborts the connection), not by a request
            # check of a call that was let in.
            logged = "refused a egress.sock connection" in journal
            contained = contained and logged and "UNAVAILABLE" in str(r["detail"])
            evidence += f"; daemon logged the refusal: {logged}"
        if attack_id == "host-users.secrets.argv-and-units":
            control = _scan_control(r, as_root=False)
            contained = contained and control
            evidence += f"; the scan saw runsc's argv (or /proc hid it): {control}"
        record(
            ledger, f"{attack_id}.{user}", "host-users", TITLES[attack_id], contained,
            evidence, stance="host-user", error=r["ok"] is None,
        )  # fmt: skip
        if not contained:
            escaped.append((attack_id, r))
    assert target.box.state() == RUNNING
    assert not escaped, escaped
