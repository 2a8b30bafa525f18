"""Build ``.deb`` files for tests, hostile ones included, without ``dpkg-deb --build``.

``dpkg-deb --build`` runs its own sanity checks (and refuses some of what we need to feed the
unpacker), so the ``ar`` archive is written here byte by byte (deb(5): ``debian-binary`` "2.0\\n",
``control.tar.gz``, ``data.tar.xz`` or ``.gz``), with data members crafted as TarInfo. What comes
out is still a package real ``dpkg-deb --info``/``--fsys-tarfile`` read, so a refusal a test sees
comes from our checks, not from dpkg. Stdlib only.
"""

from __future__ import annotations

import io
import lzma
import struct
import subprocess
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Member = tuple[tarfile.TarInfo, bytes]
Compression = Literal["xz", "gz"]

HELLO = b"\x7fELF not really: a test program that never runs\n"
COPYRIGHT = b"Copyright: nobody. Public domain.\n"
POSTINST = "#!/bin/sh\necho owned > /tmp/ironclaw-postinst-ran\n"


def entry(
    name: str,
    kind: bytes = tarfile.REGTYPE,
    data: bytes = b"",
    *,
    mode: int = 0o644,
    link: str = "",
    uid: int = 0,
    owner: str = "root",
) -> Member:
    """One data member named as dpkg-deb names them ("./usr/bin/x"), unless ``name`` is odd."""
    info = tarfile.TarInfo(name if name.startswith(("/", ".")) else f"./{name}")
    info.type, info.mode, info.linkname = kind, mode, link
    info.uid = info.gid = uid
    info.uname = info.gname = owner
    info.mtime = 1_700_000_000
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
    return info, data


def directory(name: str, mode: int = 0o755) -> Member:
    return entry(name.rstrip("/") + "/", tarfile.DIRTYPE, mode=mode)


def dirs_of(path: str) -> list[Member]:
    """The root entry and every parent directory of ``path``, as dpkg-deb lists them (only the
    root for a path that is not clean: its odd member must be the first one refused)."""
    clean = path.removeprefix("./")
    parts = [] if clean.startswith("/") or ".." in clean else clean.split("/")[:-1]
    return [entry("./", tarfile.DIRTYPE, mode=0o755)] + [
        directory("/".join(parts[: i + 1])) for i in range(len(parts))
    ]


def build_deb(
    path: Path,
    members: Sequence[Member],
    *,
    package: str = "hello",
    postinst: str | None = None,
    compression: Compression = "xz",
    data: bytes | None = None,
) -> Path:
    """Write a .deb at ``path`` whose data.tar holds exactly ``members`` (in order), or whose
    compressed data member is ``data`` as given."""
    control = (
        f"Package: {package}\nVersion: 1.0-1\nArchitecture: amd64\n"
        "Maintainer: IronClaw tests <tests@invalid>\nDescription: a package built by the tests\n"
    ).encode()
    control_members = [entry("./", tarfile.DIRTYPE, mode=0o755), entry("control", data=control)]
    if postinst is not None:
        control_members.append(entry("postinst", data=postinst.encode(), mode=0o755))
    data_name = f"data.tar.{compression}"
    archive = b"!<arch>\n"
    archive += _ar_member("debian-binary", b"2.0\n")
    archive += _ar_member("control.tar.gz", _tar(control_members, "gz"))
    archive += _ar_member(data_name, _tar(members, compression) if data is None else data)
    path.write_bytes(archive)
    return path


def _tar(members: Sequence[Member], compression: Compression) -> bytes:
    buffer = io.BytesIO()
    # GNU format: what dpkg-deb writes; long names still work (tarfile adds ././@LongLink).
    # GNU format is what dpkg-deb writes; pax only to carry extended attributes.
    fmt = tarfile.PAX_FORMAT if any(i.pax_headers for i, _ in members) else tarfile.GNU_FORMAT
    with (
        tarfile.open(fileobj=buffer, mode="w:xz", format=fmt)
        if compression == "xz"
        else tarfile.open(fileobj=buffer, mode="w:gz", format=fmt)
    ) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return buffer.getvalue()


def _ar_member(name: str, data: bytes) -> bytes:
    # ar(5) common format: name/16 mtime/12 uid/6 gid/6 mode/8 (octal) size/10, then "`\n";
    # members start on even offsets.
    header = f"{name:<16}{0:<12}{0:<6}{0:<6}{0o100644:<8o}{len(data):<10}`\n".encode()
    assert len(header) == 60
    return header + data + (b"\n" if len(data) % 2 else b"")


# ---------------------------------------------------------------- packages the tests use


def benign(directory_: Path, compression: Compression = "xz") -> Path:
    """usr/bin/hello (0775, owned by uid 1000) + its copyright (0664) + a relative symlink."""
    members = [
        *dirs_of("usr/bin/hello"),
        entry("usr/bin/hello", data=HELLO, mode=0o775, uid=1000, owner="builder"),
        directory("usr/share"),
        directory("usr/share/doc"),
        directory("usr/share/doc/hello", mode=0o775),
        entry("usr/share/doc/hello/copyright", data=COPYRIGHT, mode=0o664),
        entry("usr/share/doc/hello/README", tarfile.SYMTYPE, mode=0o777, link="copyright"),
    ]
    return build_deb(directory_ / f"hello.{compression}.deb", members, compression=compression)


# The benign package's layer after unpacking: path -> (tar type, mode, symlink target).
BENIGN_LAYER: dict[str, tuple[bytes, int, str]] = {
    "usr": (tarfile.DIRTYPE, 0o755, ""),
    "usr/bin": (tarfile.DIRTYPE, 0o755, ""),
    "usr/bin/hello": (tarfile.REGTYPE, 0o755, ""),
    "usr/share": (tarfile.DIRTYPE, 0o755, ""),
    "usr/share/doc": (tarfile.DIRTYPE, 0o755, ""),
    "usr/share/doc/hello": (tarfile.DIRTYPE, 0o755, ""),
    "usr/share/doc/hello/copyright": (tarfile.REGTYPE, 0o644, ""),
    "usr/share/doc/hello/README": (tarfile.SYMTYPE, 0o777, "copyright"),
}


def with_postinst(directory_: Path) -> Path:
    """A benign data.tar, and a postinst in control.tar that must never run nor be extracted."""
    members = [*dirs_of("usr/bin/hello"), entry("usr/bin/hello", data=HELLO, mode=0o755)]
    return build_deb(directory_ / "postinst.deb", members, postinst=POSTINST)


def _one(name: str, *member: Member, parents: bool = True) -> Callable[[Path], Path]:
    """A package of ``member`` (after its parent directories, unless those would be refused
    first: then only the root entry precedes it, as in a data.tar that omits directories)."""

    def build(directory_: Path) -> Path:
        last = member[-1][0].name
        dirs = dirs_of(last) if parents else dirs_of("./x")
        return build_deb(directory_ / f"{name}.deb", [*dirs, *member], package=name)

    return build


@dataclass(frozen=True)
class Hostile:
    """A hostile package: how to build it, the member a refusal must name, and why."""

    build: Callable[[Path], Path]
    member: str
    reason: str


HOSTILE: dict[str, Hostile] = {
    "setuid": Hostile(
        _one("setuid", entry("usr/bin/hello", data=HELLO, mode=0o4755)),
        "./usr/bin/hello", "setuid",
    ),
    "setgid": Hostile(
        _one("setgid", entry("usr/bin/hello", data=HELLO, mode=0o2755)),
        "./usr/bin/hello", "setgid",
    ),
    "dotdot": Hostile(
        _one("dotdot", entry("./usr/../../../../tmp/ironclaw-escaped", data=b"escaped\n")),
        "./usr/../../../../tmp/ironclaw-escaped", "'..'",
    ),
    "absolute-path": Hostile(
        _one("absolute-path", entry("/tmp/ironclaw-absolute", data=b"absolute\n")),
        "/tmp/ironclaw-absolute", "absolute",
    ),
    "absolute-symlink": Hostile(
        _one("absolute-symlink", entry("usr/lib/libevil.so", tarfile.SYMTYPE, mode=0o777,
                                       link="/workspace/evil.so")),
        "./usr/lib/libevil.so", "absolute",
    ),
    "escaping-symlink": Hostile(
        _one("escaping-symlink", entry("usr/lib/up", tarfile.SYMTYPE, mode=0o777,
                                       link="../../../../etc")),
        "./usr/lib/up", "leaves the layer",
    ),
    "device": Hostile(
        _one("device", entry("usr/lib/null", tarfile.CHRTYPE, mode=0o666)),
        "./usr/lib/null", "character device",
    ),
    "block-device": Hostile(
        _one("block-device", entry("usr/lib/disk", tarfile.BLKTYPE, mode=0o660)),
        "./usr/lib/disk", "block device",
    ),
    "fifo": Hostile(
        _one("fifo", entry("usr/lib/pipe", tarfile.FIFOTYPE, mode=0o644)),
        "./usr/lib/pipe", "FIFO",
    ),
    "hardlink": Hostile(
        _one("hardlink", entry("usr/bin/hello", data=HELLO, mode=0o755),
             entry("usr/bin/hello2", tarfile.LNKTYPE, mode=0o755, link="./usr/bin/hello")),
        "./usr/bin/hello2", "hard link",
    ),
    "etc-ironclaw": Hostile(
        _one("etc-ironclaw", entry("etc/ironclaw/programs.json", data=b'{"programs": {}}'),
             parents=False),
        "./etc/ironclaw/programs.json", "/etc/ironclaw",
    ),
    "app-agent": Hostile(
        _one("app-agent", entry("app/agent/agent", data=HELLO, mode=0o755), parents=False),
        "./app/agent/agent", "/app",
    ),
    "interpreter": Hostile(
        _one("interpreter", entry("usr/bin/python3", data=HELLO, mode=0o755)),
        "./usr/bin/python3", "interpreter",
    ),
    "shell": Hostile(
        _one("shell", entry("bin/sh", data=HELLO, mode=0o755)), "./bin/sh", "shell",
    ),
}  # fmt: skip


# A file capability, cap_net_raw+ep as setcap(8) writes it: struct vfs_cap_data, revision 2
# with the effective flag, then permitted/inheritable low and high words (CAP_NET_RAW = 13).
CAPABILITY = struct.pack("<5I", 0x02000001, 1 << 13, 0, 0, 0)


def with_capability(directory_: Path) -> Path:
    """usr/bin/hello carrying a security.capability extended attribute in a pax header."""
    hello, data = entry("usr/bin/hello", data=HELLO, mode=0o755)
    value = CAPABILITY.decode("latin-1")
    hello.pax_headers = {"SCHILY.xattr.security.capability": value}
    return build_deb(directory_ / "capability.deb", [*dirs_of("usr/bin/hello"), (hello, data)])


def not_a_tar(directory_: Path) -> Path:
    """A package whose data.tar.xz decompresses fine, to something that is not a tar."""
    garbage = lzma.compress(b"this is not a tar archive\n" * 40)
    return build_deb(directory_ / "not-a-tar.deb", [], data=garbage)


# Accepted by the unpacker (nothing wrong with the package alone), refused by the extractor
# because the base image already has the path.
SHADOWING_PATH = "usr/lib/x86_64-linux-gnu/libc.so.6"


def shadowing(directory_: Path, path: str = SHADOWING_PATH) -> Path:
    """A package providing ``path``, which the base image already has."""
    members = [*dirs_of(path), entry(path, data=b"not libc\n", mode=0o755)]
    return build_deb(directory_ / "shadowing.deb", members, package="shadowing")


def helper_output(deb: Path) -> bytes:
    """What the unpack helper (host/pkg_unpack.py) writes for ``deb``: the checked layer tar."""
    from ironclawd.host.pkg_unpack import unpack  # noqa: PLC0415 - builders need no ironclawd

    out = io.BytesIO()
    unpack(deb, out)
    return out.getvalue()


def raw_data_tar(deb: Path) -> bytes:
    """What dpkg-deb itself gives for the package's data: the helper's input, unchecked."""
    result = subprocess.run(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True, timeout=60
    )
    return result.stdout
