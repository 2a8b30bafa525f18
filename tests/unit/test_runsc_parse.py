"""runsc detection and argv building, from recorded runsc output (no runsc is run)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from ironclawd.errors import ConfigError, HostError, InvalidArgument
from ironclawd.host import runsc
from ironclawd.host.runsc import RunscInfo

VERSION_2022 = "runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n"
VERSION_UPSTREAM = "runsc version release-20240729.0\nspec: 1.1.0\n"
FLAGS_2022 = """\
  -host-uds value
    \tcontrols permission to access host Unix-domain sockets. Values: none|open|create|all
  -network value
    \tspecifies which network to use: sandbox (default), host, none.
  -platform string
    \tspecifies which platform to use: ptrace (default), kvm. (default "ptrace")
  -root string
    \troot directory for storage of container state.
"""
FLAGS_OLD = """\
  -fsgofer-host-uds
    \tallow the gofer to mount Unix Domain Sockets.
  -platform string
    \tspecifies which platform to use: ptrace (default), kvm. (default "ptrace")
"""
LIST_JSON = (
    '[{"ociVersion":"1.0.2-dev","id":"ironclaw-ab12","status":"running","pid":4242,'
    '"bundle":"/var/lib/ironclaw/bundles/ab12","annotations":null}]'
)


def info(platforms: Sequence[str] = ("kvm", "ptrace"), host_uds: bool = True) -> RunscInfo:
    flags = frozenset(
        {"root", "network", "platform", "ignore-cgroups"} | ({"host-uds"} if host_uds else set())
    )
    return RunscInfo(Path("/usr/bin/runsc"), "0.0~20221219.0", 20221219, tuple(platforms), flags)


def test_version_debian_and_upstream() -> None:
    assert runsc.parse_version(VERSION_2022) == ("0.0~20221219.0", 20221219)
    assert runsc.parse_version(VERSION_UPSTREAM) == ("release-20240729.0", 20240729)
    assert runsc.parse_version("runsc version 0.0.0-dev\n") == ("0.0.0-dev", None)
    with pytest.raises(HostError, match="unexpected output"):
        runsc.parse_version("bash: runsc: command not found")


def test_flags_and_host_uds() -> None:
    flags = runsc.parse_flags(FLAGS_2022)
    assert flags == {"host-uds", "network", "platform", "root"}
    assert "fsgofer-host-uds" in runsc.parse_flags(FLAGS_OLD)
    assert "host-uds" not in runsc.parse_flags(FLAGS_OLD)  # the old, different flag


def test_platforms_from_help_and_from_flag_text() -> None:
    assert runsc.parse_platforms_help("kvm\nptrace\n") == ("kvm", "ptrace")
    assert runsc.parse_platforms_help("kvm\nptrace\nsystrap\n")[-1] == "systrap"
    assert runsc.parse_platform_flag(FLAGS_2022) == ("ptrace", "kvm")
    assert runsc.parse_platform_flag("  -root string\n") == ()


@pytest.mark.parametrize(
    ("offered", "expected"),
    [
        (("kvm", "ptrace"), "ptrace"),
        (("kvm", "ptrace", "systrap"), "systrap"),
        (("ptrace",), "ptrace"),
    ],
)
def test_auto_prefers_systrap_then_ptrace(offered: tuple[str, ...], expected: str) -> None:
    assert runsc.choose_platform("auto", info(offered)) == expected


def test_auto_never_picks_kvm() -> None:
    with pytest.raises(HostError, match="none of"):
        runsc.choose_platform("auto", info(("kvm",)))
    assert runsc.choose_platform("kvm", info(("kvm",))) == "kvm"  # only when configured


def test_explicit_platform_must_be_offered() -> None:
    with pytest.raises(ConfigError, match=r"'systrap'.*offers"):
        runsc.choose_platform("systrap", info(("kvm", "ptrace")))


def test_auto_takes_systrap_only_when_its_trial_runs() -> None:
    tried: list[str] = []

    def works(name: str) -> str | None:
        tried.append(name)
        return None

    def fails(name: str) -> str | None:
        tried.append(name)
        return "trivial sandbox failed (exit-code)"

    debian_13 = info(("ptrace", "kvm", "systrap"))
    assert runsc.choose_working_platform("auto", debian_13, works) == (
        "systrap",
        "auto: systrap offered and a trial sandbox ran on it",
    )
    assert tried == ["systrap"]  # ptrace, the last resort, and kvm are never tried
    platform, why = runsc.choose_working_platform("auto", debian_13, fails)
    assert platform == "ptrace"
    assert "systrap failed its trial: trivial sandbox failed (exit-code)" in why
    tried.clear()
    platform, why = runsc.choose_working_platform("auto", info(("kvm", "ptrace")), fails)
    assert (platform, tried) == ("ptrace", [])
    assert "offers no systrap" in why
    assert runsc.choose_working_platform("ptrace", debian_13, fails) == ("ptrace", "configured")
    assert tried == []  # a configured platform is the operator's: doctor reports on it
    with pytest.raises(HostError, match="none of"):
        runsc.choose_working_platform("auto", info(("kvm",)), works)


def test_directfs_is_turned_off_where_runsc_has_it() -> None:
    """Debian 13's runsc defaults to --directfs (the sandbox, as root with DAC_OVERRIDE in a
    fully mapped user namespace, opens host files): off, as 20221219 runs, nobody and no caps."""

    def argv(found: RunscInfo) -> list[str]:
        return runsc.runsc_argv(
            found, root=Path("/run/r"), bundle=Path("/b"), container_id="ironclaw-x",
            platform="ptrace", host_uds=True,
        )  # fmt: skip

    assert "--directfs=false" not in argv(info())
    built = argv(replace(info(), flags=info().flags | {"directfs"}))
    assert built.index("--directfs=false") < built.index("run")


def test_argv_has_network_none_and_host_uds_open() -> None:
    argv = runsc.runsc_argv(
        info(), root=Path("/run/ironclaw/runsc"), bundle=Path("/var/lib/ironclaw/bundles/ab12"),
        container_id="ironclaw-ab12", platform="ptrace", host_uds=True,
    )  # fmt: skip
    assert argv == [
        "/usr/bin/runsc", "--root=/run/ironclaw/runsc", "--network=none", "--platform=ptrace",
        "--ignore-cgroups", "--host-uds=open",
        "run", "--bundle", "/var/lib/ironclaw/bundles/ab12", "ironclaw-ab12",
    ]  # fmt: skip
    plain = runsc.runsc_argv(
        info(), root=Path("/r"), bundle=Path("/b"), container_id="x", platform="ptrace",
        host_uds=False,
    )  # fmt: skip
    assert not any(a.startswith("--host-uds") for a in plain)
    assert plain.index("--network=none") < plain.index("run")  # global flags before the verb


def test_argv_refuses_what_runsc_cannot_do() -> None:
    kw = {"root": Path("/r"), "bundle": Path("/b"), "container_id": "x"}
    with pytest.raises(HostError, match="lacks --host-uds"):
        runsc.runsc_argv(info(host_uds=False), platform="ptrace", host_uds=True, **kw)  # type: ignore[arg-type]
    with pytest.raises(HostError, match="not offered"):
        runsc.runsc_argv(info(), platform="systrap", host_uds=False, **kw)  # type: ignore[arg-type]
    # Without --ignore-cgroups runsc would move the sandbox out of its unit's cgroup.
    no_ignore = replace(info(), flags=info().flags - {"ignore-cgroups"})
    with pytest.raises(HostError, match="lacks --ignore-cgroups"):
        runsc.runsc_argv(no_ignore, platform="ptrace", host_uds=False, **kw)  # type: ignore[arg-type]
    for bad in ("", "../x", "a/b", "-rm", "x" * 200):
        with pytest.raises(InvalidArgument, match="container id"):
            runsc.runsc_argv(
                info(), root=Path("/r"), bundle=Path("/b"), container_id=bad, platform="ptrace",
                host_uds=False,
            )  # fmt: skip
    with pytest.raises(InvalidArgument, match="absolute"):
        runsc.runsc_argv(
            info(), root=Path("r"), bundle=Path("/b"), container_id="x", platform="ptrace",
            host_uds=False,
        )  # fmt: skip


def test_list_json() -> None:
    assert runsc.parse_list_json("null\n") == []
    (c,) = runsc.parse_list_json(LIST_JSON)
    assert (c.id, c.pid, c.status, c.bundle) == (
        "ironclaw-ab12", 4242, "running", "/var/lib/ironclaw/bundles/ab12",
    )  # fmt: skip
    with pytest.raises(HostError, match="bad JSON"):
        runsc.parse_list_json("time=... level=error")


class Recorder:
    """A runner that answers from a table instead of running runsc."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        code, out, err = self.answers[" ".join(argv[1:])]
        return subprocess.CompletedProcess(list(argv), code, out, err)


def test_detect_reads_flags_from_stderr() -> None:
    rec = Recorder({
        "--version": (0, VERSION_2022, ""),
        "flags": (0, "", FLAGS_2022),  # Go's flag package prints on stderr
        "help platforms": (0, "kvm\nptrace\n", ""),
    })  # fmt: skip
    got = runsc.detect(Path("/usr/bin/runsc"), run=rec)
    assert got.platforms == ("kvm", "ptrace")
    assert got.host_uds
    assert got.release_date == 20221219


def test_detect_falls_back_to_flag_text_for_platforms() -> None:
    rec = Recorder({
        "--version": (0, VERSION_2022, ""),
        "flags": (0, "", FLAGS_2022),
        "help platforms": (2, "", "unknown topic"),
    })  # fmt: skip
    assert runsc.detect(run=rec).platforms == ("ptrace", "kvm")


def test_delete_and_list_argv_and_errors() -> None:
    rec = Recorder({
        "--root=/r delete -force ironclaw-ab12": (0, "", ""),
        "--root=/r list -format=json": (1, "", "loading: permission denied\n"),
    })  # fmt: skip
    runsc.delete_state(Path("/r"), "ironclaw-ab12", run=rec)
    with pytest.raises(HostError, match=r"listing runsc containers in /r: runsc exited 1: loading"):
        runsc.list_containers(Path("/r"), run=rec)
