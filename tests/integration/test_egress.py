"""The egress broker against the real thing (issue 6): ironclawd under a private systemd, a real
runsc sandbox whose agent calls ``http_fetch`` (driven by the mock model's ``/tool`` script),
and test servers in a network namespace this test makes itself on a documentation range.

Topology (nothing leaves this machine): ``ip netns add`` a namespace, a veth pair with
198.51.100.1/24 inside (HTTPS 443, HTTP 80 and 8088, a canary on 8081, scripted DNS on 53) and
198.51.100.2/24 on the daemon's side; ``[egress] internal_cidrs = ["198.51.100.0/24"]`` lets the
broker reach it; the private systemd's /etc/resolv.conf names the test DNS server. A loopback
canary on 127.0.0.1:8088 stands where a rebinding or redirect would land.
"""

from __future__ import annotations

import base64
import gzip
import json
import secrets
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import pytest

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from tests.harness.fixtures import RESULTS, ROOT
from tests.harness.leaks import find_leaks
from tests.harness.polling import wait_for
from tests.harness.private_systemd import SystemdHarness
from tests.support.certs import write_server_set

pytestmark = pytest.mark.integration

CONFIG = "/etc/ironclaw/ironclawd.toml"
ADMIN_SOCKET = "/run/ironclaw/admin.sock"
CA_FILE = "/etc/ironclaw/egress-test-ca.pem"
CREDENTIAL = "egress-test-token"
TOKEN = "egress-test-" + secrets.token_hex(12)
# A credential with every character an encoder treats specially, and a Basic one.
CREDENTIAL_PUNCT, CREDENTIAL_BASIC = "egress-test-punct", "egress-test-basic"
TOKEN_PUNCT = f"tok/{secrets.token_hex(6)}+={secrets.token_hex(6)}:a b~"
PASSWORD = f"pw/{secrets.token_hex(10)}"
TOKEN_BASIC = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
CREDENTIALS = {CREDENTIAL: TOKEN, CREDENTIAL_PUNCT: TOKEN_PUNCT, CREDENTIAL_BASIC: TOKEN_BASIC}
NS_ADDRESS, HOST_ADDRESS = "198.51.100.1", "198.51.100.2"
RPC_TIMEOUT = 60.0
AUDIT_LOG = "/var/lib/ironclaw/audit.log"
DNS_NAMES_8088 = ("loop", "private", "cgnat", "meta", "mcast", "zero", "mixed", "mapped",
                  "meta6", "rebind")  # fmt: skip


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def sh(sysd: SystemdHarness, script: str, **kwargs: Any) -> Any:
    return sysd.run(["bash", "-c", script], **kwargs)


EGRESS_NAMES = ("api.egress.test", "keyed.egress.test", "plain.egress.test", "x.svc.egress.test")


def make_certs(directory: Path, names: Sequence[str] = EGRESS_NAMES) -> None:
    """A throwaway CA and a server certificate for ``names`` (by default
    api/keyed/plain.egress.test, not wrong.*)."""
    write_server_set(directory, names, "ironclaw egress test CA")


def agent_config(agent: str) -> str:
    rules = [
        '{host = "api.egress.test", methods = ["GET", "POST"], path_prefixes = ["/v1/"]}',
        f'{{host = "keyed.egress.test", path_prefixes = ["/v1/"], credential = "{CREDENTIAL}"}}',
        f'{{host = "keyed.egress.test", path_prefixes = ["/v2/"], '
        f'credential = "{CREDENTIAL_PUNCT}", credential_header = "X-Api-Key", '
        f'credential_format = "Bearer {{}}"}}',
        f'{{host = "keyed.egress.test", path_prefixes = ["/basic/"], '
        f'credential = "{CREDENTIAL_BASIC}", credential_format = "Basic {{}}"}}',
        '{host = "x.svc.egress.test"}',
        '{host = "*.svc.egress.test"}',
        '{host = "plain.egress.test", scheme = "http"}',
        '{host = "wrong.egress.test"}',
        # Operator mistakes the network layer must still refuse:
        '{host = "127.0.0.1", scheme = "http", port = 8088}',
        '{host = "169.254.169.254", scheme = "http"}',
        *(f'{{host = "{n}.egress.test", scheme = "http", port = 8088}}' for n in DNS_NAMES_8088),
    ]
    joined = ",\n  ".join(rules)
    return f"""
[egress]
internal_cidrs = ["198.51.100.0/24"]
ca_file = "{CA_FILE}"
max_request_bytes = 1024

[agents.{agent}]
tools = ["http_fetch"]
requests_per_minute = 100000
session_requests_per_minute = 100000
egress = [
  {joined},
]
"""


@dataclass
class World:
    sysd: SystemdHarness
    agent: str
    logs: Path
    stub: admin_pb2_grpc.AdminServiceStub

    def entries(self, name: str) -> list[dict[str, Any]]:
        path = self.logs / f"{name}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [e for e in map(json.loads, lines) if e.get("listener") != "ready"]

    def create(self, agent: str | None = None) -> str:
        created = self.stub.CreateSession(
            admin_pb2.CreateSessionRequest(agent=agent or self.agent), timeout=RPC_TIMEOUT
        )
        assert created.session.state == admin_pb2.SESSION_STATE_RUNNING, created
        return str(created.session.sid)

    def remove(self, sid: str) -> None:
        self.stub.RemoveSession(admin_pb2.RemoveSessionRequest(sid=sid, force=True), timeout=60)

    def fetch(self, sid: str, args: dict[str, Any]) -> str:
        """One turn: the mock model calls http_fetch with ``args``; the agent's reply text."""
        sent = self.stub.SendMessage(
            admin_pb2.SendMessageRequest(sid=sid, text="/tool http_fetch " + json.dumps(args)),
            timeout=RPC_TIMEOUT,
        )
        call = self.stub.WatchReplies(
            admin_pb2.WatchRepliesRequest(sid=sid, after_seq=sent.replies_before, follow=True),
            timeout=RPC_TIMEOUT,
        )
        try:
            for item in call:
                if item.reply.in_reply_to == sent.seq:
                    return str(item.reply.text)
        finally:
            call.cancel()
        pytest.fail(f"no reply to {args}")

    def cursor(self) -> int:
        """Where the audit log ends now (its size in bytes)."""
        return int(out(self.sysd.run(["stat", "-c", "%s", AUDIT_LOG])).strip())

    def decisions(self, sid: str, after: int, count: int) -> list[dict[str, Any]]:
        """The session's egress decisions recorded in the audit log after ``after``, once at
        least ``count`` are there, as ``IRONCLAW_*`` fields like the journal's. The audit log
        is the complete record: the journal's lines are throttled per session and verdict (a box
        decides how many requests it makes), and decisions are group-committed within
        milliseconds of the answer."""

        def read() -> list[dict[str, Any]]:
            proc = self.sysd.run(["tail", "-c", f"+{after + 1}", AUDIT_LOG])
            records = [json.loads(line) for line in proc.stdout.decode().splitlines() if line]
            return [r for r in records if r.get("event") == "egress.decision"
                    and r.get("actor") == f"session:{sid}"]  # fmt: skip

        found = wait_for(f"{count} egress decisions of {sid}", read, lambda r: len(r) >= count, 20)
        fields = ({f"IRONCLAW_{k.upper()}": str(v) for k, v in r.items()} for r in found)
        return [{**f, "MESSAGE": json.dumps(r), "IRONCLAW_EGRESS_VERDICT": r["verdict"]}
                for f, r in zip(fields, found, strict=True)]  # fmt: skip


def _wait_ready(log: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not (log.exists() and '"ready"' in log.read_text()):
        if time.monotonic() > deadline:
            pytest.fail(f"test server did not start: {log}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def world(daemon: SystemdHarness) -> Iterator[World]:
    tag = secrets.token_hex(4)
    ns, veth_host, veth_ns = f"ictest-eg-{tag}", f"iceg{tag}h", f"iceg{tag}n"
    units = (f"ictest-egress-ns-{tag}.service", f"ictest-egress-lo-{tag}.service")
    logs = RESULTS / f"egress-test-{tag}"
    logs.mkdir(parents=True)
    make_certs(logs)
    busy = sh(daemon, "ip -o addr show to 198.51.100.0/24; ss -Htln 'sport = :8088'")
    if out(busy).strip():
        pytest.skip(f"198.51.100.0/24 or port 8088 already in use here:\n{out(busy)}")
    python, script = sys.executable, ROOT / "tests/integration/egress_servers.py"
    credential_files = [f"/etc/ironclaw/credentials/{name}" for name in CREDENTIALS]
    write_credentials = "; ".join(
        f"printf %s '{value}' > {path}"
        for value, path in zip(CREDENTIALS.values(), credential_files, strict=True)
    )
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
            {python} {script} --ns --log {logs}/ns.jsonl --cert {logs}/server.pem \
            --key {logs}/server.key
        systemd-run --quiet --unit={units[1]} {python} {script} --loopback 8088 \
            --log {logs}/loopback.jsonl
        cp /etc/resolv.conf /etc/resolv.conf.egress-test
        rm -f /etc/resolv.conf
        printf 'nameserver {NS_ADDRESS}\\noptions timeout:2 attempts:1\\n' > /etc/resolv.conf
        install -m 0644 {logs}/ca.pem {CA_FILE}
        mkdir -p /etc/ironclaw/credentials
        (umask 077; {write_credentials})
    """
    teardown = f"""
        systemctl stop {" ".join(units)} 2>/dev/null
        ip link del {veth_host} 2>/dev/null
        ip netns del {ns} 2>/dev/null
        if [ -e /etc/resolv.conf.egress-test ]; then
            mv -f /etc/resolv.conf.egress-test /etc/resolv.conf; fi
        rm -f {CA_FILE} {" ".join(credential_files)} {CONFIG}
        systemctl reset-failed ironclawd; systemctl restart ironclawd
    """
    agent = f"fetch-{tag}"
    try:
        proc = sh(daemon, setup)
        assert proc.returncode == 0, out(proc)
        _wait_ready(logs / "ns.jsonl")
        _wait_ready(logs / "loopback.jsonl")
        daemon.run(["tee", CONFIG], input=agent_config(agent).encode(), check=True)
        proc = daemon.run(["systemctl", "restart", "ironclawd.service"], timeout=120)
        assert proc.returncode == 0, out(proc)
        with grpc.insecure_channel(f"unix:{daemon.host_path(ADMIN_SOCKET)}") as channel:
            yield World(daemon, agent, logs, admin_pb2_grpc.AdminServiceStub(channel))
    finally:
        sh(daemon, teardown, timeout=120)
        shutil.rmtree(logs, ignore_errors=True)


@pytest.fixture
def session(world: World) -> Iterator[str]:
    sid = world.create()
    yield sid
    world.remove(sid)


def test_egress_socket_only_for_sessions_with_grants(world: World, session: str) -> None:
    sockets = world.sysd.host_path(f"/run/ironclaw/sessions/{session}")
    assert (sockets / "egress.sock").exists()
    other = world.create("demo")
    try:
        names = sorted(p.name for p in world.sysd.host_path(f"/run/ironclaw/sessions/{other}")
                       .iterdir())  # fmt: skip
        assert "egress.sock" not in names, names
        assert "model.sock" in names
    finally:
        world.remove(other)


def test_allowed_request_reaches_the_test_server_and_the_reply_returns(
    world: World, session: str
) -> None:
    mark = world.cursor()
    reply = world.fetch(session, {"url": "https://api.egress.test/v1/hello?x=1", "headers": {
        "Authorization": "Bearer agent-made", "Cookie": "c=1", "X-Trace": "t1"}})  # fmt: skip
    assert "HTTP 200 OK" in reply, reply
    assert "hello from https /v1/hello?x=1" in reply, reply
    (seen,) = [e for e in world.entries("ns") if e.get("path") == "/v1/hello?x=1"]
    headers = {k.lower(): v for k, v in seen["headers"]}
    assert headers["host"] == "api.egress.test"
    assert headers["x-trace"] == "t1"
    assert "authorization" not in headers
    assert "cookie" not in headers
    assert {"listener": "sni", "name": "api.egress.test"}.items() <= next(
        e for e in world.entries("ns") if e.get("listener") == "sni"
    ).items()
    (decision,) = world.decisions(session, mark, 1)
    assert decision["IRONCLAW_EGRESS_VERDICT"] == "allowed"
    assert decision["IRONCLAW_ADDRESS"] == NS_ADDRESS
    assert decision["IRONCLAW_STATUS"] == "200"
    assert decision["IRONCLAW_PATH"] == "/v1/hello"
    assert decision["IRONCLAW_HOST"] == "api.egress.test"
    assert "stripped Authorization, Cookie" in decision["IRONCLAW_REASON"]
    for key in ("IRONCLAW_PORT", "IRONCLAW_RULE", "IRONCLAW_BYTES_IN", "IRONCLAW_DURATION_MS",
                "IRONCLAW_METHOD"):  # fmt: skip
        assert decision[key], key


def test_the_journal_never_holds_a_requests_query(world: World, session: str) -> None:
    """The broker records the path, never the query (queries carry tokens), and no library it
    uses may log the whole URL: httpx logs every request at INFO as "HTTP Request: GET
    https://host/path?query", and the journal is readable by the adm and systemd-journal
    groups, not only by root."""
    token = secrets.token_hex(12)
    reply = world.fetch(session, {"url": f"https://api.egress.test/v1/hello?token={token}"})
    assert "HTTP 200 OK" in reply, reply
    assert f"hello from https /v1/hello?token={token}" in reply, reply  # it did go upstream

    def journal() -> str:
        proc = world.sysd.run(["journalctl", "-u", "ironclawd", "-o", "json", "--no-pager", "-q"])
        return str(proc.stdout.decode(errors="replace"))

    # The broker's own line for the request is logged after the answer, so once it is in the
    # journal, so is anything logged while the request was made.
    text = wait_for("the session's egress line in the journal", journal,
                    lambda t: f"egress session {session}: allowed GET api.egress.test" in t,
                    20)  # fmt: skip
    assert token not in text


# Everything the agent could learn the credentials from: the values, Basic's user:password and
# the password alone. Replies and audit records are searched for them with one helper.
SECRETS = [*CREDENTIALS.values(), f"alice:{PASSWORD}", PASSWORD]
REFUSED = "error: egress PERMISSION_DENIED: egress: response refused"


def served(world: World, path: str) -> tuple[dict[str, str], bytes]:
    """What the test server received for ``path`` (headers) and sent back (raw bytes)."""
    entries = world.entries("ns")
    (request,) = [e for e in entries if e.get("path") == path]
    (answer,) = [e for e in entries if e.get("sent_for") == path]
    return {k.lower(): v for k, v in request["headers"]}, base64.b64decode(answer["sent"])


def no_leak(reply: str, decisions: list[dict[str, Any]]) -> list[str]:
    """Leaks of any credential, in any encoding, in the reply and the audit records."""
    records = json.dumps([{k: v for k, v in d.items() if k.startswith(("MESSAGE", "IRONCLAW"))}
                          for d in decisions])  # fmt: skip
    return find_leaks(reply, SECRETS) + find_leaks(records, SECRETS)


def test_injected_credential_reaches_upstream_but_never_the_agent(
    world: World, session: str
) -> None:
    """Issue 10, escape 1: an echo of the request headers, asked for gzip by the agent, or
    compressed by an upstream that ignores the broker's Accept-Encoding."""
    mark = world.cursor()
    plain = world.fetch(session, {"url": "https://keyed.egress.test/v1/echo"})
    asked = world.fetch(session, {"url": "https://keyed.egress.test/v1/echo-gzip",
                                  "headers": {"Accept-Encoding": "gzip"}})  # fmt: skip
    forced = world.fetch(session, {"url": "https://keyed.egress.test/v1/always-gzip"})
    for path in ("/v1/echo", "/v1/echo-gzip", "/v1/always-gzip"):
        headers, sent = served(world, path)
        assert headers["authorization"] == f"Bearer {TOKEN}", headers  # control: injected
        assert headers["accept-encoding"] == "identity", headers
        assert find_leaks(sent, [TOKEN]), f"control: {path} sent the credential back"
    assert gzip.decompress(served(world, "/v1/always-gzip")[1].split(b"\r\n\r\n", 1)[1])
    assert REFUSED in plain, plain
    assert "body carries the injected credential" in plain, plain
    assert REFUSED in asked, asked
    assert "body carries the injected credential" in asked, asked
    assert REFUSED in forced, forced
    assert "Content-Encoding gzip cannot be inspected" in forced, forced
    decisions = world.decisions(session, mark, 3)
    assert [d["IRONCLAW_EGRESS_VERDICT"] for d in decisions] == ["failed"] * 3
    assert all("response refused" in d["IRONCLAW_REASON"] for d in decisions)
    assert "stripped Accept-Encoding" in decisions[1]["IRONCLAW_REASON"]
    assert not no_leak(plain + asked + forced, decisions)


def test_the_reason_phrase_is_the_standard_one(world: World, session: str) -> None:
    mark = world.cursor()
    reply = world.fetch(session, {"url": "https://keyed.egress.test/v1/reason"})
    _, sent = served(world, "/v1/reason")
    assert sent.startswith(f"HTTP/1.1 401 Unauthorized Bearer {TOKEN}\r\n".encode())  # control
    assert "HTTP 401 Unauthorized\nContent-Type" in reply, reply
    assert "\n\ndenied" in reply, reply
    decisions = world.decisions(session, mark, 1)
    assert decisions[0]["IRONCLAW_EGRESS_VERDICT"] == "allowed"
    assert not no_leak(reply, decisions)


# (path prefix of the rule, encoding the test server applies to the credential it received)
REFLECTIONS = [
    *(("/v1/", form) for form in ("pct-lower", "b64", "b64url-nopad", "b64-shift1", "b64-shift2",
                                  "hex-upper")),
    *(("/v2/", form) for form in ("json-slash", "json-u", "pct-upper", "plus", "b64-shift1")),
    *(("/basic/", form) for form in ("password", "password-b64url", "json-u", "b64-shift2")),
]  # fmt: skip


def test_encoded_reflections_of_the_credential_are_refused_and_audited(
    world: World, session: str
) -> None:
    mark = world.cursor()
    failures, replies = [], []
    for prefix, form in REFLECTIONS:
        path = f"{prefix}reflect/{form}"
        reply = world.fetch(session, {"url": f"https://keyed.egress.test{path}"})
        replies.append(reply)
        headers, sent = served(world, path)
        injected = headers.get("authorization") or headers.get("x-api-key")
        if not find_leaks(sent, SECRETS) or not injected:
            failures.append(f"control: {path}: nothing to leak ({headers}, {sent!r})")
        if REFUSED not in reply or "body carries the injected credential" not in reply:
            failures.append(f"{path}: not refused: {reply}")
    assert not failures, "\n".join(failures)
    assert served(world, "/v2/reflect/plus")[0]["x-api-key"] == f"Bearer {TOKEN_PUNCT}"
    assert served(world, "/basic/reflect/password")[0]["authorization"] == f"Basic {TOKEN_BASIC}"
    decisions = world.decisions(session, mark, len(REFLECTIONS))
    assert len(decisions) == len(REFLECTIONS)
    assert {d["IRONCLAW_EGRESS_VERDICT"] for d in decisions} == {"failed"}
    assert not no_leak("\n".join(replies), decisions)


# (arguments, what the refusal must say): requests that would carry or mirror a credential.
CARRYING: list[tuple[dict[str, Any], str]] = [
    ({"url": "https://keyed.egress.test/v1/h1", "headers": {"authorization": "Bearer guess"}},
     "header authorization: this rule injects its own credential"),
    ({"url": "https://keyed.egress.test/v2/h2", "headers": {"x-API-key": "guess"}},
     "header x-API-key: this rule injects its own credential"),
    ({"url": "https://keyed.egress.test/v1/h3?api_key=guess"}, "query parameter api_key"),
    ({"url": "https://keyed.egress.test/v1/h4?Access-Token=guess"},
     "query parameter Access-Token"),
    ({"url": f"https://keyed.egress.test/v2/h5?q={quote(TOKEN_PUNCT, safe='')}"},
     "request's query carries the rule's credential"),
    # Upper case: the model proxy would redact the exact value on its way through the mock model.
    ({"url": f"https://keyed.egress.test/v1/h6/{TOKEN.upper()}"},
     "request's path carries the rule's credential"),
    ({"url": "https://keyed.egress.test/basic/h7",
      "headers": {"X-Note": base64.b64encode(PASSWORD.encode()).decode()}},
     "request's header X-Note carries the rule's credential"),
    ({"url": "https://keyed.egress.test/v1/h8", "headers": {"Range": "bytes=0-9"}},
     "range requests are refused"),
]  # fmt: skip


def test_requests_carrying_or_mirroring_a_credential_never_leave(
    world: World, session: str
) -> None:
    before = len(world.entries("ns"))
    mark = world.cursor()
    failures = []
    for args, fragment in CARRYING:
        reply = world.fetch(session, args)
        if "error: egress PERMISSION_DENIED" not in reply or fragment not in reply:
            failures.append(f"{args}: expected '{fragment}', got: {reply}")
    assert not failures, "\n".join(failures)
    assert [e for e in world.entries("ns")[before:] if "path" in e] == []  # nothing reached it
    decisions = world.decisions(session, mark, len(CARRYING))
    assert [d["IRONCLAW_EGRESS_VERDICT"] for d in decisions] == ["denied"] * len(CARRYING)
    for (_args, fragment), decision in zip(CARRYING, decisions, strict=True):
        assert fragment in decision["IRONCLAW_REASON"], decision["MESSAGE"]
        assert not decision.get("IRONCLAW_ADDRESS"), decision  # refused before resolving
    assert decisions[5]["IRONCLAW_PATH"] == "[withheld: it carries the credential]"
    # The refusals name where, never what: the agent learns nothing it did not send.
    assert not no_leak("", decisions)


def test_redirects_come_back_unfollowed(world: World, session: str) -> None:
    reply = world.fetch(session, {"url": "http://plain.egress.test/redirect"})
    assert "HTTP 302 Found" in reply, reply
    assert "Location: http://127.0.0.1:8088/stolen" in reply, reply
    assert world.entries("loopback") == []


# (arguments, gRPC code, what the refusal must say) — every refusal class of issue 6.
HOSTILE: list[tuple[dict[str, Any], str, str]] = [
    ({"url": "https://other.example.test/v1/"}, "PERMISSION_DENIED", "no rule for host"),
    ({"url": "https://plain.egress.test/"}, "PERMISSION_DENIED", "no rule for scheme 'https'"),
    ({"url": "https://api.egress.test:8081/v1/x"}, "PERMISSION_DENIED", "no rule for port 8081"),
    ({"method": "DELETE", "url": "https://api.egress.test/v1/x"}, "PERMISSION_DENIED",
     "no rule for method DELETE"),
    ({"url": "https://api.egress.test/admin"}, "PERMISSION_DENIED", "no rule for path '/admin'"),
    ({"url": "https://api.egress.test/v1/../admin"}, "INVALID_ARGUMENT", "dot segments"),
    ({"url": "https://api.egress.test/v1/%2e%2E/admin"}, "INVALID_ARGUMENT", "dot segments"),
    ({"url": "https://svc.egress.test/"}, "PERMISSION_DENIED", "no rule for host 'svc.egress"),
    ({"url": "https://api.egress.test.evil.test/v1/"}, "PERMISSION_DENIED", "no rule for host"),
    ({"url": "https://api.egress.test@127.0.0.1:8088/v1/"}, "INVALID_ARGUMENT", "userinfo"),
    ({"url": "ftp://api.egress.test/v1/"}, "PERMISSION_DENIED", "scheme 'ftp'"),
    ({"url": "http://[::1]:8088/"}, "PERMISSION_DENIED", "no rule for host '::1'"),
    ({"url": "http://127.0.0.1:8088/v1/"}, "PERMISSION_DENIED", "a loopback address"),
    ({"url": "http://2130706433:8088/"}, "PERMISSION_DENIED", "non-canonical numeric"),
    ({"url": "http://0x7f000001:8088/"}, "PERMISSION_DENIED", "non-canonical numeric"),
    ({"url": "http://0177.0.0.1:8088/"}, "PERMISSION_DENIED", "non-canonical numeric"),
    ({"url": "http://127.1:8088/"}, "PERMISSION_DENIED", "non-canonical numeric"),
    ({"url": "http://169.254.169.254/latest/meta-data/"}, "PERMISSION_DENIED",
     "cloud metadata address"),
    ({"url": "http://loop.egress.test:8088/"}, "PERMISSION_DENIED", "a loopback address"),
    ({"url": "http://private.egress.test:8088/"}, "PERMISSION_DENIED", "a private address"),
    ({"url": "http://cgnat.egress.test:8088/"}, "PERMISSION_DENIED", "CGNAT"),
    ({"url": "http://meta.egress.test:8088/"}, "PERMISSION_DENIED", "cloud metadata address"),
    ({"url": "http://mcast.egress.test:8088/"}, "PERMISSION_DENIED", "multicast address"),
    ({"url": "http://zero.egress.test:8088/"}, "PERMISSION_DENIED", "unspecified address"),
    ({"url": "http://mixed.egress.test:8088/"}, "PERMISSION_DENIED",
     "resolves to 127.0.0.1, a loopback"),
    ({"url": "http://mapped.egress.test:8088/"}, "PERMISSION_DENIED", "IPv4-mapped"),
    ({"url": "http://meta6.egress.test:8088/"}, "PERMISSION_DENIED", "cloud metadata address"),
    ({"url": "https://api.egress.test/v1/h", "headers": {"X-A": "a\r\nX-Injected: 1"}},
     "PERMISSION_DENIED", "CR, LF and NUL"),
    ({"url": "https://api.egress.test/v1/h",
      "headers": [["Host", "api.egress.test"], ["Host", "evil.test"]]},
     "PERMISSION_DENIED", "duplicate framing header"),
    ({"url": "https://api.egress.test/v1/h", "headers": {"Host": "evil.test"}},
     "PERMISSION_DENIED", "differs from the URL's host"),
    ({"method": "POST", "url": "https://api.egress.test/v1/h", "body": "x",
      "headers": {"Transfer-Encoding": "chunked"}}, "PERMISSION_DENIED", "frames the body"),
    ({"method": "POST", "url": "https://api.egress.test/v1/h", "body": "x",
      "headers": {"Content-Length": "100"}}, "PERMISSION_DENIED", "does not match the body"),
    ({"method": "POST", "url": "https://api.egress.test/v1/h", "body": "x" * 2000},
     "PERMISSION_DENIED", "exceeds the cap of 1024"),
    ({"url": "https://wrong.egress.test/"}, "UNAVAILABLE", "CERTIFICATE_VERIFY_FAILED"),
]  # fmt: skip


def test_hostile_requests_are_denied_logged_and_never_reach_a_server(
    world: World, session: str
) -> None:
    before = len(world.entries("ns"))
    # DNS rebinding: the first answer (198.51.100.1, allowed) is used for the one connection;
    # the name's next answer is loopback, and that request is refused before any connect.
    mark = world.cursor()
    first = world.fetch(session, {"url": "http://rebind.egress.test:8088/rebind"})
    assert "hello from http-8088 /rebind" in first, first
    cases = [*HOSTILE, ({"url": "http://rebind.egress.test:8088/rebind2"}, "PERMISSION_DENIED",
                        "rebind.egress.test resolves to 127.0.0.1, a loopback")]  # fmt: skip
    assert len(cases) >= 25
    failures = []
    for args, code, fragment in cases:
        reply = world.fetch(session, args)
        if f"error: egress {code}" not in reply or fragment not in reply:
            failures.append(f"{args}: expected {code} '{fragment}', got: {reply}")
    assert not failures, "\n".join(failures)

    decisions = world.decisions(session, mark, len(cases) + 1)
    assert len(decisions) == len(cases) + 1, [d["MESSAGE"] for d in decisions]
    assert decisions[0]["IRONCLAW_EGRESS_VERDICT"] == "allowed"
    for (args, _code, fragment), decision in zip(cases, decisions[1:], strict=True):
        assert decision["IRONCLAW_EGRESS_VERDICT"] in ("denied", "failed"), decision["MESSAGE"]
        assert fragment in decision["IRONCLAW_REASON"], (args, decision["MESSAGE"])
    # A NUL never reaches the broker: the session socket's input boundary refuses it first.
    nul = world.fetch(
        session, {"url": "https://api.egress.test/v1/h", "headers": {"X-A": "a\u0000b"}}
    )
    assert "error: egress INVALID_ARGUMENT" in nul, nul
    assert "NUL characters are not allowed" in nul, nul

    # What the servers saw: the one allowed rebinding request and a TLS handshake that failed
    # for wrong.egress.test; no HTTP request of any hostile case, nothing on the canaries.
    seen = world.entries("ns")[before:]
    http = [e for e in seen if "path" in e]
    assert [e["path"] for e in http] == ["/rebind"], http
    assert [e for e in seen if e["listener"] == "canary-8081"] == []
    assert world.entries("loopback") == []
    rebind_queries = [e for e in seen if e.get("name") == "rebind.egress.test" and e["qtype"] == 1]
    assert len(rebind_queries) == 2, rebind_queries  # resolved once per request, never twice
