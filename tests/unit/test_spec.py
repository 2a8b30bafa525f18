"""bundle/spec.py and bundle/grants.py: goldens, OCI schema validity, one test per refusal rule,
and properties.

Regenerate the goldens in oci-bundles/golden/ with ``IRONCLAW_UPDATE_GOLDENS=1 pytest
tests/unit/test_spec.py`` and review the diff.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

from ironclawd.bundle import grants as G
from ironclawd.bundle import skills as K
from ironclawd.bundle import spec as S
from ironclawd.bundle.rootfs import MOUNTPOINTS
from ironclawd.domain import policy as P
from ironclawd.domain.agents import AgentMount
from ironclawd.domain.policy import SandboxPolicy
from ironclawd.errors import InvalidArgument, SandboxError
from tests.harness.fixtures import real_required, skip_unless_required

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = ROOT / "oci-bundles" / "golden"
SCHEMA_DIR = Path("/usr/share/gocode/src/github.com/opencontainers/runtime-spec/schema")
UPDATE = os.environ.get("IRONCLAW_UPDATE_GOLDENS") == "1"
SID = "a1b2c3d4"


def make_policy(sid: str = SID, **overrides: Any) -> SandboxPolicy:
    fields: dict[str, Any] = {
        "sid": sid,
        "agent": "demo",
        "uid": 1000,
        "gid": 1000,
        "host_uid": 1000,
        "host_gid": 1000,
        "rootfs": "/var/lib/ironclaw/rootfs/demo",
        "netns": S.netns_path(sid),
        "argv": ("/app/agent/agent",),
        "mounts": S.session_mounts(sid),
    }
    fields.update(overrides)
    return SandboxPolicy(**fields)


GOLDEN_POLICIES: dict[str, Callable[[], SandboxPolicy]] = {
    "minimal": lambda: make_policy("0000aaaa", mounts=()),
    "standard": lambda: make_policy(
        "s3ss10n0standard", env=(("LANG", "C.UTF-8"), ("AGENT_LOG_LEVEL", "info"))
    ),
    "large-limits": lambda: make_policy(
        "zz99large",
        agent="research-bot",
        uid=61000,
        gid=61000,
        host_uid=61000,
        host_gid=61000,
        argv=("/app/agent/agent", "--persona", "/app/agent/persona.md"),
        memory_bytes=4096 * P.MIB,
        workspace_bytes=1024 * P.MIB,
        tasks_max=1024,
        cpu_percent=200,
        nofile=4096,
        hostname="research",
    ),
}


# --- goldens and schema -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GOLDEN_POLICIES))
def test_golden(name: str) -> None:
    rendered = S.render_spec(S.build_spec(GOLDEN_POLICIES[name]()))
    path = GOLDEN_DIR / f"{name}.json"
    if UPDATE:
        path.write_text(rendered)
        pytest.skip(f"regenerated {path}")
    assert path.exists(), f"{path} missing: run with IRONCLAW_UPDATE_GOLDENS=1"
    assert rendered == path.read_text(), f"{path} differs: review, then regenerate"


def _schema_validator() -> Any:
    if not (SCHEMA_DIR / "config-schema.json").exists():
        skip_unless_required(f"OCI runtime-spec schemas absent ({SCHEMA_DIR}); apt install "
                             "golang-github-opencontainers-specs-dev")  # fmt: skip
    # The schemas have no ids and refer to siblings by bare file name ("defs.json#/..."), so
    # register each file under its bare name; refs resolve against the root's empty base URI.
    resources = [
        (f.name, Resource.from_contents(json.loads(f.read_text()), default_specification=DRAFT4))
        for f in SCHEMA_DIR.glob("*.json")
    ]
    registry: Registry[Any] = Registry().with_resources(resources)
    schema = json.loads((SCHEMA_DIR / "config-schema.json").read_text())
    return jsonschema.Draft4Validator(schema, registry=registry)


@pytest.fixture(scope="module")
def validator() -> Any:
    return _schema_validator()


@pytest.mark.parametrize("name", sorted(GOLDEN_POLICIES))
def test_golden_specs_are_valid_oci(name: str, validator: Any) -> None:
    spec = json.loads((GOLDEN_DIR / f"{name}.json").read_text())
    validator.validate(spec)


def test_schema_validator_is_not_vacuous(validator: Any) -> None:
    spec = S.build_spec(make_policy())
    spec["linux"]["namespaces"][0]["type"] = "bogus"
    spec["process"]["user"]["uid"] = "root"
    errors = list(validator.iter_errors(spec))
    assert len(errors) >= 2


# --- what build_spec emits ----------------------------------------------------------------------


def test_spec_walls_are_present() -> None:
    spec = S.build_spec(make_policy(env=(("LANG", "C"),)))
    process = spec["process"]
    assert process["terminal"] is False
    assert process["noNewPrivileges"] is True
    assert all(granted == [] for granted in process["capabilities"].values())
    assert {"type": "RLIMIT_CORE", "soft": 0, "hard": 0} in process["rlimits"]
    assert "LANG=C" in process["env"]
    assert spec["root"]["readonly"] is True
    assert {"type": "network", "path": f"/run/netns/ironclaw-{SID}"} in spec["linux"]["namespaces"]
    assert "uidMappings" not in spec["linux"]
    writable = [m for m in spec["mounts"] if "ro" not in m["options"]]
    assert {m["destination"] for m in writable} == {
        "/proc",
        "/dev",
        "/workspace",
        "/queue/outbound",
    }
    for mount in writable:
        assert {"nosuid", "nodev", "noexec"} <= set(mount["options"])


def test_policy_env_overrides_defaults() -> None:
    spec = S.build_spec(make_policy(env=(("TMPDIR", "/workspace/tmp"),)))
    assert [e for e in spec["process"]["env"] if e.startswith("TMPDIR=")] == [
        "TMPDIR=/workspace/tmp"
    ]


@pytest.mark.parametrize(
    "mount",
    [
        P.Mount("/etc/shadow", "/etc/shadow"),
        P.Mount("/run/ironclaw", "/run/ironclaw/sessions/zzzz9999"),
        P.Mount("/queue/inbound", f"/var/lib/ironclaw/queues/{SID}/inbound", read_only=False),
        P.Mount("/data", "tmpfs", type="tmpfs", read_only=False),
    ],
    ids=["host-file", "other-session", "inbound-writable", "extra-tmpfs"],
)
def test_build_refuses_policy_mount_outside_allowlist(mount: P.Mount) -> None:
    with pytest.raises(SandboxError, match="refusing spec: mount-"):
        S.build_spec(make_policy(mounts=(mount,)))


def test_build_refuses_netns_of_another_session() -> None:
    with pytest.raises(SandboxError, match="refusing spec: network:"):
        S.build_spec(make_policy(netns="/run/netns/ironclaw-zzzz9999"))


# --- policy validation names the field -----------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"sid": "short"}, "sid"),
        ({"sid": "ABCDEFGH1"}, "sid"),
        ({"agent": "Bad_Name"}, "agent"),
        ({"uid": 0, "host_uid": 0}, "uid"),
        ({"gid": True}, "gid"),
        ({"host_uid": 2000}, "host_uid/host_gid"),
        ({"rootfs": "relative/path"}, "rootfs"),
        ({"rootfs": "/a/../b"}, "rootfs"),
        ({"argv": ()}, "argv"),
        ({"argv": ("agent",)}, "argv[0]"),
        ({"env": (("1BAD", "x"),)}, "env name"),
        ({"env": (("OPENAI_API_KEY", "x"),)}, "env OPENAI_API_KEY"),
        ({"env": (("GITHUB_TOKEN", "x"),)}, "env GITHUB_TOKEN"),
        ({"env": (("NOTE", "sk-ant-123"),)}, "env NOTE"),
        ({"env": (("A", "1"), ("A", "2"))}, "env A"),
        ({"memory_bytes": 1}, "memory_bytes"),
        ({"workspace_bytes": 1024 * P.MIB, "memory_bytes": 512 * P.MIB}, "workspace_bytes"),
        ({"tasks_max": 0}, "tasks_max"),
        ({"cpu_percent": 0}, "cpu_percent"),
        ({"hostname": "-bad-"}, "hostname"),
        ({"mounts": (P.Mount("/x", "/y"), P.Mount("/x", "/z"))}, "mounts"),
    ],
)
def test_policy_rejects_with_field_name(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument, match=f"^{re.escape(field)}: expected "):
        make_policy(**overrides)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"destination": "relative", "source": "/s"}, "mount.destination"),
        ({"destination": "/", "source": "/s"}, "mount.destination"),
        ({"destination": "/d", "source": "/s", "type": "overlay"}, "mount.type"),
        ({"destination": "/d", "source": "/s", "options": ("exec",)}, "mount /d: options"),
        ({"destination": "/d", "source": "/s", "options": ("size=1,exec",)}, "mount /d: options"),
        ({"destination": "/d", "source": "/host", "type": "tmpfs"}, "mount /d: source"),
    ],
)
def test_mount_rejects_with_field_name(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument, match=f"^{re.escape(field)}: expected "):
        P.Mount(**kwargs)


def test_secret_value_is_not_echoed() -> None:
    with pytest.raises(InvalidArgument) as caught:
        make_policy(env=(("NOTE", "sk-live-verysecret"),))
    assert "verysecret" not in str(caught.value)


# --- one test per refusal rule ------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], None]


def _mount(spec: dict[str, Any], destination: str) -> dict[str, Any]:
    return next(m for m in spec["mounts"] if m["destination"] == destination)


def _drop_mount(destination: str) -> Mutation:
    def mutate(spec: dict[str, Any]) -> None:
        spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != destination]

    return mutate


def _ns(spec: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(ns for ns in spec["linux"]["namespaces"] if ns["type"] == kind)


MUTATIONS: list[tuple[str, str, Mutation]] = [
    ("sid", "no-annotation", lambda s: s["annotations"].pop(S.SID_ANNOTATION)),
    ("sid", "bad-annotation", lambda s: s["annotations"].update({S.SID_ANNOTATION: "../x"})),
    ("hooks", "prestart", lambda s: s.update(hooks={"prestart": [{"path": "/bin/sh"}]})),
    ("network", "no-netns", lambda s: s["linux"]["namespaces"].remove(_ns(s, "network"))),
    ("network", "no-path", lambda s: _ns(s, "network").pop("path")),
    ("network", "other-path", lambda s: _ns(s, "network").update(path="/proc/1/ns/net")),
    ("namespaces", "pid-joined", lambda s: _ns(s, "pid").update(path="/proc/1/ns/pid")),
    ("namespaces", "no-ipc", lambda s: s["linux"]["namespaces"].remove(_ns(s, "ipc"))),
    ("namespaces", "duplicate", lambda s: s["linux"]["namespaces"].append({"type": "uts"})),
    ("user-namespace", "userns", lambda s: s["linux"]["namespaces"].append({"type": "user"})),
    (
        "user-namespace",
        "maps-container-root",
        lambda s: s["linux"].update(uidMappings=[{"containerID": 0, "hostID": 100000, "size": 1}]),
    ),
    (
        "user-namespace",
        "maps-host-root",
        lambda s: s["linux"].update(gidMappings=[{"containerID": 1000, "hostID": 0, "size": 1}]),
    ),
    ("root-readonly", "false", lambda s: s["root"].update(readonly=False)),
    ("root-readonly", "absent", lambda s: s["root"].pop("readonly")),
    (
        "capabilities",
        "bounding",
        lambda s: s["process"]["capabilities"]["bounding"].append("CAP_KILL"),
    ),
    (
        "capabilities",
        "ambient",
        lambda s: s["process"]["capabilities"].update(ambient=["CAP_NET_RAW"]),
    ),
    ("no-new-privileges", "false", lambda s: s["process"].update(noNewPrivileges=False)),
    ("no-new-privileges", "absent", lambda s: s["process"].pop("noNewPrivileges")),
    ("user", "uid-0", lambda s: s["process"]["user"].update(uid=0)),
    ("user", "gid-0", lambda s: s["process"]["user"].update(gid=0)),
    ("user", "extra-gid-0", lambda s: s["process"]["user"].update(additionalGids=[0])),
    ("devices", "kvm", lambda s: s["linux"].update(devices=[{"path": "/dev/kvm", "type": "c"}])),
    (
        "mount-allowlist",
        "host-root",
        lambda s: s["mounts"].append(
            {"destination": "/host", "type": "bind", "source": "/", "options": ["ro"]}
        ),
    ),
    (
        "mount-allowlist",
        "sysfs",
        lambda s: s["mounts"].append(
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro"]}
        ),
    ),
    ("mount-allowlist", "twice", lambda s: s["mounts"].append(copy.deepcopy(_mount(s, "/tmp")))),
    ("mount-readonly", "tmp-writable", lambda s: _mount(s, "/tmp")["options"].remove("ro")),
    ("mount-readonly", "ro-and-rw", lambda s: _mount(s, "/tmp")["options"].append("rw")),
    ("mount-hygiene", "no-noexec", lambda s: _mount(s, "/workspace")["options"].remove("noexec")),
    ("mount-hygiene", "no-nosuid", lambda s: _mount(s, "/dev")["options"].remove("nosuid")),
    ("mount-hygiene", "exec-after", lambda s: _mount(s, "/proc")["options"].append("exec")),
    (
        "mount-skills",
        "from-elsewhere",
        lambda s: s["mounts"].append(
            {
                "destination": "/skills",
                "type": "bind",
                "source": "/srv/skills",
                "options": ["rbind", "ro", "nosuid", "nodev", "noexec"],
            }
        ),
    ),
    ("mounts-required", "no-tmp", _drop_mount("/tmp")),
    ("mounts-required", "no-dev", _drop_mount("/dev")),
]


def test_every_rule_has_a_mutation() -> None:
    documented = S.check_spec.__doc__ or ""
    rules = {rule for rule, _, _ in MUTATIONS}
    assert rules == {r for r in rules if f"``{r}``" in documented}
    assert rules >= {"network", "root-readonly", "capabilities", "no-new-privileges", "user",
                     "user-namespace", "mount-allowlist", "mount-hygiene"}  # fmt: skip


@pytest.mark.parametrize(("rule", "mutate"), [(r, m) for r, _, m in MUTATIONS],
                         ids=[f"{r}-{n}" for r, n, _ in MUTATIONS])  # fmt: skip
def test_check_spec_refuses(rule: str, mutate: Mutation) -> None:
    spec = S.build_spec(make_policy())
    mutate(spec)
    with pytest.raises(SandboxError, match=f"^refusing spec: {rule}: "):
        S.check_spec(spec)


def test_check_spec_accepts_what_build_spec_made() -> None:
    S.check_spec(S.build_spec(make_policy()))


# --- properties ---------------------------------------------------------------------------------

NAME = st.from_regex(r"[a-z0-9_-]{1,12}", fullmatch=True)
ABS_PATH = st.lists(NAME, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
SAFE_TEXT = st.text(st.characters(exclude_characters="\0", exclude_categories=["Cs"]), max_size=30)


@st.composite
def policies(draw: st.DrawFn) -> SandboxPolicy:
    sid = draw(st.from_regex(r"[a-z0-9]{8,32}", fullmatch=True))
    uid = draw(st.integers(1, P.MAX_ID))
    gid = draw(st.integers(1, P.MAX_ID))
    memory = draw(st.integers(P.MIN_MEMORY_BYTES, P.MAX_MEMORY_BYTES))
    env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True).filter(
        lambda n: not P.is_secret_env_name(n)
    )
    env_values = SAFE_TEXT.filter(lambda v: not any(m in v for m in P.SECRET_VALUE_MARKERS))
    env = draw(st.dictionaries(env_names, env_values, max_size=5))
    chosen = draw(st.sets(st.integers(0, 3)))
    return SandboxPolicy(
        sid=sid,
        agent=draw(st.from_regex(P.AGENT_PATTERN.compiled, fullmatch=True)),
        uid=uid,
        gid=gid,
        host_uid=uid,
        host_gid=gid,
        rootfs=draw(ABS_PATH),
        netns=S.netns_path(sid),
        argv=(draw(ABS_PATH), *draw(st.lists(SAFE_TEXT, max_size=3))),
        env=tuple(env.items()),
        memory_bytes=memory,
        workspace_bytes=draw(st.integers(P.MIN_WORKSPACE_BYTES, memory)),
        tasks_max=draw(st.integers(1, P.MAX_TASKS)),
        cpu_percent=draw(st.integers(1, P.MAX_CPU_PERCENT)),
        nofile=draw(st.integers(16, P.MAX_NOFILE)),
        mounts=tuple(m for i, m in enumerate(S.session_mounts(sid)) if i in chosen),
        hostname=draw(
            st.one_of(st.just(""), st.from_regex(P.HOSTNAME_PATTERN.compiled, fullmatch=True))
        ),
    )


PROPERTY_SETTINGS = settings(max_examples=150, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


@PROPERTY_SETTINGS
@given(policy=policies())
def test_every_valid_policy_builds_a_checked_schema_valid_spec(policy: SandboxPolicy) -> None:
    spec = S.build_spec(policy)  # raises if check_spec refuses
    S.check_spec(json.loads(S.render_spec(spec)))  # the text on disk passes too
    if (SCHEMA_DIR / "config-schema.json").exists() or real_required():  # under CI: no skip
        _cached_validator().validate(spec)


_VALIDATOR: list[Any] = []


def _cached_validator() -> Any:
    if not _VALIDATOR:
        _VALIDATOR.append(_schema_validator())
    return _VALIDATOR[0]


@PROPERTY_SETTINGS
@given(policy=policies(), mutation=st.sampled_from(MUTATIONS))
def test_every_mutated_spec_is_refused(
    policy: SandboxPolicy, mutation: tuple[str, str, Mutation]
) -> None:
    rule, _, mutate = mutation
    spec = S.build_spec(policy)
    mutate(spec)
    with pytest.raises(SandboxError, match=f"^refusing spec: {rule}: "):
        S.check_spec(spec)


@PROPERTY_SETTINGS
@given(policy=policies(), data=st.data())
def test_any_dropped_wall_is_refused(policy: SandboxPolicy, data: st.DataObject) -> None:
    # Deleting any one required key from the spec must never leave a spec check_spec accepts.
    spec = S.build_spec(policy)
    walls = [("root", "readonly"), ("process", "noNewPrivileges"), ("process", "user"),
             ("linux", "namespaces"), ("annotations", S.SID_ANNOTATION)]  # fmt: skip
    top, key = data.draw(st.sampled_from(walls))
    del spec[top][key]
    with pytest.raises(SandboxError):
        S.check_spec(spec)


# --- granted mounts (an agent's approved host directories at /mnt/<name>) ----------------------

GRANTS = (AgentMount("data", "/srv/share/data"), AgentMount("out", "/srv/share/out", False))


def _granted_spec() -> tuple[dict[str, Any], tuple[P.Mount, ...]]:
    granted = G.granted_mounts(SID, GRANTS)
    policy = make_policy(mounts=S.session_mounts(SID) + granted)
    return S.build_spec(policy, granted), granted


def test_granted_mounts_sit_on_the_sessions_frame_after_it() -> None:
    spec, granted = _granted_spec()
    S.check_spec(spec, granted)
    destinations = [m["destination"] for m in spec["mounts"]]
    assert destinations.index("/mnt") < destinations.index("/mnt/data")
    assert _mount(spec, "/mnt")["source"] == str(G.FRAMES_DIR / SID)
    assert _mount(spec, "/mnt")["options"][:2] == ["rbind", "ro"]
    assert "ro" in _mount(spec, "/mnt/data")["options"]
    assert {"rw", "nosuid", "nodev", "noexec"} <= set(_mount(spec, "/mnt/out")["options"])
    assert G.granted_mounts(SID, ()) == ()


def test_granted_mounts_are_refused_unless_the_caller_vouches_for_them() -> None:
    spec, granted = _granted_spec()
    with pytest.raises(SandboxError, match=r"^refusing spec: mount-allowlist: mount /mnt: "):
        S.check_spec(spec)
    with pytest.raises(SandboxError, match=r"mount-allowlist: mount /mnt/out: "):
        S.check_spec(spec, granted[:2])


@pytest.mark.parametrize(
    ("grant", "needle"),
    [
        (P.Mount("/mnt", "/srv/elsewhere"), "expected this session's read-only frame"),
        (P.Mount("/mnt", str(G.FRAMES_DIR / "other123")), "read-only frame"),
        (P.Mount("/mnt", str(G.FRAMES_DIR / SID), read_only=False), "read-only frame"),
        (P.Mount("/etc/x", "/srv/x"), "expected a bind at /mnt/<name>"),
        (P.Mount("/mnt/a/b", "/srv/x"), "expected a bind at /mnt/<name>"),
        (P.Mount("/mnt/UP", "/srv/x"), "expected a bind at /mnt/<name>"),
        (P.Mount("/mnt/x", "tmpfs", type="tmpfs"), "expected a bind at /mnt/<name>"),
        (P.Mount("/mnt/x", "/var/lib/ironclaw/state.db"), "is never granted"),
        (P.Mount("/mnt/x", "/var/lib"), "is never granted"),
        (P.Mount("/mnt/x", "/run/ironclaw/sessions/x"), "is never granted"),
        (P.Mount("/mnt/x", "/etc/ironclaw"), "is never granted"),
        (P.Mount("/mnt/x", "/proc/1/root"), "is never granted"),
    ],
)
def test_a_granted_mount_must_be_the_frame_or_a_bind_under_mnt(grant: P.Mount, needle: str) -> None:
    spec = S.build_spec(make_policy())
    with pytest.raises(SandboxError, match=f"^refusing spec: mount-granted: .*{re.escape(needle)}"):
        S.check_spec(spec, (grant,))


def test_granted_mount_rules_refuse_reordering_and_loosening() -> None:
    spec, granted = _granted_spec()
    frame = _mount(spec, "/mnt")
    spec["mounts"].remove(frame)
    spec["mounts"].append(frame)
    with pytest.raises(SandboxError, match=r"^refusing spec: mount-order: mount /mnt/data"):
        S.check_spec(spec, granted)
    spec, granted = _granted_spec()
    _mount(spec, "/mnt/data")["options"].remove("ro")
    with pytest.raises(SandboxError, match=r"^refusing spec: mount-readonly: mount /mnt/data"):
        S.check_spec(spec, granted)
    spec, granted = _granted_spec()
    _mount(spec, "/mnt/out")["options"].remove("noexec")
    with pytest.raises(SandboxError, match=r"^refusing spec: mount-hygiene: mount /mnt/out"):
        S.check_spec(spec, granted)
    spec, granted = _granted_spec()
    _mount(spec, "/mnt/data")["source"] = "/srv/share/other"
    with pytest.raises(SandboxError, match=r"^refusing spec: mount-allowlist: mount /mnt/data"):
        S.check_spec(spec, granted)


def test_the_shared_rootfs_has_an_empty_mnt_for_the_frame() -> None:
    assert "mnt" in MOUNTPOINTS


def test_a_configured_state_dir_holds_the_queues_and_frames_and_is_never_granted() -> None:
    """``daemon.state_dir`` is honoured by the sandbox's mounts, not only by the host side."""
    state = Path("/srv/ironclaw-state")
    granted = G.granted_mounts(SID, GRANTS, state)
    policy = make_policy(mounts=S.session_mounts(SID, state) + granted)
    spec = S.build_spec(policy, granted, state)
    S.check_spec(spec, granted, state)
    assert _mount(spec, "/queue/outbound")["source"] == f"{state}/queues/{SID}/outbound"
    assert _mount(spec, "/mnt")["source"] == str(G.frame_dir(SID, state))
    own = S.build_spec(make_policy(mounts=S.session_mounts(SID, state)), state_dir=state)
    with pytest.raises(SandboxError, match="mount-allowlist: mount /queue/inbound"):
        S.check_spec(own)  # the default state dir's queues are another place
    leak = (*granted, P.Mount("/mnt/state", f"{state}/queues"))
    with pytest.raises(SandboxError, match="is never granted"):
        S.build_spec(make_policy(mounts=S.session_mounts(SID, state) + leak), leak, state)


# --- the agent's skill set at /skills ---------------------------------------------------------

SET = "ab" * 32


def _skills_spec(
    state: Path = Path("/var/lib/ironclaw"),
) -> tuple[dict[str, Any], tuple[P.Mount, ...]]:
    granted = (K.skills_mount(K.skill_sets_dir(state) / SET),)
    policy = make_policy(mounts=S.session_mounts(SID, state) + granted)
    return S.build_spec(policy, granted, state), granted


def test_the_skill_set_is_bound_read_only_nosuid_nodev_noexec_at_skills() -> None:
    spec, granted = _skills_spec()
    S.check_spec(spec, granted)
    skills = _mount(spec, "/skills")
    assert skills["type"] == "bind"
    assert skills["source"] == f"/var/lib/ironclaw/skills/{SET}"
    assert skills["options"] == ["rbind", "ro", "nosuid", "nodev", "noexec"]
    assert "skills" in MOUNTPOINTS  # runsc must never create the mountpoint in the rootfs
    state = Path("/srv/ironclaw-state")
    spec, granted = _skills_spec(state)
    assert _mount(spec, "/skills")["source"] == f"{state}/skills/{SET}"
    with pytest.raises(SandboxError, match=r"^refusing spec: mount-skills: .* is not a skill set"):
        S.check_spec(spec, granted)  # vouched for under another state dir


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda m: m["options"].remove("ro"), "options lack ['ro']"),
        (lambda m: m["options"].__setitem__(1, "rw"), "options lack ['ro']"),
        (lambda m: m["options"].remove("noexec"), "options lack ['noexec']"),
        (lambda m: m["options"].remove("nosuid"), "options lack ['nosuid']"),
        (lambda m: m["options"].remove("nodev"), "options lack ['nodev']"),
        (lambda m: m.update(source=f"/var/lib/ironclaw/skills/{'cd' * 32}"), "skill set"),
        (lambda m: m.update(source="/var/lib/ironclaw"), "skill set"),
        (lambda m: m.update(type="tmpfs", source="tmpfs"), "skill set"),
    ],
)
def test_a_loosened_or_moved_skills_mount_is_refused(
    mutate: Callable[[dict[str, Any]], None], needle: str
) -> None:
    spec, granted = _skills_spec()
    mutate(_mount(spec, "/skills"))
    with pytest.raises(SandboxError, match=f"^refusing spec: mount-skills: .*{re.escape(needle)}"):
        S.check_spec(spec, granted)


@pytest.mark.parametrize(
    ("mount", "needle"),
    [
        (P.Mount("/skills", "/srv/skills"), "is not a skill set"),
        (P.Mount("/skills", "/var/lib/ironclaw/skills"), "is not a skill set"),
        (P.Mount("/skills", "/var/lib/ironclaw/skills/ab"), "is not a skill set"),
        (P.Mount("/skills", f"/var/lib/ironclaw/skills/{SET.upper()}"), "is not a skill set"),
        (P.Mount("/skills", f"/var/lib/ironclaw/queues/{SET}"), "is not a skill set"),
        (P.Mount("/skills", f"/var/lib/ironclaw/skills/{SET}", read_only=False), "read-only"),
        (P.Mount("/skills", "tmpfs", type="tmpfs"), "expected a read-only bind"),
    ],
)
def test_only_a_read_only_bind_of_a_skill_set_may_be_vouched_for(
    mount: P.Mount, needle: str
) -> None:
    spec = S.build_spec(make_policy())
    with pytest.raises(SandboxError, match=f"^refusing spec: mount-skills: .*{re.escape(needle)}"):
        S.check_spec(spec, (mount,))
    with pytest.raises(SandboxError, match=r"^refusing spec: mount-skills: "):
        S.build_spec(make_policy(mounts=(*S.session_mounts(SID), mount)), (mount,))
