"""The sandbox policy: everything one session's sandbox is allowed to be, as a frozen value.

A ``SandboxPolicy`` is validated when it is made (docs/style.md §9: validate at the edge, name the
field and what was expected). It checks shape and ranges only; which host paths may be mounted is
decided by ``ironclawd.bundle.spec.check_spec``, which knows the host layout. Pure: no I/O.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from ironclawd import lazy_re
from ironclawd.errors import InvalidArgument

SID_PATTERN = lazy_re.compile(r"[a-z0-9]{8,32}")
AGENT_PATTERN = lazy_re.compile(r"[a-z][a-z0-9-]{0,62}")
# RFC 1123 host name label: what sethostname(2) inside the box and the unit name both accept.
HOSTNAME_PATTERN = lazy_re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
ENV_NAME_PATTERN = lazy_re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Mount options are single words or key=value; a comma would smuggle in a second option.
MOUNT_OPTION_PATTERN = lazy_re.compile(r"[a-z][a-z0-9_]*(?:=[A-Za-z0-9_.:+-]+)?")

# uid_t is 32 bits and (uid_t)-1 means "no change" to chown(2)/setresuid(2): never a real id.
MAX_ID = 2**32 - 2
MIB = 1024 * 1024
MIN_MEMORY_BYTES = 16 * MIB
MAX_MEMORY_BYTES = 1024 * 1024 * MIB
MAX_TASKS = 65536
MAX_CPU_PERCENT = 100 * 1024
MIN_WORKSPACE_BYTES = 1 * MIB
MAX_NOFILE = 1 << 20
MAX_ARGS = 256
MAX_ARG_CHARS = 4096
MAX_ENV = 256
MAX_ENV_VALUE_CHARS = 32768

MOUNT_TYPES = frozenset({"bind", "tmpfs"})
# Each of these would undo nosuid/nodev/noexec or the read-only flag the spec adds itself.
FORBIDDEN_MOUNT_OPTIONS = frozenset({"ro", "rw", "suid", "dev", "exec", "remount", "bind", "rbind"})
# Env names whose words say "secret": secrets reach the agent only through the proxy, never its
# environment (docs/architecture.md §2 B1, §5), and the environment lands in config.json on disk.
SECRET_ENV_WORDS = frozenset(
    {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PASSPHRASE", "CREDENTIAL",
     "CREDENTIALS", "AUTH", "AUTHORIZATION", "COOKIE", "PRIVATE", "BEARER"}
)  # fmt: skip
SECRET_VALUE_MARKERS = ("-----BEGIN", "sk-", "ghp_", "github_pat_", "xoxb-", "AKIA")


def _fail(name: str, expected: str, got: object) -> InvalidArgument:
    return InvalidArgument(f"{name}: expected {expected}, got {got!r}")


def _check_int(name: str, value: object, low: int, high: int) -> None:
    # bool is an int subclass; True as a uid is a bug, not a 1.
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _fail(name, f"an integer in [{low}, {high}]", value)


def _check_abs_path(name: str, value: object) -> None:
    if (
        not isinstance(value, str)
        or not value.startswith("/")
        or "\0" in value
        or posixpath.normpath(value) != value
        or value.startswith("//")
    ):
        raise _fail(
            name, "an absolute, normalised path (no '..', '//', trailing '/' or NUL)", value
        )


def _check_pattern(name: str, value: object, pattern: lazy_re.LazyPattern, expected: str) -> None:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise _fail(name, expected, value)


def is_secret_env_name(name: str) -> bool:
    """Whether an environment variable name looks like it carries a secret."""
    words = {word for word in name.upper().split("_") if word}
    upper = name.upper()
    return bool(words & SECRET_ENV_WORDS) or any(
        marker in upper for marker in ("SECRET", "PASSWORD", "PASSWD", "APIKEY")
    )


@dataclass(frozen=True)
class Mount:
    """One host path (``bind``) or in-sandbox tmpfs (``tmpfs``) to mount into the sandbox.

    ``options`` are extra filesystem options (e.g. ``size=1m``); ``ro``/``rw`` come from
    ``read_only`` and ``nosuid``/``nodev``/``noexec`` are always added by the spec builder.
    """

    destination: str
    source: str
    type: str = "bind"
    options: tuple[str, ...] = ()
    read_only: bool = True

    def __post_init__(self) -> None:
        _check_abs_path("mount.destination", self.destination)
        if self.destination == "/":
            raise _fail("mount.destination", "a path below '/' (the root is root.path)", "/")
        if self.type not in MOUNT_TYPES:
            raise _fail("mount.type", f"one of {sorted(MOUNT_TYPES)}", self.type)
        if self.type == "bind":
            _check_abs_path(f"mount {self.destination}: source", self.source)
        elif self.source != "tmpfs":
            raise _fail(f"mount {self.destination}: source", "'tmpfs' for a tmpfs", self.source)
        if not isinstance(self.options, tuple):
            raise _fail(f"mount {self.destination}: options", "a tuple of strings", self.options)
        for option in self.options:
            if not isinstance(option, str) or MOUNT_OPTION_PATTERN.fullmatch(option) is None:
                raise _fail(f"mount {self.destination}: options", "word or key=value", option)
            if option in FORBIDDEN_MOUNT_OPTIONS:
                raise _fail(
                    f"mount {self.destination}: options",
                    "no ro/rw/suid/dev/exec/bind (set read_only; hygiene flags are implied)",
                    option,
                )
        if not isinstance(self.read_only, bool):
            raise _fail(f"mount {self.destination}: read_only", "a bool", self.read_only)

    def oci_options(self) -> list[str]:
        """The mount's ``options`` list for config.json, hygiene flags included."""
        # runtime-spec config.md "Mounts": options are mount(8)-style; runsc 20221219 takes a
        # bind mount's read-only-ness from "ro" and treats "bind"/"rbind" as type=bind.
        base = ["rbind"] if self.type == "bind" else []
        base += ["ro" if self.read_only else "rw", "nosuid", "nodev", "noexec"]
        return base + [option for option in self.options if option not in base]


@dataclass(frozen=True)
class SandboxPolicy:
    """What one session's sandbox may be: identity, program, limits and mounts.

    ``uid``/``gid`` are the agent's ids inside the sandbox; ``host_uid``/``host_gid`` are the host
    ids they act as. runsc 20221219 does not translate ids for files served by its gofer (see
    ``ironclawd.bundle.spec``), so today they must be equal; both are explicit so that callers
    chown host files to the right owner and so that a later runsc can relax the rule in one place.
    """

    sid: str
    agent: str
    uid: int
    gid: int
    host_uid: int
    host_gid: int
    rootfs: str
    netns: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    memory_bytes: int = 512 * MIB
    tasks_max: int = 256
    cpu_percent: int = 100
    workspace_bytes: int = 64 * MIB
    nofile: int = 1024
    mounts: tuple[Mount, ...] = ()
    hostname: str = field(default="")

    def __post_init__(self) -> None:
        _check_pattern("sid", self.sid, SID_PATTERN, "8-32 characters of [a-z0-9]")
        _check_pattern("agent", self.agent, AGENT_PATTERN, "[a-z][a-z0-9-]{0,62}")
        for name in ("uid", "gid", "host_uid", "host_gid"):
            _check_int(name, getattr(self, name), 1, MAX_ID)
        if (self.host_uid, self.host_gid) != (self.uid, self.gid):
            raise _fail(
                "host_uid/host_gid",
                f"equal to uid/gid {self.uid}/{self.gid} (runsc 20221219 does not map ids)",
                (self.host_uid, self.host_gid),
            )
        _check_abs_path("rootfs", self.rootfs)
        _check_abs_path("netns", self.netns)
        self._check_argv()
        self._check_env()
        _check_int("memory_bytes", self.memory_bytes, MIN_MEMORY_BYTES, MAX_MEMORY_BYTES)
        _check_int("tasks_max", self.tasks_max, 1, MAX_TASKS)
        _check_int("cpu_percent", self.cpu_percent, 1, MAX_CPU_PERCENT)
        # gVisor's tmpfs lives in the sentry's memory, charged to the same cgroup.
        _check_int("workspace_bytes", self.workspace_bytes, MIN_WORKSPACE_BYTES, self.memory_bytes)
        _check_int("nofile", self.nofile, 16, MAX_NOFILE)
        self._check_mounts()
        if self.hostname == "":
            object.__setattr__(self, "hostname", f"sbx-{self.sid}")
        _check_pattern("hostname", self.hostname, HOSTNAME_PATTERN, "an RFC 1123 label")

    def _check_argv(self) -> None:
        argv = self.argv
        if not isinstance(argv, tuple) or not 1 <= len(argv) <= MAX_ARGS:
            raise _fail("argv", f"a tuple of 1 to {MAX_ARGS} strings", argv)
        _check_abs_path("argv[0]", argv[0])
        for index, arg in enumerate(argv):
            if not isinstance(arg, str) or "\0" in arg or len(arg) > MAX_ARG_CHARS:
                raise _fail(f"argv[{index}]", f"a string without NUL, <= {MAX_ARG_CHARS}", arg)

    def _check_env(self) -> None:
        if not isinstance(self.env, tuple) or len(self.env) > MAX_ENV:
            raise _fail("env", f"a tuple of at most {MAX_ENV} (name, value) pairs", self.env)
        seen: set[str] = set()
        for pair in self.env:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise _fail("env", "(name, value) pairs", pair)
            name, value = pair
            _check_pattern("env name", name, ENV_NAME_PATTERN, "[A-Za-z_][A-Za-z0-9_]*")
            if name in seen:
                raise _fail(f"env {name}", "each name once", name)
            seen.add(name)
            if is_secret_env_name(name):
                raise _fail(
                    f"env {name}", "no secret-looking names (secrets go via the proxy)", name
                )
            if not isinstance(value, str) or "\0" in value or len(value) > MAX_ENV_VALUE_CHARS:
                raise _fail(f"env {name}", f"a value without NUL, <= {MAX_ENV_VALUE_CHARS}", "…")
            if any(marker in value for marker in SECRET_VALUE_MARKERS):
                # The value is not echoed: it may be the very secret we refuse.
                raise InvalidArgument(f"env {name}: expected no credential-like value")

    def _check_mounts(self) -> None:
        if not isinstance(self.mounts, tuple):
            raise _fail("mounts", "a tuple of Mount", self.mounts)
        destinations: set[str] = set()
        for mount in self.mounts:
            if not isinstance(mount, Mount):
                raise _fail("mounts", "Mount values", mount)
            if mount.destination in destinations:
                raise _fail("mounts", "each destination once", mount.destination)
            destinations.add(mount.destination)
