"""Debian packages granted to an agent: the names a ``packages`` change may carry, what apt
resolved for them, and the policy that refuses shells, interpreters and essential packages, also
when they arrive as a dependency (docs/packages.md). Pure values and checks, no I/O.

A change names packages only (``{"packages": ["jq"]}``); the host resolves them with apt against
the base image's package list into `Candidate` values, and `check_resolved` turns those into the
`AgentPackage` set the approver sees and the hash covers, or refuses the whole set naming the
package, why, and which requested package pulled it in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ironclawd import lazy_re
from ironclawd.errors import InvalidArgument, PolicyDenied

PACKAGE_NAME_RE = lazy_re.compile(r"[a-z0-9][a-z0-9+.-]{1,62}")
MAX_PACKAGES = 32
# Debian policy §5.6.12: [epoch:]upstream[-revision]; upstream starts with a digit. The colon
# only as the epoch's separator: a version reaches apt as NAME=VERSION, never anything else.
VERSION_RE = lazy_re.compile(
    r"(?:[0-9]{1,9}:)?[0-9][A-Za-z0-9.+~]*(?:-[A-Za-z0-9.+~-]*[A-Za-z0-9.+~])?"
)
MAX_VERSION = 128
# Debian's release architectures, and "all" for architecture-independent packages.
ARCHITECTURES = frozenset(
    {"all", "amd64", "arm64", "armel", "armhf", "i386", "mips64el", "ppc64el", "riscv64", "s390x"}
)
SHA256_RE = lazy_re.compile(r"[0-9a-f]{64}")
MAPPING_KEYS = frozenset({"name", "version", "architecture", "sha256", "size", "requested"})

# What `run` could use to execute arbitrary code, by package name (fullmatch). A shell or an
# interpreter reads a program from its arguments, stdin or a workspace file, which would turn
# "run a granted program" into "run anything". Libraries and modules for a language (python3-yaml,
# libperl5.36, perl-modules-5.36, ruby-json, php8.2-mbstring) ship no interpreter of their own:
# they are not listed, and are refused through the dependency on their interpreter instead, with
# the chain named. The unpacker refuses interpreter executables by path as a second wall.
SHELLS = tuple(
    lazy_re.compile(p)
    for p in (
        r"(?:bash|dash|zsh|ksh|mksh|posh|yash|csh|tcsh|loksh|oksh|pdksh|sash|ash)(?:-static)?",
        r"ksh93.*",  # ksh93u+m
        r"fish|rc|es|elvish|xonsh|nushell|ion-shell",
        r"busybox(?:-.+)?",  # busybox, busybox-static, busybox-syslogd: busybox's sh applet
    )
)
INTERPRETERS = tuple(
    lazy_re.compile(p)
    for p in (
        # Python: the interpreter packages (python3, python3.11, their -minimal/-dbg/-nopie/-full
        # builds, python-is-python3), PyPy, and the interactive shells built on them.
        r"python[0-9.]*(?:-minimal|-dbg|-nopie|-full)?",
        r"python-is-python[0-9]+",
        r"pypy[0-9.]*(?:-.+)?",
        r"ipython[0-9]*|bpython[0-9]*",
        # Perl: perl and perl-base ship /usr/bin/perl (perl-debug a debug perl). Not libperl5.*
        # (a library) nor perl-modules-* (modules, useless without perl, which they depend on).
        r"perl|perl-base|perl-debug",
        r"rakudo|raku|moarvm",
        r"ruby[0-9.]*|jruby",
        r"lua[0-9.]*|luajit[0-9.]*",
        r"nodejs|node|deno|gjs|rhino|duktape",
        r"php[0-9.]*(?:-cli|-cgi|-fpm|-phpdbg)?",
        # Tcl/Tk (tclsh, wish), expect (a Tcl interpreter), jimsh.
        r"tcl[0-9.]*|tk[0-9.]*|expect|jimsh",
        r"guile-[0-9.]+",
        # awk is a programming language with file I/O and system().
        r"gawk|mawk|original-awk",
        # JVM and CLR runtimes run a class/assembly file the agent could write.
        r"openjdk-[0-9]+-(?:jre|jdk)(?:-headless|-zero)?|default-(?:jre|jdk)(?:-headless)?",
        r"jython|groovy|kotlin|scala|bsh",
        r"mono-runtime(?:-.+)?|mono-complete",
        r"octave|r-base|r-base-core|julia",
        r"erlang-base(?:-hipe)?|elixir|ghc|hugs|ocaml-interp|ocaml-nox|ocaml",
        r"sbcl|clisp|ecl|racket|chezscheme|chicken-bin|gauche|gforth|newlisp|picolisp|nickle",
        r"swi-prolog(?:-.+)?|gprolog|yap|pike[0-9.]*(?:-core|-full)?",
        # Not interpreters by name, but they run code from their arguments: tcc -run, gdb's
        # python, the scripting languages of vim and emacs (with file and process access).
        r"tcc|gdb(?:-minimal|-multiarch)?",
        r"vim(?:-tiny|-nox|-gtk3|-motif|-athena)?|neovim",
        r"emacs(?:-nox|-gtk|-lucid|-bin-common)?",
    )
)


@dataclass(frozen=True)
class AgentPackage:
    """One `.deb` in an agent's approved set: what is downloaded, re-checked and unpacked."""

    name: str
    version: str
    architecture: str
    sha256: str  # of the .deb, from the archive's signed index
    size: int  # bytes of the .deb
    requested: bool  # named in the change (False: pulled in as a dependency)


@dataclass(frozen=True)
class Candidate:
    """What apt resolved for a name, before policy."""

    name: str
    version: str
    architecture: str
    sha256: str
    size: int
    essential: bool
    priority: str
    depends: tuple[str, ...]  # names (Depends + Pre-Depends, alternatives flattened)


def interpreter_reason(name: str) -> str | None:
    """ "a shell" or "an interpreter" if the package ``name`` provides one, else None."""
    if any(p.fullmatch(name) for p in SHELLS):
        return "a shell"
    if any(p.fullmatch(name) for p in INTERPRETERS):
        return "an interpreter"
    return None


ARCHIVE_NAME = "expected a package name from the host's configured archives"
# Why a string is not a bare package name, most specific first: (test, what to tell the operator).
NAME_PROBLEMS: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda n: "://" in n, f"is a URL; {ARCHIVE_NAME}"),
    (lambda n: "/" in n or n.startswith(("~", ".")), f"is a path; {ARCHIVE_NAME}"),
    (lambda n: n.endswith(".deb"), "is a .deb file; local packages are refused, " + ARCHIVE_NAME),
    (
        lambda n: any(c in n for c in "=<>() "),
        "carries a version; expected a name only (apt resolves the version, the diff shows it)",
    ),
    (lambda n: ":" in n, "has ':' (an architecture or a URL scheme); expected a name only"),
    (lambda n: n != n.lower(), "has uppercase letters; Debian package names are lowercase"),
    (lambda n: "_" in n, "has '_'; Debian package names have only a-z 0-9 + - ."),
    (
        lambda n: PACKAGE_NAME_RE.fullmatch(n) is None,
        "is not a Debian package name (2 to 63 of a-z 0-9 + - ., starting with a letter or digit)",
    ),
)


def _name_problem(name: str) -> str | None:
    """Why ``name`` is not a bare Debian package name, in words an operator can act on."""
    return next((why for test, why in NAME_PROBLEMS if test(name)), None)


def check_names(raw: object) -> tuple[str, ...]:
    """The distinct package names of a ``packages`` payload, in order, or InvalidArgument naming
    ``payload.packages`` and what was expected. ``[]`` is valid: it revokes every package."""
    if not isinstance(raw, list):
        raise InvalidArgument(
            f'payload.packages: expected a list of Debian package names (e.g. ["jq"]), '
            f"got {type(raw).__name__}"
        )
    for index, name in enumerate(raw):
        if not isinstance(name, str):
            raise InvalidArgument(
                f"payload.packages[{index}]: expected a package name (text), "
                f"got {type(name).__name__}"
            )
        problem = _name_problem(name)
        if problem is not None:
            raise InvalidArgument(f"payload.packages[{index}]: {name[:100]!r} {problem}")
    names = tuple(dict.fromkeys(raw))
    if len(names) > MAX_PACKAGES:
        raise InvalidArgument(
            f"payload.packages: expected at most {MAX_PACKAGES} packages, got {len(names)}"
        )
    return names


def _chains(requested: Sequence[str], found: Mapping[str, Candidate]) -> dict[str, list[str]]:
    """For each resolved package, the shortest path from a requested name down to it (a
    breadth-first walk of the candidates' dependencies, requested names in order)."""
    paths: dict[str, list[str]] = {}
    queue: list[str] = []
    for name in requested:
        if name in found and name not in paths:
            paths[name] = [name]
            queue.append(name)
    while queue:
        current = queue.pop(0)
        for dep in found[current].depends:
            if dep in found and dep not in paths:
                paths[dep] = [*paths[current], dep]
                queue.append(dep)
    return paths


def _refusal(candidate: Candidate) -> str | None:
    reasons: list[str] = []
    kind = interpreter_reason(candidate.name)
    if kind is not None:
        reasons.append(f"is {kind}")
    if candidate.essential:
        reasons.append("is essential (Essential: yes)")
    if candidate.priority == "required":
        reasons.append("has Priority: required")
    if not reasons:
        return None
    return reasons[0] if len(reasons) == 1 else ", ".join(reasons[:-1]) + " and " + reasons[-1]


def check_resolved(
    requested: tuple[str, ...], found: Sequence[Candidate]
) -> tuple[AgentPackage, ...]:
    """The approved-set candidates as `AgentPackage` values (sorted by name), or PolicyDenied
    naming the first refused package, why, and the chain of requested packages that needs it:
    "package python3 (needed by python3-yaml) is an interpreter; nothing was queued"."""
    by_name: dict[str, Candidate] = {}
    for candidate in found:
        if candidate.name in by_name:
            raise InvalidArgument(f"resolved packages: {candidate.name} appears twice")
        by_name[candidate.name] = candidate
    missing = [name for name in requested if name not in by_name]
    if missing:
        raise InvalidArgument(
            f"payload.packages: {', '.join(missing)} resolved to nothing to unpack "
            "(already in the base image?)"
        )
    chains = _chains(requested, by_name)
    # Requested packages first, then dependencies in walk order, then anything apt added that
    # no dependency names (a chain cannot be shown for those).
    order = [*chains, *(c.name for c in found if c.name not in chains)]
    refused = [(name, why) for name in order if (why := _refusal(by_name[name])) is not None]
    if refused:
        name, why = refused[0]
        chain = chains.get(name)
        if chain is None:
            via = f" (pulled in by apt for {', '.join(requested)})"
        elif len(chain) > 1:
            via = f" (needed by {' -> '.join(chain[:-1])})"
        else:
            via = ""
        more = f"; also refused: {', '.join(n for n, _ in refused[1:])}" if refused[1:] else ""
        raise PolicyDenied(f"package {name}{via} {why}; nothing was queued{more}")
    wanted = set(requested)
    return tuple(
        AgentPackage(c.name, c.version, c.architecture, c.sha256, c.size, c.name in wanted)
        for c in sorted(found, key=lambda c: c.name)
    )


def package_to_mapping(p: AgentPackage) -> dict[str, object]:
    """The JSON form stored in the change's payload (``resolved``) and the agent's spec."""
    return {
        "name": p.name,
        "version": p.version,
        "architecture": p.architecture,
        "sha256": p.sha256,
        "size": p.size,
        "requested": p.requested,
    }


def package_from_mapping(raw: object, where: str) -> AgentPackage:
    """The inverse of `package_to_mapping`, strict: InvalidArgument naming ``where`` and the
    field for anything else (unknown keys, a malformed version, a size that is not a count)."""
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{where}: expected an object with {', '.join(sorted(MAPPING_KEYS))}")
    keys = set(raw)
    if keys != MAPPING_KEYS:
        extra, absent = sorted(keys - MAPPING_KEYS), sorted(MAPPING_KEYS - keys)
        raise InvalidArgument(
            f"{where}: expected exactly the keys {', '.join(sorted(MAPPING_KEYS))}"
            + (f"; unexpected {', '.join(map(str, extra))}" if extra else "")
            + (f"; missing {', '.join(absent)}" if absent else "")
        )
    name, version, arch = raw["name"], raw["version"], raw["architecture"]
    sha256, size, requested = raw["sha256"], raw["size"], raw["requested"]
    if not isinstance(name, str) or PACKAGE_NAME_RE.fullmatch(name) is None:
        raise InvalidArgument(f"{where}.name: expected a Debian package name")
    if not isinstance(version, str) or not check_version(version):
        raise InvalidArgument(
            f"{where}.version: expected a Debian version ([epoch:]upstream[-rev])"
        )
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise InvalidArgument(
            f"{where}.architecture: expected one of {', '.join(sorted(ARCHITECTURES))}"
        )
    if not isinstance(sha256, str) or SHA256_RE.fullmatch(sha256) is None:
        raise InvalidArgument(f"{where}.sha256: expected 64 lowercase hex digits")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise InvalidArgument(f"{where}.size: expected a positive number of bytes")
    if not isinstance(requested, bool):
        raise InvalidArgument(f"{where}.requested: expected true or false")
    return AgentPackage(name, version, arch, sha256, size, requested)


def check_version(version: str) -> bool:
    """Whether ``version`` is a Debian version string apt may be given as NAME=VERSION."""
    return len(version) <= MAX_VERSION and VERSION_RE.fullmatch(version) is not None


def candidate_from_mapping(raw: object, where: str) -> Candidate:
    """A `Candidate` from the resolver's JSON (``pkg_apt.resolve``), strict like
    `package_from_mapping`: the resolver runs unprivileged and its output is checked."""
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{where}: expected an object")
    essential, priority, depends = raw.get("essential"), raw.get("priority"), raw.get("depends")
    base = {k: raw.get(k) for k in MAPPING_KEYS - {"requested"}}
    package = package_from_mapping({**base, "requested": False}, where)
    if not isinstance(essential, bool):
        raise InvalidArgument(f"{where}.essential: expected true or false")
    if not isinstance(priority, str) or not re.fullmatch(r"[a-z-]{0,32}", priority):
        raise InvalidArgument(f"{where}.priority: expected a Debian priority")
    if not isinstance(depends, list) or not all(_is_name(d) for d in depends):
        raise InvalidArgument(f"{where}.depends: expected a list of package names")
    if set(raw) - {*base, "essential", "priority", "depends"}:
        raise InvalidArgument(f"{where}: unexpected keys")
    return Candidate(
        package.name, package.version, package.architecture, package.sha256, package.size,
        essential, priority, tuple(depends),
    )  # fmt: skip


def _is_name(value: object) -> bool:
    return isinstance(value, str) and PACKAGE_NAME_RE.fullmatch(value) is not None
