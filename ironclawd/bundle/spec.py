"""Policy -> OCI runtime-spec ``config.json`` (pure), and the checks every emitted spec must pass.

``build_spec`` turns a ``SandboxPolicy`` into a config.json dict for runsc; ``check_spec`` refuses
any spec that lacks one of the walls of docs/architecture.md §2 B1/§3, whoever built it. Facts about
runsc 0.0~20221219 (OCI spec 1.0.2-dev) that shaped the rules were seen on this project's test
machines and are cited where they matter:

* No user namespace in the spec. runsc puts only its *gofer* (the host-side file server) into a
  spec user namespace and setuid(0)s it there, so container uid 0 must be mapped: a mapping of
  size 1 that leaves 0 unmapped fails with "gofer: fork/exec /proc/self/exe: invalid argument",
  a user namespace without mappings with "operation not permitted". The sentry ignores the
  mappings (inside, /proc/self/uid_map reads "0 0 4294967295"). With ``--network=none`` runsc
  always starts the sentry in a fresh user namespace of its own that maps only 65534 -> 65534 and
  runs it as that uid, so host root is unmapped for every process that runs agent code.
* gVisor does not translate ids through the gofer: files the agent creates on a bind mount are
  owned on the host by its inside uid, and host files are checked against that uid as-is.
* Without an explicit ``/tmp`` mount runsc adds an unbounded writable tmpfs there; without an
  explicit ``/dev`` mount its ``/dev`` lacks ``noexec``. Both are always mounted here.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ironclawd import paths
from ironclawd.bundle.grants import GRANTS_DIR, grant_refusal
from ironclawd.bundle.skills import SKILLS_DIR, skills_spec_problem
from ironclawd.domain.policy import SID_PATTERN, Mount, SandboxPolicy
from ironclawd.errors import SandboxError

OCI_VERSION = "1.0.2"
SID_ANNOTATION = "org.ironclaw.sid"
AGENT_ANNOTATION = "org.ironclaw.agent"

# Inside layout. Every destination must already exist in the agent rootfs: runsc 20221219's gofer
# creates a missing mountpoint *in the host rootfs* (it did, despite root.readonly) before it
# makes the root read-only, and that rootfs is shared by all sessions of an agent.
WORKSPACE_DIR = "/workspace"
SOCKETS_DIR = "/run/ironclaw"
KEY_FILE = "/run/ironclaw-key"
QUEUE_INBOUND_DIR = "/queue/inbound"
QUEUE_OUTBOUND_DIR = "/queue/outbound"
QUEUES_DIR = paths.STATE_DIR / "queues"

HYGIENE = ("nosuid", "nodev", "noexec")
CAPABILITY_SETS = ("bounding", "effective", "inheritable", "permitted", "ambient")
# The daemon must outlive its sandboxes when memory runs out: sandboxes go first.
OOM_SCORE_ADJ = 500
CPU_PERIOD_US = 100_000
# runc's defaults (libcontainer/specconv); gVisor serves its own /proc and /sys, so these are
# hygiene against a future runtime rather than a wall under runsc.
MASKED_PATHS = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
)  # fmt: skip
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
# Namespaces the sandbox gets fresh; only "network" may (and must) name a path.
FRESH_NAMESPACES = ("pid", "ipc", "uts", "mount")


def netns_path(sid: str) -> str:
    """The path of a session's empty network namespace (docs/architecture.md §8)."""
    return str(paths.NETNS_DIR / f"ironclaw-{sid}")


def session_mounts(sid: str, state_dir: Path = paths.STATE_DIR) -> tuple[Mount, ...]:
    """A session's host mounts: its sockets dir, its key, its queues (under ``state_dir``)."""
    queue = state_dir / QUEUES_DIR.name / sid
    return (
        Mount(SOCKETS_DIR, str(paths.SESSIONS_RUN_DIR / sid)),
        Mount(KEY_FILE, str(paths.KEYS_RUN_DIR / sid)),
        Mount(QUEUE_INBOUND_DIR, str(queue / "inbound")),
        Mount(QUEUE_OUTBOUND_DIR, str(queue / "outbound"), read_only=False),
    )


def _allowed_mounts(
    sid: str, granted: Sequence[Mount], state_dir: Path
) -> dict[str, tuple[str, str, bool]]:
    """destination -> (type, source, must be read-only), for this session only."""
    own = session_mounts(sid, state_dir)
    allowed = {m.destination: (m.type, m.source, m.read_only) for m in own}
    for mount in granted:
        refusal = grant_refusal(mount, sid, state_dir)
        if refusal is not None:
            raise _Refusal(*refusal)
        allowed[mount.destination] = (mount.type, mount.source, mount.read_only)
    allowed.update(
        {
            "/proc": ("proc", "proc", False),
            "/dev": ("tmpfs", "tmpfs", False),
            "/tmp": ("tmpfs", "tmpfs", True),
            WORKSPACE_DIR: ("tmpfs", "tmpfs", False),
        }
    )
    return allowed


REQUIRED_MOUNTS = ("/proc", "/dev", "/tmp", WORKSPACE_DIR)


def _fixed_mounts(policy: SandboxPolicy) -> list[dict[str, Any]]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": list(HYGIENE)},
        # /dev must stay writable: with "ro" runsc refused writes to /dev/null. Its device
        # nodes are gVisor's own, so "nodev" does not stop /dev/null working.
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": [*HYGIENE, "strictatime", "mode=755", "size=65536k"],
        },
        # An empty read-only /tmp keeps runsc from adding its own unbounded writable tmpfs.
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["ro", *HYGIENE, "size=4k", "mode=555"],
        },
        # The only writable place of the box; lost when the sandbox stops (docs/architecture.md §3).
        {
            "destination": WORKSPACE_DIR,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": [
                "rw",
                *HYGIENE,
                f"size={policy.workspace_bytes}",
                "mode=700",
                f"uid={policy.uid}",
                f"gid={policy.gid}",
            ],
        },
    ]


def _env(policy: SandboxPolicy) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": WORKSPACE_DIR, "TMPDIR": WORKSPACE_DIR}
    env.update(dict(policy.env))
    return [f"{name}={value}" for name, value in env.items()]


def build_spec(
    policy: SandboxPolicy, granted: Sequence[Mount] = (), state_dir: Path = paths.STATE_DIR
) -> dict[str, Any]:
    """The config.json for ``policy``'s sandbox; raises SandboxError if it fails ``check_spec``
    (``granted``: the agent's approved mounts among ``policy.mounts``, see ``check_spec``)."""
    mounts = _fixed_mounts(policy)
    mounts += [
        {
            "destination": m.destination,
            "type": m.type,
            "source": m.source,
            "options": m.oci_options(),
        }
        for m in policy.mounts
    ]
    spec: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "annotations": {SID_ANNOTATION: policy.sid, AGENT_ANNOTATION: policy.agent},
        "hostname": policy.hostname,
        "root": {"path": policy.rootfs, "readonly": True},
        "process": {
            "terminal": False,
            "user": {"uid": policy.uid, "gid": policy.gid},
            "args": list(policy.argv),
            "env": _env(policy),
            "cwd": WORKSPACE_DIR,
            "capabilities": {name: [] for name in CAPABILITY_SETS},
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "soft": policy.nofile, "hard": policy.nofile},
                {"type": "RLIMIT_CORE", "soft": 0, "hard": 0},
            ],
            "noNewPrivileges": True,
            "oomScoreAdj": OOM_SCORE_ADJ,
        },
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": kind} for kind in FRESH_NAMESPACES]
            + [{"type": "network", "path": policy.netns}],
            "resources": {
                "memory": {"limit": policy.memory_bytes},
                "pids": {"limit": policy.tasks_max},
                "cpu": {
                    "quota": policy.cpu_percent * CPU_PERIOD_US // 100,
                    "period": CPU_PERIOD_US,
                },
            },
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }
    check_spec(spec, granted, state_dir)
    return spec


def render_spec(spec: Mapping[str, Any]) -> str:
    """The canonical text of a spec: sorted keys, two-space indent, trailing newline."""
    return json.dumps(spec, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


class _Refusal(Exception):
    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"{rule}: {detail}")


def _obj(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Refusal("shape", f"{where}: expected an object")
    return value


def check_spec(
    spec: Mapping[str, Any], granted: Sequence[Mount] = (), state_dir: Path = paths.STATE_DIR
) -> None:
    """Refuse (SandboxError naming the rule) a spec that lacks any sandbox wall.

    ``granted`` are mounts the caller vouches for beyond the session's own (an agent's approved
    directories, from ``bundle.grants.granted_mounts``): each must be this session's frame at
    /mnt or a bind at /mnt/<name> of a host path that is none of the daemon's
    (``bundle.grants.grant_refusal``); the frame must come first. Its skill set
    (``bundle.skills.skills_mount``) is the only mount allowed at /skills: a read-only bind of a
    set directory under the state dir, with nosuid, nodev and noexec.

    Rules: ``shape``, ``sid``, ``hooks``, ``network``, ``namespaces``, ``user-namespace``,
    ``root-readonly``, ``capabilities``, ``no-new-privileges``, ``user``, ``devices``,
    ``mount-allowlist``, ``mount-granted``, ``mount-skills``, ``mount-order``,
    ``mount-readonly``, ``mount-hygiene``, ``mounts-required``.
    """
    try:
        _check(spec, granted, state_dir)
    except _Refusal as refusal:
        raise SandboxError(f"refusing spec: {refusal}") from None


def _check(spec: Mapping[str, Any], granted: Sequence[Mount], state_dir: Path) -> None:
    if not isinstance(spec, Mapping):
        raise _Refusal("shape", "spec: expected an object")
    annotations = _obj(spec.get("annotations"), "annotations")
    sid = annotations.get(SID_ANNOTATION)
    if not isinstance(sid, str) or SID_PATTERN.fullmatch(sid) is None:
        raise _Refusal("sid", f"annotations.{SID_ANNOTATION}: expected a session id, got {sid!r}")
    # OCI hooks run on the host, as root, outside every wall (runtime-spec config.md "POSIX hooks").
    if _obj(spec.get("hooks"), "hooks"):
        raise _Refusal("hooks", "hooks: expected none (they run on the host as root)")
    linux = _obj(spec.get("linux"), "linux")
    process = _obj(spec.get("process"), "process")
    _check_namespaces(linux, sid)
    if _obj(spec.get("root"), "root").get("readonly") is not True:
        raise _Refusal("root-readonly", "root.readonly: expected true")
    capabilities = _obj(process.get("capabilities"), "process.capabilities")
    for name, caps in sorted(capabilities.items()):
        if caps:
            raise _Refusal(
                "capabilities", f"process.capabilities.{name}: expected empty, got {caps!r}"
            )
    if process.get("noNewPrivileges") is not True:
        raise _Refusal("no-new-privileges", "process.noNewPrivileges: expected true")
    _check_user(_obj(process.get("user"), "process.user"))
    # runtime-spec config-linux.md "Devices": nodes the runtime must create; gVisor has its own.
    if linux.get("devices"):
        raise _Refusal("devices", "linux.devices: expected none")
    _check_mounts(spec.get("mounts"), sid, granted, state_dir)


def _check_namespaces(linux: dict[str, Any], sid: str) -> None:
    namespaces = linux.get("namespaces") or []
    if not isinstance(namespaces, list) or not all(isinstance(ns, dict) for ns in namespaces):
        raise _Refusal("shape", "linux.namespaces: expected a list of objects")
    by_type = {ns.get("type"): ns for ns in namespaces}
    if len(by_type) != len(namespaces):
        raise _Refusal("namespaces", "linux.namespaces: expected each type once")
    network = by_type.get("network", {})
    if network.get("path") != netns_path(sid):
        raise _Refusal(
            "network",
            f"linux.namespaces: expected a network namespace with path {netns_path(sid)}, "
            f"got {network.get('path')!r}",
        )
    if "user" in by_type or linux.get("uidMappings") or linux.get("gidMappings"):
        raise _Refusal("user-namespace", _user_namespace_detail(linux))
    for kind in FRESH_NAMESPACES:
        if kind not in by_type or "path" in by_type[kind]:
            raise _Refusal("namespaces", f"linux.namespaces: expected a fresh {kind} namespace")


def _user_namespace_detail(linux: dict[str, Any]) -> str:
    for key in ("uidMappings", "gidMappings"):
        for mapping in linux.get(key) or []:
            container, host, size = (mapping.get(k) for k in ("containerID", "hostID", "size"))
            if not all(isinstance(v, int) for v in (container, host, size)):
                return f"linux.{key}: malformed mapping {mapping!r}"
            if container == 0 or host == 0 or host <= 0 < host + size:
                return f"linux.{key}: maps id 0 ({mapping!r}); root must never be mapped"
    return (
        "linux: expected no user namespace and no id mappings (runsc 20221219 applies them only "
        "to its gofer; the sentry runs in runsc's own namespace mapping 65534 only)"
    )


def _check_user(user: dict[str, Any]) -> None:
    for key in ("uid", "gid"):
        value = user.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise _Refusal("user", f"process.user.{key}: expected a non-zero id, got {value!r}")
    extra = user.get("additionalGids") or []
    if 0 in extra:
        raise _Refusal("user", "process.user.additionalGids: expected no gid 0")


def _check_mounts(mounts: object, sid: str, granted: Sequence[Mount], state_dir: Path) -> None:
    if not isinstance(mounts, list) or not all(isinstance(m, dict) for m in mounts):
        raise _Refusal("shape", "mounts: expected a list of objects")
    allowed = _allowed_mounts(sid, granted, state_dir)
    seen: set[str] = set()
    for mount in mounts:
        destination = _place(mount.get("destination"), seen)
        where = f"mount {destination}"
        expected = allowed.get(destination)
        actual = (mount.get("type"), mount.get("source"))
        if destination == SKILLS_DIR and (problem := skills_spec_problem(mount, expected)):
            raise _Refusal("mount-skills", f"{where}: {problem}")
        if expected is None or actual != expected[:2]:
            raise _Refusal("mount-allowlist", f"{where}: {actual!r} is not allowlisted")
        options = mount.get("options") or []
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise _Refusal("shape", f"{where}: options: expected a list of strings")
        read_only = "ro" in options
        if read_only and "rw" in options:
            raise _Refusal("mount-readonly", f"{where}: both ro and rw")
        if expected[2] and not read_only:
            raise _Refusal("mount-readonly", f"{where}: expected read-only")
        # Every writable mount: nosuid, nodev, noexec (docs/architecture.md §2 B1); the opposite
        # flags would override them, since mount(8) applies options left to right.
        undone = [flag for flag in ("suid", "dev", "exec") if flag in options]
        if undone:
            raise _Refusal("mount-hygiene", f"{where}: options {undone} undo nosuid/nodev/noexec")
        missing = [flag for flag in HYGIENE if flag not in options]
        if not read_only and missing:
            raise _Refusal("mount-hygiene", f"{where}: writable without {missing}")
    absent = [destination for destination in REQUIRED_MOUNTS if destination not in seen]
    if absent:
        raise _Refusal("mounts-required", f"mounts: expected {absent} (else runsc adds its own)")


def _place(destination: object, seen: set[str]) -> str:
    """A mount's destination, once, normalised, and after the frame if under /mnt; noted."""
    where = f"mount {destination}"
    if not isinstance(destination, str) or posixpath.normpath(destination) != destination:
        raise _Refusal("mount-allowlist", f"{where}: expected a normalised absolute path")
    if destination in seen:
        raise _Refusal("mount-allowlist", f"{where}: mounted twice")
    if destination.startswith(GRANTS_DIR + "/") and GRANTS_DIR not in seen:
        # Without the frame first, runsc would create the mountpoint in the shared rootfs.
        raise _Refusal("mount-order", f"{where}: expected after the {GRANTS_DIR} frame")
    seen.add(destination)
    return destination
