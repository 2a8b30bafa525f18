"""Remote MCP servers (``ironctl mcp add NAME --url``) against the real daemon, in a private
systemd, and a real remote server written with the SDK (tests/harness/mcp_remote_server.py,
streamable HTTP under uvicorn, TLS from a throwaway CA) in a network namespace this test makes.

Topology (nothing leaves this machine): a namespace with 203.0.113.1/24 on a veth (TEST-NET-3,
not the egress test's range), 203.0.113.2/24 on the daemon's side; ``[egress] internal_cidrs``
opens that range and ``ca_file`` names the CA, as the egress test does; the private systemd's
/etc/hosts names it ``mcp.remote.test`` and points ``loop.remote.test`` at 127.0.0.1 and
``meta.remote.test`` at the metadata address. A loopback canary (the same server, on
127.0.0.1) stands where a followed redirect would land.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fixtures import RESULTS, ROOT
from tests.harness.mcp_venv import mcp_venv
from tests.harness.polling import wait_for
from tests.harness.private_systemd import SystemdHarness
from tests.support.certs import write_server_set

pytestmark = pytest.mark.integration

CONFIG = "/etc/ironclaw/ironclawd.toml"
CA_FILE = "/etc/ironclaw/mcp-remote-test-ca.pem"
AUDIT_LOG = "/var/lib/ironclaw/audit.log"
NS_ADDRESS, HOST_ADDRESS = "203.0.113.1", "203.0.113.2"
NAME, PORT, CANARY_PORT = "mcp.remote.test", 8443, 18443
CREDENTIAL, TOKEN = "mcp-remote-token", "Bearer remote-" + secrets.token_hex(12)
SERVER = ROOT / "tests" / "harness" / "mcp_remote_server.py"


def _out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def _sh(sysd: SystemdHarness, script: str) -> str:
    proc = sysd.run(["bash", "-c", script], timeout=120)
    assert proc.returncode == 0, _out(proc)
    return str(proc.stdout.decode())


def _ctl(sysd: SystemdHarness, *args: str, ok: bool = True) -> Any:
    proc = sysd.run(["ironctl", "--json", *args], timeout=300)
    assert (proc.returncode == 0) == ok, (args, _out(proc))
    return json.loads(proc.stdout.decode()) if ok else _out(proc)


@dataclass
class World:
    sysd: SystemdHarness
    logs: Path
    venv: Path

    def requests(self, log: str) -> list[dict[str, Any]]:
        path = self.logs / log
        lines = path.read_text().splitlines() if path.exists() else []
        return [e for e in map(json.loads, lines) if "ready" not in e]

    def audited(self, what: str, match: Callable[[dict[str, Any]], bool]) -> None:
        """Wait for an ``mcp.remote`` audit record ``match`` accepts (they are group-committed
        within milliseconds of the request)."""

        def read() -> list[dict[str, Any]]:
            text = _sh(self.sysd, f"cat {AUDIT_LOG}")
            return [e for e in map(json.loads, text.splitlines()) if e.get("event") == "mcp.remote"]

        wait_for(what, read, lambda records: any(match(r) for r in records), 20)


def _wait_ready(log: Path) -> None:
    wait_for(f"test server ready ({log})", lambda: log.exists() and '"ready"' in log.read_text(),
             bool, 60)  # fmt: skip


@pytest.fixture(scope="module")
def world(daemon: SystemdHarness) -> Iterator[World]:
    venv = mcp_venv()
    tag = secrets.token_hex(4)
    ns, veth_host, veth_ns = f"ictest-mr-{tag}", f"icmr{tag}h", f"icmr{tag}n"
    units = (f"ictest-mcp-remote-{tag}.service", f"ictest-mcp-canary-{tag}.service")
    logs = RESULTS / f"mcp-remote-test-{tag}"
    logs.mkdir(parents=True)
    write_server_set(logs, [NAME, "localhost"])
    python = venv / "bin" / "python3"
    cert = f"--cert {logs}/server.pem --key {logs}/server.key"
    setup = f"""
        set -e
        ip netns add {ns}
        ip link add {veth_host} type veth peer name {veth_ns} netns {ns}
        ip addr add {HOST_ADDRESS}/24 dev {veth_host}
        ip link set {veth_host} up
        ip -n {ns} addr add {NS_ADDRESS}/24 dev {veth_ns}
        ip -n {ns} link set {veth_ns} up
        ip -n {ns} link set lo up
        systemd-run --quiet --unit={units[0]} -p NetworkNamespacePath=/run/netns/{ns} \
            {python} {SERVER} --host {NS_ADDRESS} --port {PORT} --log {logs}/remote.jsonl {cert} \
            --redirect-to https://localhost:{CANARY_PORT}/mcp
        systemd-run --quiet --unit={units[1]} {python} {SERVER} --host 127.0.0.1 \
            --port {CANARY_PORT} --log {logs}/canary.jsonl {cert}
        cp /etc/hosts /etc/hosts.mcp-remote-test
        printf '{NS_ADDRESS} {NAME}\\n127.0.0.1 loop.remote.test\\n169.254.169.254 meta.remote.test\\n' >> /etc/hosts
        install -m 0644 {logs}/ca.pem {CA_FILE}
        mkdir -p /etc/ironclaw/credentials
        (umask 077; printf %s '{TOKEN}' > /etc/ironclaw/credentials/{CREDENTIAL})
        # submissions_per_hour: the gateway counts an hour of root's changes across the run.
        printf '[gateway]\\nsubmissions_per_hour = 1000\\n[egress]\\ninternal_cidrs = ["203.0.113.0/24"]\\nca_file = "{CA_FILE}"\\n' > {CONFIG}
        systemctl restart ironclawd.service
    """  # noqa: E501
    teardown = f"""
        systemctl stop {" ".join(units)} 2>/dev/null
        ip link del {veth_host} 2>/dev/null
        ip netns del {ns} 2>/dev/null
        if [ -e /etc/hosts.mcp-remote-test ]; then mv -f /etc/hosts.mcp-remote-test /etc/hosts; fi
        rm -f {CA_FILE} /etc/ironclaw/credentials/{CREDENTIAL} {CONFIG}
        systemctl reset-failed ironclawd; systemctl restart ironclawd
    """
    try:
        _sh(daemon, setup)
        _wait_ready(logs / "remote.jsonl")
        _wait_ready(logs / "canary.jsonl")
        yield World(daemon, logs, venv)
    finally:
        daemon.run(["bash", "-c", teardown], timeout=120)
        shutil.rmtree(logs, ignore_errors=True)


def test_operator_registers_a_remote_server_and_the_real_clients_call_it(world: World) -> None:
    sysd = world.sysd
    url = f"https://{NAME}:{PORT}/mcp"
    change = _ctl(sysd, "mcp", "add", "remote", "--agent", "demo", "--url", url,
                  "--credential", f"Authorization={CREDENTIAL}", "--reason", "docs")  # fmt: skip
    assert change["state"] == "pending"
    diff = "\n".join(change["diff"])
    for needle in (url, "echo", "Echo the text back.", "add", f"<host credential {CREDENTIAL}>",
                   f"{NAME}:{PORT} (remote, via the egress broker's rules)"):  # fmt: skip
        assert needle in diff, (needle, diff)
    assert TOKEN not in diff
    # The probe reached the server through the pinned connection, with the credential header.
    probed = world.requests("remote.jsonl")
    assert probed, "the probe never reached the remote server"
    assert {e["host"] for e in probed} == {f"{NAME}:{PORT}"}
    assert {e["auth_sha256"] for e in probed} == {hashlib.sha256(TOKEN.encode()).hexdigest()}
    assert _ctl(sysd, "change", "approve", change["id"], "--yes")["state"] == "applied"
    grant = _ctl(sysd, "mcp", "grant", "remote", "--agent", "demo", "echo")
    assert _ctl(sysd, "change", "approve", grant["id"], "--yes")["state"] == "applied"
    shown = _ctl(sysd, "mcp", "show", "remote", "--agent", "demo")
    assert shown["server"]["url"] == url
    # The daemon's real adapter (same config: internal_cidrs, ca_file) calls the granted tool.
    spec = json.dumps(
        {"name": "remote", "url": url, "credentials": [["Authorization", CREDENTIAL]]}
    )
    driver = [".venv/bin/python", "-m", "tests.integration.mcp_remote_driver", spec, CA_FILE]
    proc = sysd.run(driver, timeout=300)
    assert proc.returncode == 0, _out(proc)
    d = json.loads(proc.stdout.decode().splitlines()[-1])
    assert d["tools"]["echo"] == shown["grants"][0]["digest"]
    assert d["echo"] == {"text": "hello remote", "is_error": False}
    # 8 MB in one response: cut at [mcp] max_message_bytes (4 MB), the server marked failed.
    assert "max_message_bytes" in d["big"], d["big"]
    # Every request was audited with the checked address it went to.
    world.audited("a request to the checked address",
                  lambda e: e.get("address") == NS_ADDRESS and e.get("status") == 200)  # fmt: skip
    _ctl(sysd, "change", "approve",
         _ctl(sysd, "mcp", "remove", "remote", "--agent", "demo")["id"], "--yes")  # fmt: skip


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("loop.remote.test", "loop.remote.test resolves to 127.0.0.1, a loopback address; refused"),
        ("meta.remote.test",
         "meta.remote.test resolves to 169.254.169.254, a cloud metadata address; refused"),
        ("127.0.0.1", "127.0.0.1 resolves to 127.0.0.1, a loopback address; refused"),
    ],
)  # fmt: skip
def test_a_url_resolving_where_the_broker_refuses_is_refused_before_any_connection(
    world: World, host: str, reason: str
) -> None:
    before = len(world.requests("canary.jsonl"))
    failed = _ctl(world.sysd, "mcp", "add", "bad", "--agent", "demo", "--url",
                  f"https://{host}:{CANARY_PORT}/mcp", ok=False)  # fmt: skip
    assert reason in failed, failed
    assert len(world.requests("canary.jsonl")) == before
    world.audited(f"the refusal ({reason})", lambda e: reason in e.get("refused", ""))


def test_a_redirect_to_loopback_is_not_followed(world: World) -> None:
    failed = _ctl(world.sysd, "mcp", "add", "redir", "--agent", "demo", "--url",
                  f"https://{NAME}:{PORT}/redirect", ok=False)  # fmt: skip
    assert "not followed" in failed or "not the registered server" in failed, failed
    assert world.requests("canary.jsonl") == []
    assert [e["path"] for e in world.requests("remote.jsonl") if e["path"] == "/redirect"]


def test_a_server_echoing_the_probes_credential_into_a_definition_is_refused(
    world: World,
) -> None:
    failed = _ctl(world.sysd, "mcp", "add", "leaky", "--agent", "demo", "--url",
                  f"https://{NAME}:{PORT}/leak", "--credential", f"Authorization={CREDENTIAL}",
                  ok=False)  # fmt: skip
    assert "carries the credential it was probed with; refused" in failed, failed
    assert TOKEN not in failed
    assert [e for e in world.requests("remote.jsonl") if e["path"] == "/leak"]
