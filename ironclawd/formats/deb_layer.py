"""The member rules of a package layer: which tar members of a ``.deb``'s data may reach an image.

Pure (no I/O): both sides of the unpacking use it, the unprivileged helper that reads
``dpkg-deb --fsys-tarfile`` (``ironclawd/host/pkg_unpack.py``) and the daemon that extracts the
helper's output (``ironclawd/bundle/layer.py``), which never trusts the helper. Only directories,
regular files and relative symlinks that stay inside the layer pass; names are clean UTF-8 paths
below the root, out of the places the sandbox mounts over or the daemon owns, and nothing is
setuid/setgid or named like a shell or an interpreter (docs/packages.md, docs/threat-model.md).
"""

from __future__ import annotations

import tarfile

from ironclawd import lazy_re
from ironclawd.errors import PolicyDenied

# Mount targets of the sandbox (bundle/rootfs.py MOUNTPOINTS), the agent itself, and the image
# builder's own files: a layer may neither provide nor reach into them.
FORBIDDEN_PREFIXES = ("etc/ironclaw", "run", "proc", "dev", "sys", "tmp", "workspace", "queue",
                      "skills", "mnt", "app")  # fmt: skip
# Bounds of one layer (docs/style.md §13); the helper and the daemon both enforce them.
MAX_LAYER_BYTES = 512 * 2**20
MAX_LAYER_MEMBERS = 50_000
MAX_COMPONENT_BYTES = 255  # NAME_MAX
MAX_PATH_BYTES = 4096  # PATH_MAX

# Names of shells and interpreters: one in the image would hand the agent a language to run.
# Kept in step with tests/integration/test_rootfs.py (which checks every image by these names);
# formats/ may not import domain/, so domain/packages.py's package-name list is not reused.
SHELL_NAME = lazy_re.compile(r"[a-z]*sh(\d[\d.]*)?|busybox|toybox")
INTERPRETER_NAME = lazy_re.compile(
    r"(python|pypy|perl|ruby|irb|node|nodejs|deno|bun|lua|luajit|php|tclsh|wish|java|jshell|"
    r"awk|gawk|mawk|nawk|sed|env|expect|guile|gjs|qjs|rhino|julia|R|Rscript|ocaml|erl|escript|"
    r"elixir|racket|sbcl|clisp|ghci|runghc|scala|groovy|dotnet|osascript)[\d.]*m?"
)
_CONTROL = lazy_re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SPECIAL_BITS = 0o7000
_SETID_BITS = 0o6000
_SPECIAL_NAMES = ((0o4000, "setuid"), (0o2000, "setgid"), (0o1000, "sticky"))
_TYPE_NAMES = {
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.CONTTYPE: "a contiguous file",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}


def check_member(info: tarfile.TarInfo) -> str:
    """The normalised relative path of a layer member ("usr/bin/jq"; "" for the root entry,
    which callers skip), or PolicyDenied naming the member and why it may not be unpacked."""
    path = _normalise(info.name)
    where = f"package member {info.name!r}"
    if info.type not in (tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.SYMTYPE):
        kind = _TYPE_NAMES.get(info.type, f"of tar type {info.type!r}")
        raise PolicyDenied(f"{where}: is {kind}; only directories, files and symlinks may unpack")
    if path == "":
        if not info.isdir():
            raise PolicyDenied(f"{where}: the layer root must be a directory")
        return path
    # A directory's sticky bit is harmless (modes are reduced to 0755 anyway); nothing else is.
    special = info.mode & (_SETID_BITS if info.isdir() else _SPECIAL_BITS)
    if special and not info.issym():
        bits = " and ".join(name for bit, name in _SPECIAL_NAMES if special & bit)
        raise PolicyDenied(f"{where}: is {bits} (mode {info.mode:04o}); nothing may be")
    forbidden = _forbidden_prefix(path)
    if forbidden is not None:
        raise PolicyDenied(f"{where}: lies under /{forbidden}, which a package may not provide")
    if not info.isdir():
        name = path.rsplit("/", 1)[-1]
        if SHELL_NAME.fullmatch(name):
            raise PolicyDenied(f"{where}: is named like a shell ({name})")
        if INTERPRETER_NAME.fullmatch(name):
            raise PolicyDenied(f"{where}: is named like an interpreter ({name})")
    if info.issym():
        _check_link(path, info.linkname, where)
    return path


def _normalise(name: str) -> str:
    """``name`` without its leading "./" and trailing "/", or PolicyDenied if it is not a clean
    relative path of UTF-8 components within NAME_MAX/PATH_MAX."""
    where = f"package member {name!r}"
    _check_text(name, where)
    if name.startswith("/"):
        raise PolicyDenied(f"{where}: is an absolute path; expected a path below the layer root")
    if name in (".", "./"):
        return ""
    # dpkg-deb's data.tar names members "./usr/bin/jq" and directories "./usr/bin/".
    path = (name[2:] if name.startswith("./") else name).rstrip("/")
    if len(path.encode()) > MAX_PATH_BYTES:
        raise PolicyDenied(f"{where}: path longer than {MAX_PATH_BYTES} bytes")
    for part in path.split("/"):
        if part == "..":
            raise PolicyDenied(f"{where}: has a '..' component; expected a path below the root")
        if part in ("", "."):
            raise PolicyDenied(f"{where}: is not a normalised path (empty or '.' component)")
        if len(part.encode()) > MAX_COMPONENT_BYTES:
            raise PolicyDenied(f"{where}: a name longer than {MAX_COMPONENT_BYTES} bytes")
    return path


def _check_text(text: str, where: str) -> None:
    # tarfile decodes names with surrogateescape: bytes that are not UTF-8 become lone
    # surrogates, which a strict encode refuses.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PolicyDenied(f"{where}: is not valid UTF-8") from None
    if _CONTROL.search(text):
        raise PolicyDenied(f"{where}: contains control characters")


def _check_link(path: str, target: str, where: str) -> None:
    """Refuse a symlink unless it is relative, climbs only at its start, and lands inside the
    layer below a place other than the root, a forbidden prefix or a directory above one.

    The check is lexical. That is sound only because ".." may appear solely as leading
    components: they climb from the link's own directory, a real directory (the extractor
    refuses members below symlinks); a ".." after a name could climb out of a directory some
    other symlink leads to, which no lexical check can see.
    """
    _check_text(target, f"{where}: symlink target {target!r}")
    if target == "" or len(target.encode()) > MAX_PATH_BYTES:
        raise PolicyDenied(f"{where}: symlink target is empty or longer than {MAX_PATH_BYTES}")
    if target.startswith("/"):
        raise PolicyDenied(f"{where}: symlink to the absolute path {target!r} leaves the layer")
    parts = [p for p in target.split("/") if p not in ("", ".")]
    climb = 0
    while climb < len(parts) and parts[climb] == "..":
        climb += 1
    if ".." in parts[climb:]:
        raise PolicyDenied(f"{where}: symlink target {target!r} has '..' after a name")
    here = path.split("/")[:-1]
    if climb > len(here):
        raise PolicyDenied(f"{where}: symlink to {target!r} leaves the layer")
    resolved = "/".join(here[: len(here) - climb] + parts[climb:])
    if resolved == "":
        raise PolicyDenied(f"{where}: symlink to {target!r} points at the root of the image")
    forbidden = _forbidden_prefix(resolved)
    if forbidden is None:
        forbidden = next((p for p in FORBIDDEN_PREFIXES if p.startswith(resolved + "/")), None)
    if forbidden is not None:
        raise PolicyDenied(f"{where}: symlink to {target!r} reaches /{forbidden}")


def _forbidden_prefix(path: str) -> str | None:
    return next((p for p in FORBIDDEN_PREFIXES if path == p or path.startswith(p + "/")), None)
