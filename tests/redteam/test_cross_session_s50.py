"""Two sessions running side by side share no network namespace and no key (docs/architecture.md
§2, B3), attacked from inside one of them.

Each box sees only ``lo``, so a namespace shared by two sessions would not show from inside:
the host compares the namespaces the two sandbox units hold (with each other, with the host's
and with the daemon's), and from inside A the probe connects to B's runsc control socket, an
abstract Unix socket that exists only in B's namespace (root reaches it from there: the
control). Then A searches every file it can read for B's key and id, which B's own probe finds
(positive control).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import (
    RUNNING,
    Sandbox,
    module_sessions,
    out,
    record,
)
from tests.redteam.report import Ledger

pytestmark = pytest.mark.redteam

PYTHON = "/usr/bin/python3"
KEY_IN_BOX = "/run/ironclaw-key"
_CONNECT_ABSTRACT = (
    "import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
    "try:\n s.connect(sys.argv[1].replace('@', '\\0')); print('connected')\n"
    "except OSError as e:\n print(e.errno)\n"
)


@pytest.fixture(scope="module")
def pair(daemon: SystemdHarness) -> Iterator[tuple[Sandbox, Sandbox]]:
    with module_sessions(daemon) as sessions:
        a, b = sessions.create(), sessions.create()
        assert a.send("hello A").endswith("hello A")
        assert b.send("hello B").endswith("hello B")
        yield a, b


def _ns(sysd: SystemdHarness, path: str) -> str:
    proc = sysd.run(["readlink", path])
    assert proc.returncode == 0, out(proc)
    text = out(proc).strip()
    assert text.startswith("net:["), text
    return text


def _runsc_socket(box: Sandbox) -> str:
    """runsc's abstract control socket of ``box``, as /proc/net/unix in its netns shows it."""
    listing = out(box.sysd.run(box.in_netns("cat", "/proc/net/unix")))
    names = [line.split()[-1] for line in listing.splitlines() if box.container in line]
    assert names, f"control: no runsc socket of {box.sid} in its netns"
    assert names[0].startswith("@"), f"control: not an abstract socket: {names}"
    return names[0]


def test_two_sessions_hold_different_network_namespaces(
    pair: tuple[Sandbox, Sandbox], daemon: SystemdHarness, ledger: Ledger
) -> None:
    a, b = pair
    daemon_pid = out(daemon.run(["systemctl", "show", "-P", "MainPID", "ironclawd"])).strip()
    spaces = {
        "a": _ns(daemon, a.netns),
        "b": _ns(daemon, b.netns),
        "host": _ns(daemon, "/proc/self/ns/net"),
        "daemon": _ns(daemon, f"/proc/{daemon_pid}/ns/net"),
    }
    # A, B and the host each their own; the daemon is in the host's (by design: it serves
    # the sockets the boxes reach through their bind mounts, not through a network).
    distinct = len({spaces["a"], spaces["b"], spaces["host"]}) == 3
    assert spaces["daemon"] == spaces["host"], f"control: the daemon's netns {spaces}"
    # From inside A: B's runsc socket, which lives only in B's namespace.
    name = _runsc_socket(b)
    control = daemon.run(b.in_netns(PYTHON, "-c", _CONNECT_ABSTRACT, name))
    assert out(control).strip() == "connected", f"control: root in B's netns: {out(control)}"
    raw = a.attacks(
        "network", only="net.unix.host-abstract", abstract=name.replace("@", "\0").encode().hex()
    )["net.unix.host-abstract"]
    contained = distinct and raw["ok"] is False
    record(
        ledger, "isolation.cross-session.netns", "network",
        "reach another running session's network namespace (its runsc control socket)",
        contained,
        f"namespaces {spaces}; from A to B's {name[:40]!r}: "
        f"{raw['errno'] or ('connected' if raw['ok'] else 'refused')}: {raw['detail'][:120]}",
        error=raw["ok"] is None,
    )  # fmt: skip
    assert raw["ok"] is not None, raw
    assert distinct, spaces
    assert raw["ok"] is False, raw
    assert (a.state(), b.state()) == (RUNNING, RUNNING)


def test_a_session_finds_nothing_of_a_running_neighbours_key(
    pair: tuple[Sandbox, Sandbox], daemon: SystemdHarness, ledger: Ledger
) -> None:
    a, b = pair
    key_b = out(daemon.run(["cat", f"/run/ironclaw/keys/{b.sid}"])).strip()
    assert len(key_b) == 64, "control: B's key, 256 bits in hex"
    needles = {"key": key_b.encode().hex(), "sid": b.sid.encode().hex()}
    grep = [f"--probe-grep={h}" for h in needles.values()]
    # Positive control: inside B the probe finds B's key file and B's id.
    in_b = b.probe(*grep)["grep"]
    assert KEY_IN_BOX in in_b["hits"][needles["key"]], in_b
    assert in_b["hits"][needles["sid"]], in_b
    in_a = a.probe(*grep)["grep"]
    contained = in_a["files"] > 50 and not in_a["hits"][needles["key"]]
    contained = contained and not in_a["hits"][needles["sid"]]
    record(
        ledger, "secrets.cross-session.key", "secrets",
        "find a running neighbour session's queue key or id in any file the box can read",
        contained,
        f"searched {in_a['files']} files; B's key in {in_a['hits'][needles['key']]}, "
        f"B's id in {in_a['hits'][needles['sid']]} (inside B: key in "
        f"{in_b['hits'][needles['key']][:2]})",
    )  # fmt: skip
    assert in_a["files"] > 50, in_a  # it searched
    assert in_a["hits"][needles["key"]] == [], in_a
    assert in_a["hits"][needles["sid"]] == [], in_a
    assert (a.state(), b.state()) == (RUNNING, RUNNING)
