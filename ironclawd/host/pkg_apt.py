"""Resolve and download Debian packages with the host's apt, for a ``packages`` change
(docs/packages.md). Runs INSIDE the unprivileged helper unit (``host/pkg_helper.py``), as a
dynamic user: the standard library and the apt CLI only, nothing of the daemon.

`resolve` simulates ``apt-get install`` against a dpkg status file holding only the base image's
packages, so apt names exactly what a layer would add; ``apt-cache show`` then gives each
package's SHA-256 and size from the archive's signed index, and what the policy needs (Essential,
Priority, Depends). `download` fetches one ``.deb`` by ``apt-get download NAME=VERSION``: apt
checks the file against the hash in the index whose signature (InRelease, the host's keyrings)
``apt-get update`` verified; the daemon re-checks the hash it approved afterwards.

Nothing here is installed, and apt never runs as root: without root, apt neither locks nor writes
the host's state, and downloads as the calling user.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

# The same rules as ironclawd.domain.packages (not imported: the helper needs nothing of the
# daemon); names reach apt as arguments, so a name must never look like an option or a pattern.
NAME_RE = re.compile(r"[a-z0-9][a-z0-9+.-]{1,62}")
VERSION_RE = re.compile(r"(?:[0-9]{1,9}:)?[0-9][A-Za-z0-9.+~]*(?:-[A-Za-z0-9.+~-]*[A-Za-z0-9.+~])?")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
# `apt-get -s` prints one line per package it would unpack: "Inst NAME[:ARCH] [OLD] (VERSION
# RELEASE... [ARCH])"; [OLD] only when a package of the status file would be replaced.
INST_RE = re.compile(
    r"Inst (?P<name>[a-z0-9][a-z0-9+.-]+)(?::[a-z0-9-]+)? (?:\[(?P<old>[^\]]*)\] )?"
    r"\((?P<version>\S+) (?:[^\[]*)\[(?P<arch>[a-z0-9-]+)\]\)"
)
REMV_RE = re.compile(r"Remv (?P<name>[a-z0-9][a-z0-9+.-]+)")
SELECTING_RE = re.compile(
    r"Note, selecting '(?P<chosen>[^']+)' (?:instead of|for \w+) '(?P<asked>[^']+)'"
)
UNKNOWN_RE = re.compile(r"E: Unable to locate package (?P<name>\S+)")
NO_CANDIDATE_RE = re.compile(r"E: Package '(?P<name>[^']+)' has no installation candidate")
# A clean environment: LC_ALL=C for parseable messages; no APT_CONFIG from the caller.
ENV = {"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
TIMEOUT_SECONDS = 300.0


class AptError(ValueError):
    """apt refused or failed; the message says which package and why, in the operator's words."""


def _options(workdir: Path) -> list[str]:
    """apt options for an unprivileged run in ``workdir``: the base image's status, a private
    cache, no locks (there is no state to protect: nothing is installed)."""
    return [
        "-o", f"Dir::State::status={workdir / 'status'}",
        "-o", f"Dir::Cache={workdir / 'cache'}",
        "-o", "Debug::NoLocking=1",
    ]  # fmt: skip


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, cwd=cwd, env=ENV, capture_output=True, text=True, errors="replace",
            timeout=TIMEOUT_SECONDS, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AptError(f"{argv[0]} {argv[1]}: no answer within {TIMEOUT_SECONDS:g}s") from None
    except OSError as exc:
        raise AptError(f"{argv[0]}: cannot run ({exc.strerror})") from None


def _apt_failure(what: str, proc: subprocess.CompletedProcess[str]) -> AptError:
    """apt's error lines, rephrased where they have a clearer meaning for a ``packages`` change."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith(("E:", "W:"))]
    for line in lines:
        if (m := UNKNOWN_RE.match(line)) is not None:
            return AptError(f"package {m['name']}: not in the host's configured archives")
        if (m := NO_CANDIDATE_RE.match(line)) is not None:
            return AptError(
                f"package {m['name']}: no installable version in the host's archives "
                "(a virtual or obsolete package? name the package that provides it)"
            )
    detail = "; ".join(line.removeprefix("E: ") for line in lines if line.startswith("E:"))
    return AptError(f"{what}: {detail or proc.stderr.strip()[-500:] or f'exit {proc.returncode}'}")


def _check_names(names: Sequence[str]) -> None:
    for name in names:
        if NAME_RE.fullmatch(name) is None:
            raise AptError(f"package {name[:100]!r}: not a Debian package name")


def _plan(names: Sequence[str], workdir: Path) -> list[tuple[str, str, str]]:
    """(name, version, architecture) of each package apt would add, in apt's order."""
    argv = ["apt-get", "-s", "install", "--no-install-recommends", *_options(workdir)]
    argv += ["-o", "APT::Get::Show-Versions=1", "--", *names]
    proc = _run(argv, workdir)
    if proc.returncode != 0:
        raise _apt_failure(f"apt-get could not resolve {', '.join(names)}", proc)
    plan: list[tuple[str, str, str]] = []
    replaced: list[str] = []
    for line in proc.stdout.splitlines():
        if (m := REMV_RE.match(line)) is not None:
            replaced.append(f"remove the base image's {m['name']}")
        elif line.startswith("Inst "):
            m = INST_RE.match(line)
            if m is None:
                raise AptError(f"apt-get printed an install line this helper cannot read: {line!r}")
            if m["old"] is not None:
                replaced.append(
                    f"replace the base image's {m['name']} ({m['old']} -> {m['version']})"
                )
            plan.append((m["name"], m["version"], m["arch"]))
    _check_plan(names, plan, proc.stdout + proc.stderr)
    if replaced:
        raise AptError(
            f"resolving {', '.join(names)} would {replaced[0]}; a layer only adds packages"
        )
    return plan


def _check_plan(names: Sequence[str], plan: list[tuple[str, str, str]], output: str) -> None:
    """Every requested name is a package apt adds under exactly that name: apt reads a name it
    does not know as a regular expression, and silently picks the provider of a virtual one."""
    for m in SELECTING_RE.finditer(output):
        raise AptError(
            f"package {m['asked']}: apt would select {m['chosen']} instead "
            "(a virtual package or a pattern); name the package itself"
        )
    planned = {name for name, _, _ in plan}
    for name in names:
        if name not in planned:
            raise AptError(
                f"package {name}: apt adds no package of exactly this name (already in the "
                "base image, or read as a pattern?)"
            )


def stanzas(text: str) -> Iterator[dict[str, str]]:
    """The paragraphs of a deb822 text (``apt-cache show``): field -> value, continuation lines
    joined with newlines; field names as written."""
    fields: dict[str, str] = {}
    last = ""
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if fields:
                yield fields
            fields, last = {}, ""
        elif line[0] in " \t":
            if last:
                fields[last] += "\n" + line.strip()
        else:
            key, sep, value = line.partition(":")
            if sep:
                last = key.strip()
                fields[last] = value.strip()


def relation_names(value: str) -> list[str]:
    """Package names of a Depends-style field: alternatives flattened, versions, architecture
    qualifiers (``:any``) and restrictions dropped. ``"a (>= 1) | b:any, c"`` -> a, b, c."""
    names: list[str] = []
    for group in value.split(","):
        for alternative in group.split("|"):
            name = re.split(r"[\s(:\[<]", alternative.strip(), maxsplit=1)[0]
            if name and name not in names:
                names.append(name)
    return names


def _show(plan: list[tuple[str, str, str]], workdir: Path) -> dict[str, dict[str, str]]:
    argv = ["apt-cache", "show", "--no-all-versions", *_options(workdir), "--"]
    argv += [f"{name}={version}" for name, version, _ in plan]
    proc = _run(argv, workdir)
    if proc.returncode != 0:
        raise _apt_failure("apt-cache show", proc)
    found: dict[str, dict[str, str]] = {}
    for stanza in stanzas(proc.stdout):
        found.setdefault(stanza.get("Package", ""), stanza)
    return found


def _providers(found: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Virtual package -> the resolved packages providing it ("awk" -> ["mawk"])."""
    providers: dict[str, list[str]] = {}
    for name, stanza in found.items():
        for virtual in relation_names(stanza.get("Provides", "")):
            providers.setdefault(virtual, []).append(name)
    return providers


def _candidate(
    name: str, version: str, arch: str, found: dict[str, dict[str, str]]
) -> dict[str, object]:
    """One package's record; a dependency on a virtual package is pointed at the resolved
    package providing it, so a refusal can still name the chain that pulled the provider in."""
    stanza = found.get(name)
    if stanza is None or stanza.get("Version") != version:
        raise AptError(f"package {name}: apt-cache has no record of version {version}")
    if stanza.get("Architecture") != arch:
        raise AptError(f"package {name}: architecture {stanza.get('Architecture')} is not {arch}")
    sha256, size = stanza.get("SHA256", ""), stanza.get("Size", "")
    if SHA256_RE.fullmatch(sha256) is None:
        raise AptError(f"package {name}: the archive index gives no SHA-256 for {version}")
    if not size.isdigit() or int(size) <= 0:
        raise AptError(f"package {name}: the archive index gives no size for {version}")
    providers = _providers(found)
    named = relation_names(stanza.get("Pre-Depends", "")) + relation_names(
        stanza.get("Depends", "")
    )
    depends = [p for d in named for p in ([d] if d in found else providers.get(d, [d]))]
    return {
        "name": name,
        "version": version,
        "architecture": arch,
        "sha256": sha256,
        "size": int(size),
        "essential": stanza.get("Essential", "").lower() == "yes",
        "priority": stanza.get("Priority", "").lower(),
        "depends": list(dict.fromkeys(depends)),
    }


def resolve(names: Sequence[str], status_text: str, workdir: Path) -> list[dict[str, object]]:
    """What apt would add for ``names`` on top of the packages in ``status_text`` (a dpkg status
    file): one JSON-able dict per package in apt's order, shaped like
    ``ironclawd.domain.packages.Candidate``. AptError (a ValueError) names the package apt could
    not resolve, e.g. "package nosuch: not in the host's configured archives"."""
    if not names:
        return []
    _check_names(names)
    (workdir / "cache").mkdir(parents=True, exist_ok=True)
    (workdir / "status").write_text(status_text, encoding="utf-8")
    plan = _plan(names, workdir)
    found = _show(plan, workdir)
    return [_candidate(name, version, arch, found) for name, version, arch in plan]


def download(name: str, version: str, workdir: Path) -> Path:
    """Download ``name`` at ``version`` from the host's archives into a new directory under
    ``workdir`` and return the ``.deb``'s path. apt checks the archive's signature and the
    file's hash against the signed index; the caller re-checks the hash it approved."""
    return download_all([(name, version)], workdir)[0]


def download_all(wanted: Sequence[tuple[str, str]], workdir: Path) -> list[Path]:
    """Every ``(name, version)`` of ``wanted`` by one ``apt-get download`` (apt builds its cache
    once, seconds of CPU on this host), the ``.deb`` paths in the same order."""
    for name, version in wanted:
        _check_names([name])
        if len(version) > 128 or VERSION_RE.fullmatch(version) is None:
            raise AptError(f"package {name}: {version[:100]!r} is not a Debian version")
    if len({name for name, _ in wanted}) != len(wanted):
        raise AptError("download: a package is named twice")
    (workdir / "cache").mkdir(parents=True, exist_ok=True)
    target = workdir / "download"
    target.mkdir()  # new and empty: the .debs apt writes are the only files here
    asked = [f"{name}={version}" for name, version in wanted]
    argv = ["apt-get", "download", "-o", f"Dir::Cache={workdir / 'cache'}"]
    argv += ["-o", "Debug::NoLocking=1", "--", *asked]
    proc = _run(argv, target)
    if proc.returncode != 0:
        raise _apt_failure(f"apt-get download {' '.join(asked)}", proc)
    debs = [p for p in target.iterdir() if p.is_file() and p.name.endswith(".deb")]
    found = []
    for name, version in wanted:
        # apt names the file NAME_VERSION_ARCH.deb (an epoch's colon escaped): match the name.
        mine = [p for p in debs if p.name.startswith(f"{name}_")]
        if len(mine) != 1:
            raise AptError(
                f"apt-get download {name}={version}: expected one .deb, found {len(mine)}"
            )
        found.append(mine[0])
    if len(debs) != len(wanted):
        raise AptError(f"apt-get download: expected {len(wanted)} .debs, found {len(debs)}")
    return found
