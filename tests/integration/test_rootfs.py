"""The agent rootfs holds nothing an attacker could use, and the frozen agent runs in real runsc.

Builds the agent (cached by packaging/build-agent), assembles a rootfs with
``ironclawd.bundle.rootfs.assemble_rootfs`` and inspects it file by file; then boots it read-only
in a runsc sandbox (``--network=none``, ``--platform=ptrace``, uid 10000, no capabilities,
``noNewPrivileges``) and checks what the red-team probe sees from inside (a rootfs of the test
agent image: the agent plus the test-only probe, as ``scripts/install-dev --with-probe`` installs
it), and that the control-socket handshake crosses the sandbox wall over a read-only bind-mounted
socket directory. The static checks inspect the production image: the agent alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ironclawd.bundle.rootfs import assemble_rootfs
from ironclawd.errors import SandboxError
from tests.harness.probe import AGENT_IN_BOX, PROBE_IN_BOX, PROBE_SUBDIR
from tests.harness.probe import build as build_frozen

REPO = Path(__file__).resolve().parents[2]
BUILD_AGENT = REPO / "packaging" / "build-agent"
TEMPLATE = REPO / "oci-bundles" / "agent" / "rootfs"
AGENT_UID = AGENT_GID = 10000
RUNSC = shutil.which("runsc")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (root-owned rootfs, runsc)"),
]

SHELL_NAME = re.compile(r"[a-z]*sh(\d[\d.]*)?|busybox|toybox")
INTERPRETER_NAME = re.compile(
    r"(python|pypy|perl|ruby|node|nodejs|deno|bun|lua|luajit|php|tclsh|wish|java|"
    r"awk|gawk|mawk|nawk|sed|env|expect)[\d.]*m?"
)
ET_EXEC, ET_DYN, PT_INTERP = 2, 3, 3


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def frozen_dir() -> Path:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(BUILD_AGENT), "--python", sys.executable],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    out = Path(result.stdout.strip())
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and not p.is_symlink())
    # Measured, not asserted (docs/style.md §20): shown with -s.
    print(f"\nbuild-agent: {time.monotonic() - started:.1f} s, {size / 2**20:.1f} MiB, {out}")
    return out


@pytest.fixture(scope="module")
def rootfs(frozen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("rootfs") / "root"
    return assemble_rootfs(frozen_dir, TEMPLATE, dest)


@pytest.fixture(scope="module")
def probe_rootfs(frozen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rootfs of the test agent image: the agent with the probe's tree under ``probe/``."""
    image = tmp_path_factory.mktemp("test-image") / "agent"
    shutil.copytree(frozen_dir, image, symlinks=True)
    shutil.copytree(build_frozen("probe"), image / PROBE_SUBDIR, symlinks=True)
    return assemble_rootfs(image, TEMPLATE, tmp_path_factory.mktemp("probe-rootfs") / "root")


def _entries(root: Path) -> Iterator[Path]:
    yield root
    yield from sorted(root.rglob("*"))


# ---------------------------------------------------------------------------- static checks


def test_rootfs_holds_only_agent_template_libraries_and_mountpoints(rootfs: Path) -> None:
    assert sorted(os.listdir(rootfs)) == [
        "app",
        "dev",
        "etc",
        "lib",
        "lib64",
        "mnt",
        "proc",
        "queue",
        "run",
        "skills",
        "tmp",
        "workspace",
    ]
    assert sorted(os.listdir(rootfs / "queue")) == ["inbound", "outbound"]
    assert (rootfs / "run" / "ironclaw-key").is_file()  # a single-file bind lands on a file
    assert sorted(os.listdir(rootfs / "etc")) == ["group", "hosts", "nsswitch.conf", "passwd"]
    for mountpoint in ("dev", "proc", "tmp", "workspace", "run/ironclaw", "mnt", "skills"):
        assert os.listdir(rootfs / mountpoint) == []
    agent_line = "agent:x:10000:10000:"
    assert any(
        line.startswith(agent_line) for line in (rootfs / "etc/passwd").read_text().splitlines()
    )


def test_no_shell_and_no_interpreter_by_name(rootfs: Path) -> None:
    names = [p for p in _entries(rootfs) if not p.is_dir() or p.is_symlink()]
    assert names, "empty rootfs"
    assert [p for p in names if SHELL_NAME.fullmatch(p.name)] == []
    assert [p for p in names if INTERPRETER_NAME.fullmatch(p.name)] == []


def _elf_kind(path: Path) -> tuple[int, bool] | None:
    """(e_type, has PT_INTERP) of an ELF file, None for anything else (elf(5))."""
    with open(path, "rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF":
            return None
        # Only 64-bit little-endian is expected here; anything else fails loudly, never passes.
        assert header[4:6] == b"\x02\x01", f"{path}: unexpected ELF class/endianness"
        (e_type,) = struct.unpack_from("<H", header, 16)
        (e_phoff,) = struct.unpack_from("<Q", header, 32)
        e_phentsize, e_phnum = struct.unpack_from("<HH", header, 54)
        file.seek(e_phoff)
        table = file.read(e_phentsize * e_phnum)
    types = [struct.unpack_from("<I", table, i * e_phentsize)[0] for i in range(e_phnum)]
    return e_type, PT_INTERP in types


def test_no_executable_but_the_agent(rootfs: Path) -> None:
    runnable: list[str] = []
    scripts: list[str] = []
    elves = 0
    for path in _entries(rootfs):
        if path.is_symlink() or not path.is_file():
            continue
        kind = _elf_kind(path)
        if kind is None:
            if path.read_bytes()[:2] == b"#!":
                scripts.append(str(path.relative_to(rootfs)))
            continue
        elves += 1
        e_type, has_interp = kind
        if e_type == ET_EXEC or (e_type == ET_DYN and has_interp):
            runnable.append("/" + str(path.relative_to(rootfs)))
    assert elves > 10  # the agent, libpython, extension modules, glibc: not vacuous
    assert scripts == []
    # glibc's libc.so.6 carries a PT_INTERP so that running it prints its version banner; it is
    # a library the agent needs, not a tool. The ELF interpreter itself has no PT_INTERP.
    allowed = {AGENT_IN_BOX, "/lib/x86_64-linux-gnu/libc.so.6"}
    assert AGENT_IN_BOX in runnable
    assert set(runnable) <= allowed, set(runnable) - allowed


def test_no_python_source(rootfs: Path) -> None:
    assert [p for p in _entries(rootfs) if p.suffix in {".py", ".pyw", ".pyi", ".pyx"}] == []
    assert (rootfs / "app/agent/_internal/base_library.zip").is_file()


def test_everything_root_owned_read_only_no_setid(rootfs: Path) -> None:
    bad: list[str] = []
    count = 0
    for path in _entries(rootfs):
        info = path.lstat()
        count += 1
        mode = stat.S_IMODE(info.st_mode)
        where = "/" + str(path.relative_to(rootfs))
        if (info.st_uid, info.st_gid) != (0, 0):
            bad.append(f"{where}: owner {info.st_uid}:{info.st_gid}")
        if stat.S_ISLNK(info.st_mode):
            continue
        if mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
            bad.append(f"{where}: setuid/setgid/sticky {mode:o}")
        if stat.S_ISDIR(info.st_mode):
            expected: set[int] = {0o555}
        elif stat.S_ISREG(info.st_mode):
            expected = {0o444, 0o555}
        else:
            bad.append(f"{where}: neither file nor directory")
            continue
        if mode not in expected:
            bad.append(f"{where}: mode {mode:o}")
    assert count > 20
    assert bad == []


def test_assembly_is_all_or_nothing(frozen_dir: Path, tmp_path: Path) -> None:
    template = tmp_path / "template"
    (template / "etc").mkdir(parents=True)
    (template / "etc" / "passwd").write_text("agent:x:10000:10000::/workspace:/nonexistent\n")
    (template / "etc" / "shell").symlink_to("/bin/sh")
    parent = tmp_path / "out"
    parent.mkdir()
    with pytest.raises(SandboxError, match="symlink"):
        assemble_rootfs(frozen_dir, template, parent / "root")
    assert os.listdir(parent) == []  # no half-built tree, no leftover temp dir

    (template / "etc" / "shell").unlink()
    built = assemble_rootfs(frozen_dir, template, parent / "root")
    with pytest.raises(SandboxError, match="already exists"):
        assemble_rootfs(frozen_dir, template, built)
    assert os.listdir(parent) == ["root"]


# ---------------------------------------------------------------------------- in runsc


def _spec(rootfs: Path, args: list[str], extra_mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """A minimal hardened OCI spec; the product's own comes from ironclawd/bundle/spec.py."""
    tmpfs = ["nosuid", "nodev", "noexec"]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": AGENT_UID, "gid": AGENT_GID},
            "args": args,
            "env": ["PATH=/app/agent", "LANG=C.UTF-8"],
            "cwd": "/",
            "capabilities": {
                "bounding": [],
                "effective": [],
                "inheritable": [],
                "permitted": [],
                "ambient": [],
            },
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "sbx",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": tmpfs},
            # Without an explicit /tmp, runsc mounts an uncapped, exec-allowed tmpfs there.
            {
                "destination": "/tmp",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": [*tmpfs, "mode=1777", "size=8m"],
            },
            {
                "destination": "/workspace",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": [*tmpfs, "mode=1777", "size=16m"],
            },
            *extra_mounts,
        ],
        "linux": {
            "namespaces": [
                {"type": "pid"},
                {"type": "network"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
            ]
        },
    }


class Sandbox:
    """One runsc container in a private --root; always deleted by ``close``."""

    def __init__(self, workdir: Path, spec: dict[str, Any], *, host_uds: bool = False) -> None:
        assert RUNSC is not None
        self.state = workdir / "runsc-state"
        self.logs = workdir / "runsc-logs"
        bundle = workdir / "bundle"
        for d in (self.state, self.logs, bundle):
            d.mkdir(mode=0o700)
        (bundle / "config.json").write_text(json.dumps(spec))
        self.cid = f"ironclaw-test-{uuid.uuid4().hex[:12]}"
        self.argv = [
            RUNSC,
            "--root",
            str(self.state),
            "--network=none",
            "--platform=ptrace",
            # As the daemon does: otherwise runsc makes cgroups of its own at the host's roots.
            "--ignore-cgroups",
            f"--debug-log={self.logs}/",
            *(["--host-uds=open"] if host_uds else []),
            "run",
            "--bundle",
            str(bundle),
            self.cid,
        ]

    def start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def diagnostics(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in self.logs.glob("*"))

    def close(self) -> None:
        assert RUNSC is not None
        subprocess.run(
            [RUNSC, "--root", str(self.state), "delete", "-force", self.cid],
            capture_output=True,
            check=False,
            timeout=60,
        )
        listed = subprocess.run(
            [RUNSC, "--root", str(self.state), "list", "-quiet"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert self.cid not in listed.stdout, f"runsc container {self.cid} left behind"


needs_runsc = pytest.mark.skipif(RUNSC is None, reason="runsc not installed")


@needs_runsc
def test_probe_inside_runsc(probe_rootfs: Path, tmp_path: Path) -> None:
    rootfs = probe_rootfs
    sandbox = Sandbox(tmp_path, _spec(rootfs, [PROBE_IN_BOX], []))
    try:
        proc = sandbox.start()
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{stderr}\n{sandbox.diagnostics()}"
    finally:
        sandbox.close()
    probe = json.loads(stdout)

    assert probe["frozen"] is True
    assert probe["executable"] == PROBE_IN_BOX
    assert (probe["uid"], probe["euid"], probe["gid"], probe["egid"]) == (10000,) * 4
    assert probe["groups"] == []
    status = probe["status"]
    for field in ("CapEff", "CapPrm", "CapBnd", "CapInh"):
        assert status[field] == 0, field
    # runsc 20221219 omits CapAmb and NoNewPrivs from /proc/self/status; check them where shown
    # and always through prctl(PR_GET_NO_NEW_PRIVS).
    assert status.get("CapAmb", 0) == 0
    assert status.get("NoNewPrivs", 1) == 1
    assert probe["no_new_privs"] == 1

    assert probe["root"] == {"writable": False, "errno": probe["root"]["errno"]}
    assert probe["root"]["errno"] in {"EROFS", "EACCES"}
    root_mount = next(line.split() for line in probe["mounts"] if line.split()[1] == "/")
    assert "ro" in root_mount[3].split(",")

    assert probe["net_dev_interfaces"] == ["lo"]
    assert probe["sys_class_net"] in (None, ["lo"])
    assert probe["routes"] == []
    assert probe["resolv_conf_exists"] is False

    # gVisor's sentry answers uname and /proc/version itself with a fixed fake kernel (4.4.0);
    # the host's kernel must not show through.
    host_version = Path("/proc/version").read_text().strip()
    assert probe["proc_version"] != host_version
    assert probe["uname"]["release"] != os.uname().release
    assert "4.4.0" in probe["proc_version"]

    # runsc adds /sys itself (sysfs, even when the spec has no such mount); nothing else appears.
    assert set(probe["top_level"]) - {"sys"} == set(os.listdir(rootfs))


@needs_runsc
def test_agent_says_hello_and_reconnects_when_the_host_goes_away(
    rootfs: Path, tmp_path: Path
) -> None:
    """The agent greets the host over the mounted socket dir and, when the host closes the
    connection (a daemon restart), connects again and repeats its hello (adoption relies on it)."""
    sockets = tmp_path / "sockets"
    sockets.mkdir(mode=0o755)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sockets / "control.sock"))
    os.chmod(sockets / "control.sock", 0o666)
    listener.listen(1)
    listener.settimeout(120)
    bind = {
        "destination": "/run/ironclaw",
        "type": "bind",
        "source": str(sockets),
        "options": ["rbind", "ro", "nosuid", "nodev", "noexec"],
    }
    # The agent opens its session key and queues before it says hello (agent/loop.py).
    key = tmp_path / "key"
    key.write_text(os.urandom(32).hex())
    os.chown(key, AGENT_UID, AGENT_GID)  # gVisor checks host files against the agent's uid
    key.chmod(0o400)
    queues = [
        {"destination": "/run/ironclaw-key", "type": "bind", "source": str(key),
         "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]},
        {"destination": "/queue/inbound", "type": "tmpfs", "source": "tmpfs",
         "options": ["ro", "nosuid", "nodev", "noexec", "size=64k"]},
        {"destination": "/queue/outbound", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "noexec", "size=1m", f"uid={AGENT_UID}",
                     f"gid={AGENT_GID}", "mode=700"]},
    ]  # fmt: skip
    workdir = tmp_path / "sbx"
    workdir.mkdir()
    sandbox = Sandbox(workdir, _spec(rootfs, [AGENT_IN_BOX], [bind, *queues]), host_uds=True)
    lines = []
    proc = None
    try:
        proc = sandbox.start()
        for _attempt in range(2):
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                proc.kill()
                pytest.fail(f"agent did not connect: {sandbox.diagnostics()}")
            with conn:  # closing it plays the host going away
                conn.settimeout(60)
                lines.append(conn.makefile("rb").readline())
        assert proc.poll() is None, "the agent exited instead of reconnecting"
    finally:
        listener.close()
        sandbox.close()
        if proc is not None:  # reaped, its pipes closed: no ResourceWarning at collection
            proc.kill()
            proc.communicate(timeout=60)
    assert len(lines) == 2
    for line in lines:
        assert re.fullmatch(rb"hello [0-9]+ 10000 0\n", line), line
