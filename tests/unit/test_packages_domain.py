"""Package names, the interpreter/shell list and the resolved-set policy
(ironclawd/domain/packages.py): what a ``packages`` change may name, and which resolved sets are
refused, naming the package, why, and the requested package that pulled it in."""

from __future__ import annotations

from typing import Any

import pytest

from ironclawd.domain.packages import (
    MAX_PACKAGES,
    AgentPackage,
    Candidate,
    candidate_from_mapping,
    check_names,
    check_resolved,
    interpreter_reason,
    package_from_mapping,
    package_to_mapping,
)
from ironclawd.errors import InvalidArgument, PolicyDenied

SHA = "c25f3fda201207ed98b1d63686f2d81b9dfeb99f1ab2d1d35fb3f7b6a1c107dc"


def cand(
    name: str,
    *depends: str,
    essential: bool = False,
    priority: str = "optional",
    version: str = "1.0-1",
) -> Candidate:
    return Candidate(name, version, "amd64", SHA, 1000, essential, priority, depends)


def test_names_are_checked_deduplicated_and_kept_in_order() -> None:
    assert check_names(["jq", "ripgrep", "jq", "libstdc++6", "g++"]) == (
        "jq",
        "ripgrep",
        "libstdc++6",
        "g++",
    )
    assert check_names([]) == ()  # revokes everything
    names = [f"pkg{i}" for i in range(MAX_PACKAGES)]
    assert check_names(names + names) == tuple(names)  # duplicates do not count


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("jq", r"payload\.packages: expected a list of Debian package names .*got str"),
        ({"jq": 1}, r"payload\.packages: expected a list .*got dict"),
        (None, r"payload\.packages: expected a list .*got NoneType"),
        (["jq", 3], r"payload\.packages\[1\]: expected a package name \(text\), got int"),
        (["jq=1.6"], r"\[0\]: 'jq=1\.6' carries a version; expected a name only"),
        (["jq (>= 1)"], r"'jq \(>= 1\)' carries a version"),
        (["jq>=1"], "carries a version"),
        (["https://evil.example/jq.deb"], r"is a URL; expected a package name from the host"),
        (["/tmp/jq.deb"], "is a path"),
        (["./jq"], "is a path"),
        (["../jq"], "is a path"),
        (["~/jq"], "is a path"),
        (["jq.deb"], r"is a \.deb file; local packages are refused"),
        (["jq:amd64"], "has ':'"),
        (["file:jq"], "has ':'"),
        (["JQ"], "has uppercase letters"),
        (["Jq"], "has uppercase letters"),
        (["lib_foo"], "has '_'"),
        (["-o"], "is not a Debian package name"),  # never an apt option
        (["--allow-unauthenticated"], "is not a Debian package name"),
        (["j"], "is not a Debian package name"),  # at least two characters
        ([""], "is not a Debian package name"),
        (["a" * 64], "is not a Debian package name"),
        (["jq*"], "is not a Debian package name"),  # apt glob
        (["jq\n"], "is not a Debian package name"),
        (["jq;rm"], "is not a Debian package name"),
    ],
)
def test_bad_names_are_refused_naming_the_field(raw: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        check_names(raw)


def test_more_than_32_distinct_names_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"payload\.packages: expected at most 32 .*got 33"):
        check_names([f"pkg{i}" for i in range(33)])


# fmt: off
SHELL_NAMES = [
    "sh", "dash", "bash", "bash-static", "zsh", "zsh-static", "ksh", "ksh93u+m", "mksh",
    "posh", "yash", "csh", "tcsh", "fish", "rc", "sash", "ash", "elvish", "xonsh", "busybox",
    "busybox-static", "busybox-syslogd",
]
# fmt: on


@pytest.mark.parametrize("name", SHELL_NAMES)
def test_shells(name: str) -> None:
    assert interpreter_reason(name) == ("a shell" if name != "sh" else None)  # no package "sh"


# fmt: off
INTERPRETER_NAMES = [
    "python3", "python3.11", "python3-minimal", "python3.11-minimal", "python3.11-dbg",
    "python", "python2.7", "python-is-python3", "python3-full", "pypy3", "pypy3-lib",
    "ipython3", "perl", "perl-base", "perl-debug", "rakudo", "ruby", "ruby3.1", "jruby",
    "lua5.1", "lua5.4", "luajit", "nodejs", "gjs", "rhino", "php", "php8.2", "php8.2-cli",
    "php-cgi", "tcl", "tcl8.6", "tk8.6", "expect", "jimsh", "guile-3.0", "gawk", "mawk",
    "original-awk", "openjdk-17-jre-headless", "default-jre", "mono-runtime", "octave",
    "r-base-core", "erlang-base", "ghc", "ocaml-interp", "sbcl", "racket", "swi-prolog-core",
    "pike8.0", "tcc", "gdb", "vim", "vim-tiny", "neovim", "emacs-nox",
]
# fmt: on


@pytest.mark.parametrize("name", INTERPRETER_NAMES)
def test_interpreters(name: str) -> None:
    assert interpreter_reason(name) == "an interpreter"


# fmt: off
OTHER_NAMES = [
    "jq", "libjq1", "libonig5", "ripgrep", "libperl5.36", "perl-modules-5.36",
    "python3-yaml", "libpython3.11", "ruby-json", "php8.2-mbstring", "lua-cjson",
    "node-lodash", "tclsh-x", "libtcl8.6", "libc6", "coreutils", "gawk-doc", "vim-runtime",
    "fishy", "bashtop", "poppler-utils", "libc-bin", "dash-el",
]
# fmt: on


@pytest.mark.parametrize("name", OTHER_NAMES)
def test_libraries_and_tools_are_not_interpreters_by_name(name: str) -> None:
    assert interpreter_reason(name) is None


def test_a_clean_set_becomes_sorted_agent_packages_marking_what_was_requested() -> None:
    found = [cand("libonig5", "libc6"), cand("libjq1", "libonig5"), cand("jq", "libjq1", "libc6")]
    assert check_resolved(("jq",), found) == (
        AgentPackage("jq", "1.0-1", "amd64", SHA, 1000, True),
        AgentPackage("libjq1", "1.0-1", "amd64", SHA, 1000, False),
        AgentPackage("libonig5", "1.0-1", "amd64", SHA, 1000, False),
    )
    assert check_resolved((), []) == ()


def test_an_interpreter_pulled_in_is_refused_with_the_chain() -> None:
    found = [cand("libyaml-0-2"), cand("python3", "python3.11"), cand("python3.11")]
    found.append(cand("python3-yaml", "python3", "libyaml-0-2", "libc6"))
    with pytest.raises(PolicyDenied) as info:
        check_resolved(("python3-yaml",), found)
    assert str(info.value) == (
        "package python3 (needed by python3-yaml) is an interpreter; nothing was queued; "
        "also refused: python3.11"
    )


def test_a_deep_chain_names_every_step_and_the_shortest_path() -> None:
    found = [
        cand("foo", "libfoo-perl", "bar"),
        cand("bar", "baz"),
        cand("baz", "perl-base"),
        cand("libfoo-perl", "perl-base"),
        cand("perl-base", essential=True, priority="required"),
    ]
    with pytest.raises(PolicyDenied) as info:
        check_resolved(("foo",), found)
    assert str(info.value) == (
        "package perl-base (needed by foo -> libfoo-perl) is an interpreter, is essential "
        "(Essential: yes) and has Priority: required; nothing was queued"
    )


def test_a_requested_refusal_is_named_before_its_dependencies() -> None:
    found = [cand("libtinfo6"), cand("bash", "libtinfo6", essential=True, priority="required")]
    with pytest.raises(PolicyDenied, match=r"^package bash is a shell, is essential"):
        check_resolved(("bash",), found)
    with pytest.raises(PolicyDenied, match=r"^package busybox-static is a shell; nothing"):
        check_resolved(("busybox-static",), [cand("busybox-static")])


def test_essential_and_required_packages_are_refused_without_being_interpreters() -> None:
    with pytest.raises(PolicyDenied, match=r"^package coreutils \(needed by x\) is essential"):
        check_resolved(("x",), [cand("x", "coreutils"), cand("coreutils", essential=True)])
    with pytest.raises(PolicyDenied, match=r"^package libc-bin has Priority: required; nothing"):
        check_resolved(("libc-bin",), [cand("libc-bin", priority="required")])


def test_a_package_no_dependency_names_is_still_refused() -> None:
    # apt chose mawk for a virtual "awk" dependency the resolver could not map to it.
    found = [cand("tool", "awk"), cand("mawk")]
    with pytest.raises(PolicyDenied, match=r"^package mawk \(pulled in by apt for tool\) is an"):
        check_resolved(("tool",), found)


def test_requested_names_missing_or_duplicated_in_the_resolution_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"libc6 resolved to nothing to unpack"):
        check_resolved(("jq", "libc6"), [cand("jq")])
    with pytest.raises(InvalidArgument, match="jq appears twice"):
        check_resolved(("jq",), [cand("jq"), cand("jq")])


GOOD: dict[str, Any] = {
    "name": "jq",
    "version": "1.6-2.1+deb12u3",
    "architecture": "amd64",
    "sha256": SHA,
    "size": 64432,
    "requested": True,
}


def test_mapping_round_trips() -> None:
    package = package_from_mapping(GOOD, "payload.resolved[0]")
    assert package == AgentPackage("jq", "1.6-2.1+deb12u3", "amd64", SHA, 64432, True)
    assert package_to_mapping(package) == GOOD
    for version in ("1:2.36-9+deb12u14", "6.9.8-1", "0.0~git20200101", "2.0", "1.2-3-4"):
        assert package_from_mapping({**GOOD, "version": version}, "p").version == version


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "JQ"}, r"p\.name: expected a Debian package name"),
        ({"name": "-o"}, r"p\.name"),
        ({"version": "1.6 ; rm"}, r"p\.version: expected a Debian version"),
        ({"version": "-1"}, r"p\.version"),
        ({"version": "1.6-"}, r"p\.version"),
        ({"version": "a1.6"}, r"p\.version"),
        ({"version": "1:" + "1" * 200}, r"p\.version"),
        ({"version": 1.6}, r"p\.version"),
        ({"architecture": "amd64 "}, r"p\.architecture: expected one of all, amd64"),
        ({"sha256": SHA.upper()}, r"p\.sha256: expected 64 lowercase hex"),
        ({"sha256": SHA[:-1]}, r"p\.sha256"),
        ({"size": 0}, r"p\.size: expected a positive"),
        ({"size": True}, r"p\.size"),
        ({"size": "64432"}, r"p\.size"),
        ({"requested": 1}, r"p\.requested: expected true or false"),
        ({"extra": 1}, r"p: expected exactly the keys .*; unexpected extra"),
    ],
)
def test_mapping_is_strict(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        package_from_mapping({**GOOD, **change}, "p")


def test_mapping_refuses_missing_keys_and_non_objects() -> None:
    with pytest.raises(InvalidArgument, match="missing sha256"):
        package_from_mapping({k: v for k, v in GOOD.items() if k != "sha256"}, "p")
    with pytest.raises(InvalidArgument, match="p: expected an object"):
        package_from_mapping(["jq"], "p")


def test_candidates_from_the_resolver_are_checked() -> None:
    raw = {k: v for k, v in GOOD.items() if k != "requested"}
    raw |= {"essential": False, "priority": "optional", "depends": ["libjq1", "libc6"]}
    assert candidate_from_mapping(raw, "r[0]") == Candidate(
        "jq", "1.6-2.1+deb12u3", "amd64", SHA, 64432, False, "optional", ("libjq1", "libc6")
    )
    bads: list[tuple[dict[str, Any], str]] = [
        ({"essential": "no"}, r"r\[0\]\.essential"),
        ({"priority": "Required!"}, r"r\[0\]\.priority"),
        ({"depends": ["libc6:any"]}, r"r\[0\]\.depends"),
        ({"depends": "libc6"}, r"r\[0\]\.depends"),
        ({"sha256": "0" * 63}, r"r\[0\]\.sha256"),
        ({"requested": True}, r"r\[0\]: unexpected keys"),
    ]
    for bad, message in bads:
        with pytest.raises(InvalidArgument, match=message):
            candidate_from_mapping({**raw, **bad}, "r[0]")
