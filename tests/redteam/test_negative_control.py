"""The negative control: the same probe binary and rootfs in a deliberately weakened sandbox
must report escapes, in the same run, so a green gate is not a blind one.

A real session's bundle (``/var/lib/ironclaw/bundles/<sid>/config.json``) is copied and
weakened: runsc's ``--network=host`` (gVisor uses the network namespace runsc runs in), a
writable root (a private copy of the rootfs: the real one is shared by every session of the
agent), uid 0 with every capability and no no_new_privs, and none of the session's mounts. runsc
runs in a transient unit of the private systemd, inside a network namespace this test made to
stand in for the host's (loopback up, a listener on 127.0.0.1, an extra veth pair): test
traffic stays in namespaces the test creates. The probes report what they could do; the attacks
the weakening enables must be seen as escapes, and are recorded as the report's negative control.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.private_systemd import SystemdHarness
from tests.redteam.conftest import PROBE_BINARY, Ledgers, module_sessions, out, sh
from tests.redteam.report import AttackResult
from tests.redteam.test_attack_sandbox import SPECS

pytestmark = pytest.mark.redteam

TAG = secrets.token_hex(4)
NETNS = f"rt-neg-{TAG}"
WORK = f"/var/lib/ironclaw-redteam-neg-{TAG}"
ROOT = f"/run/ironclaw-redteam-neg-{TAG}"
CONTAINER = f"rt-neg-{TAG}"
PORT = 8099
# What the weakening enables, each seen by the same probe that is refused in production.
MUST_ESCAPE = {
    "net.tcp.host-loopback": "host network: a listener on the host's loopback is reached",
    "net.interfaces.beyond-lo": "host network: the host's interfaces are visible",
    "fs.root.write": "writable root",
    "fs.etc.write": "writable root",
    "fs.root.overwrite-agent": "writable root, uid 0",
    "priv.capabilities-held": "full capabilities",
    "priv.setuid-0": "uid 0",
    "priv.setgid-0": "uid 0",
    "fs.mount.tmpfs": "CAP_SYS_ADMIN",
    "fs.chroot": "CAP_SYS_CHROOT",
    "kernel.sethostname": "CAP_SYS_ADMIN",
}
CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
    "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
]  # fmt: skip
LISTENER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT})); s.listen(8)
open("{WORK}/listener.log", "a").write("ready\\n")
while True:
    c, _ = s.accept(); open("{WORK}/listener.log", "a").write("accepted\\n"); c.close()
"""


def weaken(spec: dict[str, Any], rootfs: str) -> dict[str, Any]:
    spec["root"] = {"path": rootfs, "readonly": False}
    process = spec["process"]
    process["user"] = {"uid": 0, "gid": 0}
    process["capabilities"] = {name: list(CAPS) for name in process["capabilities"]}
    process["noNewPrivileges"] = False
    process["args"] = [
        PROBE_BINARY, "--probe-attack=network", "--probe-attack=filesystem",
        "--probe-attack=kernel", f"--probe-opt=only={','.join(MUST_ESCAPE)}",
        f"--probe-opt=host_port={PORT}",
    ]  # fmt: skip
    spec["mounts"] = [
        {**m, "options": [o for o in m["options"] if o != "ro"]}
        for m in spec["mounts"] if m["destination"] in ("/proc", "/dev", "/tmp", "/workspace")
    ]  # fmt: skip
    linux = spec["linux"]
    linux["namespaces"] = [n for n in linux["namespaces"] if n["type"] != "network"]
    linux.pop("readonlyPaths", None)
    return spec


@pytest.fixture(scope="module")
def control_report(daemon: SystemdHarness) -> Iterator[dict[str, Any]]:
    with module_sessions(daemon) as sessions:
        box = sessions.create()
        bundle = json.loads(out(daemon.run(
            ["cat", f"/var/lib/ironclaw/bundles/{box.sid}/config.json"])))  # fmt: skip
        # The platform the daemon runs its sandboxes on, from the unit's command line.
        command = out(daemon.run(["systemctl", "show", "-P", "ExecStart", box.unit]))
        flavour = command.split("--platform=", 1)[1].split()[0].strip(";")
    rootfs = bundle["root"]["path"]
    setup = f"""
        set -e
        mkdir -p {WORK}/bundle {ROOT}
        cp -a {rootfs} {WORK}/rootfs
        ip netns add {NETNS}
        ip -n {NETNS} link set lo up
        ip -n {NETNS} link add rt-neg0 type veth peer name rt-neg1
        systemd-run --quiet --unit=rt-neg-listener-{TAG} \
            -p NetworkNamespacePath=/run/netns/{NETNS} /usr/bin/python3 -c '{LISTENER}'
        timeout 10 bash -c 'until grep -q ready {WORK}/listener.log 2>/dev/null; do sleep 0.1; done'

    """
    teardown = f"""
        runsc --root={ROOT} delete -force {CONTAINER} 2>/dev/null
        systemctl stop rt-neg-listener-{TAG} rt-neg-run-{TAG} 2>/dev/null
        ip netns del {NETNS} 2>/dev/null
        rm -rf {WORK} {ROOT}
    """
    try:
        proc = sh(daemon, setup, timeout=180)
        assert proc.returncode == 0, out(proc)
        spec = weaken(bundle, f"{WORK}/rootfs")
        daemon.run(["tee", f"{WORK}/bundle/config.json"], input=json.dumps(spec).encode(),
                   check=True)  # fmt: skip
        run = daemon.run([
            "systemd-run", "--quiet", "--wait", "--pipe", f"--unit=rt-neg-run-{TAG}",
            f"-pNetworkNamespacePath=/run/netns/{NETNS}", "runsc", f"--root={ROOT}",
            "--network=host", f"--platform={flavour}", "--ignore-cgroups", "run", "--bundle",
            f"{WORK}/bundle", CONTAINER,
        ], timeout=300)  # fmt: skip
        assert run.returncode == 0, out(run)
        report: dict[str, Any] = json.loads(run.stdout)["attacks"]
        report["_listener"] = out(daemon.run(["cat", f"{WORK}/listener.log"]))
        yield report
    finally:
        sh(daemon, teardown, timeout=120)


def test_weakened_sandbox_shows_the_escapes(
    control_report: dict[str, Any], ledgers: Ledgers
) -> None:
    seen = []
    for attack_id, why in MUST_ESCAPE.items():
        raw = control_report[attack_id]
        spec = SPECS[attack_id]
        escaped = raw["ok"] is True and not spec.inside(raw)
        evidence = f"{raw['errno'] or ('succeeded' if raw['ok'] else 'refused')}: {raw['detail']}"
        if attack_id == "net.tcp.host-loopback":
            accepted = "accepted" in control_report["_listener"]
            escaped = escaped and accepted
            evidence += f"; the listener accepted: {accepted}"
        ledgers.negative_control.record(
            AttackResult(attack_id, spec.category, "sandbox", f"{spec.title} [weakened: {why}]",
                         "escaped" if escaped else "contained", evidence[:500])
        )  # fmt: skip
        if not escaped:
            seen.append((attack_id, raw))
    assert not seen, f"the probes did not see what the weakening enables: {seen}"
