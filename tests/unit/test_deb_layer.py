"""ironclawd/formats/deb_layer.py: which tar members of a package's data may reach an image.

Every refusal the issue names (setuid/setgid, devices, FIFOs, hard links, absolute or ".."
paths, symlinks leaving the layer, forbidden places, shells and interpreters) over crafted
TarInfo, each beside a near miss that passes, so no case passes by refusing everything."""

from __future__ import annotations

import posixpath
import tarfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ironclawd.errors import PolicyDenied
from ironclawd.formats.deb_layer import FORBIDDEN_PREFIXES, check_member


def member(
    name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


def refused(info: tarfile.TarInfo, *words: str) -> str:
    with pytest.raises(PolicyDenied) as caught:
        check_member(info)
    message = str(caught.value)
    assert repr(info.name) in message
    for word in words:
        assert word in message
    return message


@pytest.mark.parametrize(
    ("name", "kind", "mode", "expected"),
    [
        ("./", tarfile.DIRTYPE, 0o755, ""),
        (".", tarfile.DIRTYPE, 0o755, ""),
        ("./usr/", tarfile.DIRTYPE, 0o755, "usr"),
        ("./usr/bin/jq", tarfile.REGTYPE, 0o755, "usr/bin/jq"),
        ("usr/share/doc/jq/copyright", tarfile.REGTYPE, 0o644, "usr/share/doc/jq/copyright"),
        (
            "./usr/share/doc/jq/changelog.gz",
            tarfile.AREGTYPE,
            0o644,
            "usr/share/doc/jq/changelog.gz",
        ),
        ("./var/tmp/", tarfile.DIRTYPE, 0o1777, "var/tmp"),  # sticky dir: normalised, not refused
        ("./etc/jq/", tarfile.DIRTYPE, 0o755, "etc/jq"),
        ("./usr/share/doc/ünïcödé", tarfile.REGTYPE, 0o644, "usr/share/doc/ünïcödé"),
        (
            "./usr/lib/python3/dist-packages/",
            tarfile.DIRTYPE,
            0o755,
            "usr/lib/python3/dist-packages",
        ),
        ("./usr/bin/" + "a" * 255, tarfile.REGTYPE, 0o755, "usr/bin/" + "a" * 255),
    ],
)
def test_plain_members_pass_normalised(name: str, kind: bytes, mode: int, expected: str) -> None:
    assert check_member(member(name, kind, mode)) == expected


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        (tarfile.LNKTYPE, "hard link"),
        (tarfile.CHRTYPE, "character device"),
        (tarfile.BLKTYPE, "block device"),
        (tarfile.FIFOTYPE, "FIFO"),
        (tarfile.CONTTYPE, "contiguous"),
        (tarfile.GNUTYPE_SPARSE, "sparse"),
        (b"Z", "tar type"),
    ],
)
def test_anything_but_dirs_files_and_symlinks_is_refused(kind: bytes, words: str) -> None:
    refused(member("./usr/bin/thing", kind, link="usr/bin/jq"), words)


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        (0o4755, "is setuid (mode 4755)"),
        (0o2755, "is setgid (mode 2755)"),
        (0o6755, "is setuid and setgid (mode 6755)"),
        (0o1644, "is sticky (mode 1644)"),
        (0o4000, "is setuid (mode 4000)"),
    ],
)
def test_setuid_setgid_and_sticky_files_are_refused(mode: int, words: str) -> None:
    refused(member("./usr/bin/jq", mode=mode), words)
    assert check_member(member("./usr/bin/jq", mode=mode & 0o777)) == "usr/bin/jq"


@pytest.mark.parametrize(
    ("mode", "words"), [(0o4755, "is setuid (mode 4755)"), (0o2775, "is setgid (mode 2775)")]
)
def test_setid_directories_are_refused(mode: int, words: str) -> None:
    refused(member("./var/mail/", tarfile.DIRTYPE, mode), words)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("/usr/bin/jq", "absolute"),
        ("/", "absolute"),
        ("./../etc/passwd", "'..'"),
        ("../../etc/passwd", "'..'"),
        ("./usr/../../etc/passwd", "'..'"),
        ("./usr/bin/..", "'..'"),
        ("./usr//bin/jq", "normalised"),
        ("./usr/./bin/jq", "normalised"),
        ("", "normalised"),
        ("./usr/bin/" + "a" * 256, "255 bytes"),
        ("./" + "/".join(["d" * 200] * 21), "4096 bytes"),
        ("./usr/bin/j\udcffq", "UTF-8"),
        ("./usr/bin/j\nq", "control"),
        ("./usr/bin/j\x1b[2Jq", "control"),
        ("./usr/bin/j\x7fq", "control"),
        ("./usr/bin/j\x85q", "control"),
    ],
)
def test_names_that_are_not_clean_relative_paths_are_refused(name: str, words: str) -> None:
    message = refused(member(name), words)
    assert "\n" not in message
    assert "\x1b" not in message


@pytest.mark.parametrize("prefix", FORBIDDEN_PREFIXES)
def test_forbidden_places_are_refused_as_themselves_and_below(prefix: str) -> None:
    refused(member(f"./{prefix}/", tarfile.DIRTYPE, 0o755), f"/{prefix}")
    refused(member(f"./{prefix}/x"), f"/{prefix}")
    # A sibling whose name merely starts the same way is not below the prefix.
    assert check_member(member(f"./{prefix}x/y")) == f"{prefix}x/y"


def test_etc_itself_may_hold_files_but_not_etc_ironclaw() -> None:
    assert check_member(member("./etc/jq.conf")) == "etc/jq.conf"
    refused(member("./etc/ironclaw/programs.json"), "/etc/ironclaw")


@pytest.mark.parametrize(
    "path",
    [
        "usr/bin/sh", "bin/bash", "bin/dash", "bin/busybox", "usr/bin/zsh", "usr/bin/python3",
        "usr/bin/python3.11", "usr/bin/perl", "usr/bin/perl5.36.0", "usr/bin/lua5.4",
        "usr/bin/node", "usr/bin/nodejs", "usr/bin/env", "usr/bin/gawk", "usr/bin/sed",
        "usr/local/bin/ruby", "usr/bin/tclsh8.6", "usr/lib/jvm/bin/java", "usr/bin/Rscript",
    ],
)  # fmt: skip
def test_shells_and_interpreters_are_refused_as_files_and_as_links(path: str) -> None:
    message = refused(member(f"./{path}", mode=0o755), "named like")
    assert path.rsplit("/", 1)[-1] in message
    refused(member(f"./{path}", mode=0o644), "named like")
    refused(member(f"./{path}", tarfile.SYMTYPE, 0o777, link="jq"), "named like")


@pytest.mark.parametrize("path", ["usr/bin/jq", "usr/bin/pythonic-tool", "usr/bin/perltidy-x"])
def test_names_that_only_contain_an_interpreter_pass(path: str) -> None:
    assert check_member(member(f"./{path}", mode=0o755)) == path


def test_a_directory_named_like_an_interpreter_passes() -> None:
    assert check_member(member("./usr/share/perl/", tarfile.DIRTYPE, 0o755)) == "usr/share/perl"


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("usr/lib/x86_64-linux-gnu/libjq.so.1", "libjq.so.1.0.4"),
        ("usr/bin/jqx", "../lib/jq/jq"),
        ("usr/share/doc/libjq1", "jq"),
        ("usr/share/doc/libjq1", "./jq/"),
        ("usr/lib/a/b/c", "../../../share/x"),
        ("usr/lib/x", ".."),  # -> usr, not the root nor above anything forbidden
        ("usr/x", "../etc/jq"),
    ],
)
def test_relative_symlinks_inside_the_layer_pass(path: str, target: str) -> None:
    assert check_member(member(f"./{path}", tarfile.SYMTYPE, 0o777, target)) == path


@pytest.mark.parametrize(
    ("path", "target", "words"),
    [
        ("usr/lib/libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", "absolute"),
        ("usr/bin/x", "/", "absolute"),
        ("usr/bin/x", "../../../etc/shadow", "leaves the layer"),
        ("x", "../y", "leaves the layer"),
        ("usr/bin/x", "../..", "root of the image"),
        ("usr/x", "..", "root of the image"),
        ("usr/x", ".", "usr/x"),  # the link's own directory: fine, checked below
        ("usr/lib/x", "../../workspace/evil.so", "/workspace"),
        ("usr/lib/x", "../../tmp", "/tmp"),
        ("usr/lib/x", "../../etc", "/etc/ironclaw"),  # a directory above a forbidden place
        ("usr/lib/x", "../../app/agent/agent", "/app"),
        ("usr/lib/x", "../../run/ironclaw-key", "/run"),
        ("usr/lib/x", "sub/../../../../etc", "after a name"),
        ("usr/lib/x", "a/b/../c", "after a name"),
        ("usr/lib/x", "", "empty"),
        ("usr/lib/x", "libfoo\n.so", "control"),
        ("usr/lib/x", "lib\udcfe.so", "UTF-8"),
    ],
)
def test_symlinks_leaving_the_layer_or_reaching_forbidden_places_are_refused(
    path: str, target: str, words: str
) -> None:
    info = member(f"./{path}", tarfile.SYMTYPE, 0o777, target)
    if target == ".":
        assert check_member(info) == path
        return
    refused(info, words)


def test_a_hard_link_is_refused_even_to_a_member_inside() -> None:
    refused(member("./usr/bin/jq2", tarfile.LNKTYPE, 0o755, "./usr/bin/jq"), "hard link")


def test_the_root_entry_must_be_a_directory() -> None:
    refused(member("./", tarfile.SYMTYPE, 0o777, "usr"), "root")


@given(st.text(min_size=1, max_size=40))
def test_whatever_passes_is_a_clean_relative_path(name: str) -> None:
    try:
        path = check_member(member(name))
    except PolicyDenied:
        return
    assert path == "" or not path.startswith("/")
    assert ".." not in path.split("/")
    assert all(part not in ("", ".") for part in path.split("/")) or path == ""
    assert not any(path == p or path.startswith(p + "/") for p in FORBIDDEN_PREFIXES)


PARTS = st.sampled_from(["..", ".", "", "usr", "lib", "etc", "ironclaw", "workspace", "a"])


@given(st.lists(PARTS, min_size=1, max_size=4), st.lists(PARTS, min_size=1, max_size=6))
def test_whatever_symlink_passes_lands_inside_and_away_from_forbidden_places(
    where: list[str], target: list[str]
) -> None:
    path, link = "/".join(["usr", *where, "x"]), "/".join(target)
    try:
        checked = check_member(member(path, tarfile.SYMTYPE, 0o777, link))
    except PolicyDenied:
        return
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(checked), link))
    assert resolved != "."
    assert not resolved.startswith("..")
    assert not any(resolved == p or resolved.startswith(p + "/") for p in FORBIDDEN_PREFIXES)
    assert not any(p.startswith(resolved + "/") for p in FORBIDDEN_PREFIXES)
