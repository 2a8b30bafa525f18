"""Red-team tier: attacks from where an attacker stands, inside a real session's sandbox.

`private_systemd` and `daemon` come from tests/harness/fixtures.py (loaded once for every tier by
tests/conftest.py), so `pytest tests/integration tests/redteam` boots one systemd. Here:

* `sessions`: creates real sessions with ``ironctl session create --agent demo`` and removes
  every one of them with ``ironctl session rm --force`` when the test ends, pass or fail.
* `Sandbox.probe(...)`: runs the red-team probe (tests/harness/probe.py: a test-only frozen
  program the ``daemon`` fixture adds to the agent image) *inside* the session's sandbox, as
  the agent's uid, with ``runsc exec``. runsc 20221219 reaches a sandbox over an abstract Unix
  socket that its ``run`` process created in the session's netns (abstract sockets belong to a
  network namespace), so ``runsc exec`` works only from inside that netns: ``nsenter`` into
  the namespace of the sandbox unit's main process (the session keeps no /run/netns name).
* `pooled_daemon(sysd)`: the daemon with a warm pool for the demo agent (``[pool]``), so that
  ``Sessions(sysd, pooled=True).create()`` claims a pre-started sandbox (and checks it did);
  attack modules parametrized over ``SANDBOX_KINDS`` run against both kinds of sandbox.
* `host_listener`: a TCP and a UDP socket on the host's 127.0.0.1 (the test process's netns,
  which the private systemd shares), recording whatever reaches them.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from ironclawd.domain.agents import BUILTIN
from tests.harness.fixtures import RESULTS
from tests.harness.polling import session_netns, wait_for
from tests.harness.pool import wait_pool_ready
from tests.harness.private_systemd import SystemdHarness
from tests.harness.probe import PROBE_IN_BOX
from tests.redteam.report import AttackResult, Ledger, collect_versions, write_report

AGENT = "demo"
RUNSC_ROOT = "/run/ironclaw/runsc"
PROBE_BINARY = PROBE_IN_BOX
RUNNING = "running"
# A cold sandbox (started for its session) and a warm pool's (started before any session,
# sealed to the one that claims it): attack modules parametrized over these run on both.
SANDBOX_KINDS = ("cold", "pooled")


def out(proc: Any) -> str:
    return (proc.stdout or b"").decode(errors="replace") + (proc.stderr or b"").decode(
        errors="replace"
    )


def sh(sysd: SystemdHarness, script: str, **kwargs: Any) -> Any:
    return sysd.run(["bash", "-c", script], **kwargs)


def sh_outbound(sysd: SystemdHarness, script: str, **kwargs: Any) -> Any:
    """``sh`` in ironclawd's outbound mount namespace, where the outbound tmpfs are mounted."""
    return sysd.run(sysd.in_outbound_ns(["bash", "-c", script]), **kwargs)


def journal_cursor(sysd: SystemdHarness) -> str:
    proc = sysd.run(["journalctl", "-n", "0", "--show-cursor", "--no-pager"])
    return out(proc).strip().rsplit("cursor: ", 1)[-1]


def journal_since(sysd: SystemdHarness, cursor: str, unit: str = "ironclawd.service") -> str:
    """The messages ``unit`` logged after ``cursor``, a line each. Filtered here, not with
    ``-u``: systemd 252's journalctl, given a match and ``--after-cursor`` whose entry does not
    match, skips the first matching entry (a refusal the daemon logged went unseen, stop 50).
    As ``-o cat`` did: every message whole (``--all``: JSON makes one over 4096 bytes null),
    one not UTF-8 decoded (JSON gives its bytes), and, as ``-u`` did, systemd's own lines about
    the unit (a sandbox unit's exit)."""
    argv = ["journalctl", "--no-pager", "--all", "-o", "json", "--after-cursor", cursor]
    lines = []
    for raw in out(sysd.run(argv, timeout=60)).splitlines():
        entry = json.loads(raw) if raw.startswith("{") else {}
        message = entry.get("MESSAGE")
        if isinstance(message, list):
            message = bytes(message).decode(errors="replace")
        if _about(entry, unit) and isinstance(message, str):
            lines.append(message)
    return "\n".join(lines)


def _about(entry: dict[str, Any], unit: str) -> bool:
    """Whether ``journalctl -u unit`` shows ``entry`` (journalctl(1): the unit's processes, and
    systemd's and root's messages about it)."""
    if entry.get("_SYSTEMD_UNIT") == unit:
        return True
    if entry.get("_PID") == "1" and entry.get("UNIT") == unit:
        return True
    root = entry.get("_UID") == "0"
    return root and unit in (entry.get("OBJECT_SYSTEMD_UNIT"), entry.get("COREDUMP_UNIT"))


def journal_with(sysd: SystemdHarness, cursor: str, needles: Iterable[str],
                 within: float = 10.0) -> str:  # fmt: skip
    """The daemon's journal since ``cursor`` once every one of ``needles`` is in it, or when
    ``within`` seconds have passed (the caller judges what is missing)."""
    wanted = list(needles)
    deadline = time.monotonic() + within
    while True:
        text = journal_since(sysd, cursor)
        if all(n in text for n in wanted) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


@dataclass
class Sandbox:
    """A running session, and the means to act from inside its sandbox."""

    sysd: SystemdHarness
    sid: str
    uid: int = BUILTIN[AGENT].uid
    gid: int = BUILTIN[AGENT].gid

    @property
    def unit(self) -> str:
        return f"ironclaw-sbx-{self.sid}.service"

    @property
    def container(self) -> str:
        return f"ironclaw-{self.sid}"

    @property
    def netns(self) -> str:
        """The session's netns, as the sandbox unit's main process (runsc's parent) holds it."""
        return session_netns(self.sysd, self.sid)

    def in_netns(self, *argv: str) -> list[str]:
        """``argv`` run as root inside the session's netns."""
        return ["nsenter", f"--net={self.netns}", *argv]

    def runsc(self, *argv: str, timeout: float = 60) -> Any:
        """``runsc`` as root from inside the session's netns (see the module docstring)."""
        return self.sysd.run(self.in_netns("runsc", f"--root={RUNSC_ROOT}", *argv), timeout=timeout)

    def probe(self, *args: str) -> dict[str, Any]:
        """The probe's report from inside the sandbox, run as the agent's uid/gid."""
        user = f"{self.uid}:{self.gid}"
        proc = self.runsc("exec", "--user", user, self.container, PROBE_BINARY, *args)
        assert proc.returncode == 0, out(proc)
        report: dict[str, Any] = json.loads(proc.stdout)
        return report

    def attacks(
        self, *categories: str, timeout: float = 300, **opts: object
    ) -> dict[str, dict[str, Any]]:
        """Run every attack of ``categories`` (redteam_probe/probes/) in one ``runsc exec`` as the
        agent's uid; each attack's raw outcome by id."""
        argv = [f"--probe-attack={c}" for c in categories]
        argv += [f"--probe-opt={key}={value}" for key, value in opts.items()]
        user = f"{self.uid}:{self.gid}"
        proc = self.runsc(
            "exec", "--user", user, self.container, PROBE_BINARY, *argv,
            timeout=timeout,
        )  # fmt: skip
        assert proc.returncode == 0, out(proc)
        attacks: dict[str, dict[str, Any]] = json.loads(proc.stdout)["attacks"]
        return attacks

    def send(self, text: str, timeout: float = 120) -> str:
        """One message through the host (``ironctl send``): the agent's reply text."""
        argv = ["ironctl", "--timeout", str(int(timeout)), "send", self.sid, "-", "--json"]
        proc = self.sysd.run(argv, input=text.encode(), timeout=timeout + 30)
        assert proc.returncode == 0, out(proc)
        return str(json.loads(proc.stdout)["reply"]["text"])

    def state(self) -> str:
        return str(self.shown()["state"])

    def shown(self) -> dict[str, Any]:
        """``ironctl session show --json`` of this session."""
        proc = self.sysd.run(["ironctl", "session", "show", self.sid, "--json"])
        assert proc.returncode == 0, out(proc)
        shown: dict[str, Any] = json.loads(proc.stdout)
        return shown


@dataclass
class Sessions:
    sysd: SystemdHarness
    created: list[Sandbox] = field(default_factory=list)
    pooled: bool = False  # each create claims a warm pool's sandbox (``pooled_daemon``)

    def create(self, agent: str = AGENT) -> Sandbox:
        if self.pooled:
            wait_pool_ready(self.sysd, agent)
        mark = journal_cursor(self.sysd)
        proc = self.sysd.run(["ironctl", "session", "create", "--agent", agent, "--json"])
        assert proc.returncode == 0, out(proc)
        sandbox = Sandbox(self.sysd, str(json.loads(proc.stdout)["sid"]))
        self.created.append(sandbox)
        assert sandbox.state() == RUNNING
        if self.pooled:
            claimed = f"session {sandbox.sid} running in a pooled sandbox"
            wait_for(claimed, lambda: journal_since(self.sysd, mark), lambda j: claimed in j, 30)
        return sandbox

    def remove_all(self) -> list[str]:
        failures = []
        for sandbox in self.created:
            proc = self.sysd.run(["ironctl", "session", "rm", "--force", sandbox.sid])
            if proc.returncode != 0:
                failures.append(f"{sandbox.sid}: {out(proc)}")
        return failures


@contextlib.contextmanager
def module_sessions(sysd: SystemdHarness, *, pooled: bool = False) -> Iterator[Sessions]:
    """Sessions for a whole module (one per batch of attacks), removed at its end."""
    made = Sessions(sysd, pooled=pooled)
    try:
        yield made
    finally:
        failures = made.remove_all()
        assert not failures, failures


@pytest.fixture
def sessions(daemon: SystemdHarness) -> Iterator[Sessions]:
    """Real sessions of the demo agent; all removed (``rm --force``) at the end of the test."""
    made = Sessions(daemon)
    yield made
    failures = made.remove_all()
    assert not failures, failures


@dataclass
class HostListener:
    """TCP and UDP sockets on the host's 127.0.0.1, same port."""

    tcp: socket.socket
    udp: socket.socket

    @property
    def port(self) -> int:
        return int(self.tcp.getsockname()[1])

    def accept(self, timeout: float) -> socket.socket | None:
        ready, _, _ = select.select([self.tcp], [], [], timeout)
        return self.tcp.accept()[0] if ready else None

    def receive(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.udp], [], [], timeout)
        return self.udp.recv(4096) if ready else None


@contextlib.contextmanager
def open_listener() -> Iterator[HostListener]:
    """A TCP and a UDP socket on the host's 127.0.0.1, same port."""
    for _ in range(20):
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.bind(("127.0.0.1", 0))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            udp.bind(("127.0.0.1", tcp.getsockname()[1]))
        except OSError:
            tcp.close()
            udp.close()
            continue
        tcp.listen(8)
        try:
            yield HostListener(tcp, udp)
        finally:
            tcp.close()
            udp.close()
        return
    pytest.fail("no free port for a TCP and UDP listener pair on 127.0.0.1")


@pytest.fixture
def host_listener() -> Iterator[HostListener]:
    with open_listener() as listener:
        yield listener


# -- the containment report ---------------------------------------------------------------------


@dataclass
class Ledgers:
    """The run's two lists: attacks on the production sandbox, and the negative control."""

    attacks: Ledger = field(default_factory=Ledger)
    negative_control: Ledger = field(default_factory=Ledger)


@pytest.fixture(scope="session")
def ledgers(daemon: SystemdHarness) -> Iterator[Ledgers]:
    """Every attack of the run records here; at the end the signed report is written to
    results/ (tests/redteam/report.py), whatever passed or failed."""
    made = Ledgers()
    yield made
    if made.attacks.results() or made.negative_control.results():
        versions = collect_versions(lambda argv: daemon.run(argv, timeout=60))
        write_report(made.attacks.results(), made.negative_control.results(), versions, RESULTS)


@pytest.fixture(scope="session")
def ledger(ledgers: Ledgers) -> Ledger:
    """The session-wide attack ledger."""
    return ledgers.attacks


def record(
    ledger: Ledger,
    attack_id: str,
    category: str,
    title: str,
    contained: bool,
    evidence: str,
    *,
    stance: str = "sandbox",
    error: bool = False,
) -> AttackResult:
    """Record one attack; the caller then asserts ``contained``."""
    verdict = "error" if error else "contained" if contained else "escaped"
    result = AttackResult(attack_id, category, stance, title, verdict, evidence[:500])
    ledger.record(result)
    return result


CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each test's call-phase report, for fixtures that record the outcome as an attack."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.stash[CALL_REPORT] = report


def record_outcome(
    request: pytest.FixtureRequest,
    ledger: Ledger,
    attack_id: str,
    category: str,
    title: str,
    stance: str = "sandbox",
) -> None:
    """Record a finished test as one attack: contained if its assertions all held, escaped if
    one failed (its message is the evidence), error if it broke otherwise."""
    report = request.node.stash.get(CALL_REPORT, None)
    if report is None:
        return  # set-up failed: nothing was attacked
    if report.passed:
        record(ledger, attack_id, category, title, True, "every assertion of "
               f"{request.node.name} held (control and refusal)", stance=stance)  # fmt: skip
        return
    text = report.longreprtext.strip().splitlines()
    last = next(
        (line for line in reversed(text) if line.startswith("E ")), text[-1] if text else ""
    )
    error = "AssertionError" not in report.longreprtext
    record(ledger, attack_id, category, title, False, last[:400], stance=stance, error=error)
