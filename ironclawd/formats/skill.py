"""Skills: a folder of text in the Agent Skills layout, signed with minisign over a manifest.

A skill is data, never code. Its folder holds ``SKILL.md`` (YAML front matter, then the
instructions) and optional reference files, all UTF-8 text of an allowlist of types, bounded in
count and size; and ``SKILL.minisig``, a minisign signature (prehashed, as ``minisign -S`` writes
by default) over the canonical manifest of every other file::

    ironclaw-skill-manifest v1
    <sha256 hex>  <path>          (one line per file, sorted by path; sha256sum's layout)

The front matter names the skill (``name``, equal to the folder's name), describes it
(``description``), may give a ``version`` (default "0") and may ask for grants in an
``ironclaw:`` mapping: ``tools`` (catalogue names), ``egress`` (rules as in the egress kind; never
a credential) and ``mcp_tools`` (``server/tool``). The daemon checks names and rules against its
catalogue and registry (domain/kinds/skills.py); this module checks the form and is shared with
ironctl, which reads a folder with formats/skill_folder.py. The daemon only ever sees the files'
text in a change payload.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ironclawd import lazy_re
from ironclawd.errors import InvalidArgument, MinisignFormatError, PolicyDenied, SignatureMismatch
from ironclawd.formats import minisign

SKILL_FILE = "SKILL.md"
SIGNATURE_FILE = "SKILL.minisig"
MANIFEST_HEADER = "ironclaw-skill-manifest v1\n"
DEFAULT_VERSION = "0"
NAME_RE = lazy_re.compile(r"[a-z0-9][a-z0-9-]{0,63}")  # = domain.skills.SKILL_NAME_RE
VERSION_RE = lazy_re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}")
# A path component: no leading dot (no hidden files, no '..'), a safe alphabet (sha256sum prints
# such names unescaped, so the manifest is its output), and a type from the allowlist.
_COMPONENT = lazy_re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_MCP_TOOL = lazy_re.compile(r"([a-z][a-z0-9-]{0,31})/([A-Za-z0-9_.-]{1,128})")
TEXT_SUFFIXES = (
    ".md",
    ".markdown",
    ".txt",
    ".rst",
    ".json",
    ".yaml",
    ".yml",
    ".toml",
    ".csv",
    ".tsv",
)
MAX_FILES = 64
MAX_DEPTH = 4
MAX_PATH = 255
MAX_FILE_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 1024 * 1024
MAX_FRONT_MATTER = 16 * 1024
MAX_DESCRIPTION = 1024  # the Agent Skills limit
MAX_GRANTS = 32  # each of tools, egress rules, MCP tools
# Agent Skills front matter keys, and ours.
FRONT_MATTER_KEYS = frozenset(
    {
        "name",
        "description",
        "version",
        "license",
        "compatibility",
        "metadata",
        "allowed-tools",
        "ironclaw",
    }
)
IRONCLAW_KEYS = frozenset({"tools", "egress", "mcp_tools"})
EGRESS_KEYS = frozenset({"host", "scheme", "port", "methods", "path_prefixes"})
CREDENTIAL_KEYS = frozenset({"credential", "credential_header", "credential_format"})
# Text: no C0 control characters but tab, newline, carriage return and form feed; no DEL.
_CONTROL = lazy_re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class SkillFileText:
    path: str
    text: str
    sha256: str
    size: int  # bytes


@dataclass(frozen=True)
class Skill:
    """A skill whose form is checked (not yet its signature: :func:`verify`)."""

    name: str
    version: str
    description: str
    files: tuple[SkillFileText, ...]  # sorted by path; SKILL.md among them
    signature: str  # the SKILL.minisig text
    tools: tuple[str, ...] = ()
    egress: tuple[Mapping[str, Any], ...] = ()  # rules as written (the kind parses them)
    mcp_tools: tuple[tuple[str, str], ...] = ()  # (server, tool)

    @property
    def manifest(self) -> bytes:
        return manifest((f.path, f.sha256) for f in self.files)

    @property
    def manifest_sha256(self) -> str:
        return hashlib.sha256(self.manifest).hexdigest()

    @property
    def signer(self) -> str:
        """The key id the signature names (minisign's 16 hex digits); trusted only once
        :func:`verify` passed."""
        return minisign.key_id_hex(minisign.parse_signature(self.signature).key_id)


def manifest(entries: Iterable[tuple[str, str]]) -> bytes:
    """The canonical manifest over (path, sha256 hex) pairs: what a signature covers."""
    lines = [f"{digest}  {path}\n" for path, digest in sorted(entries)]
    return (MANIFEST_HEADER + "".join(lines)).encode("ascii")


def load(name: str, files: Mapping[str, bytes], signature: str | None) -> Skill:
    """A skill from its folder's name, its files (path -> bytes, the signature file excluded)
    and its signature's text; InvalidArgument (PolicyDenied for a credential) naming the file
    and what was expected."""
    if signature is None:
        raise InvalidArgument(
            f"skill {name}: unsigned: no {SIGNATURE_FILE} (sign it: ironctl "
            "skill sign, or minisign -S over ironctl skill manifest)"
        )
    if NAME_RE.fullmatch(name) is None:
        raise InvalidArgument(f"skill name {name!r}: expected [a-z0-9][a-z0-9-]{{0,63}}")
    texts = check_files(name, files)
    sig = minisign.parse_signature(signature)  # MinisignFormatError is an InvalidArgument
    if not sig.prehashed:
        raise InvalidArgument(
            f"skill {name}: {SIGNATURE_FILE}: a legacy (not prehashed) "
            "signature; expected minisign's default prehashed one"
        )
    skill_md = next((f for f in texts if f.path == SKILL_FILE), None)
    if skill_md is None:
        raise InvalidArgument(f"skill {name}: no {SKILL_FILE} at the top of the folder")
    meta = front_matter(name, skill_md.text)
    if meta["name"] != name:
        raise InvalidArgument(
            f"skill {name}: {SKILL_FILE}: name {meta['name']!r} must equal "
            f"the folder's name {name!r}"
        )
    return Skill(files=texts, signature=signature, **meta)


def check_files(name: str, files: Mapping[str, bytes]) -> tuple[SkillFileText, ...]:
    """Every file an allowed path and type, UTF-8 text, within the bounds; sorted by path."""
    if len(files) > MAX_FILES:
        raise InvalidArgument(f"skill {name}: {len(files)} files; expected at most {MAX_FILES}")
    total = sum(len(data) for data in files.values())
    if total > MAX_TOTAL_BYTES:
        raise InvalidArgument(
            f"skill {name}: {total} bytes in all; expected at most {MAX_TOTAL_BYTES}"
        )
    seen: dict[str, str] = {}
    out = []
    for path in sorted(files):
        check_path(name, path)
        folded = path.lower()
        if folded in seen:
            raise InvalidArgument(f"skill {name}: {path} and {seen[folded]} differ only in case")
        seen[folded] = path
        out.append(_text(name, path, files[path]))
    return tuple(out)


def check_path(name: str, path: str) -> None:
    where = f"skill {name}: {path!r}"
    parts = path.split("/")
    if len(path) > MAX_PATH or len(parts) > MAX_DEPTH:
        raise InvalidArgument(
            f"{where}: expected a path of at most {MAX_DEPTH} levels and {MAX_PATH} characters"
        )
    bad = next((p for p in parts if _COMPONENT.fullmatch(p) is None), None)
    if bad is not None:
        raise InvalidArgument(
            f"{where}: expected names of letters, digits, '.', '_', '-' not "
            "starting with '.' (no hidden files, no '..')"
        )
    if path == SIGNATURE_FILE:
        raise InvalidArgument(f"{where}: the signature is not one of the signed files")
    if not path.lower().endswith(TEXT_SUFFIXES):
        raise InvalidArgument(
            f"{where}: not an allowed type; a skill is text only, expected "
            f"one of {' '.join(TEXT_SUFFIXES)} (no scripts, no binaries)"
        )


def _text(name: str, path: str, data: bytes) -> SkillFileText:
    where = f"skill {name}: {path}"
    if len(data) > MAX_FILE_BYTES:
        raise InvalidArgument(f"{where}: {len(data)} bytes; expected at most {MAX_FILE_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(
            f"{where}: not UTF-8 text (byte {exc.start}); a skill is text only"
        ) from None
    control = _CONTROL.search(text)
    if control is not None:
        raise InvalidArgument(
            f"{where}: control character {control.group()!r} at offset "
            f"{control.start()}; expected text (binary files are refused)"
        )
    if text.lstrip("\ufeff").startswith("#!"):
        raise InvalidArgument(f"{where}: starts with '#!'; a skill ships no scripts")
    return SkillFileText(path, text, hashlib.sha256(data).hexdigest(), len(data))


@functools.cache
def _no_aliases_loader() -> type:
    """safe_load without anchors and aliases (no billion-laughs expansion). Made at the first
    skill read: PyYAML (~9 ms of imports) is not loaded at the daemon's start (issue 17)."""
    import yaml  # noqa: PLC0415

    class NoAliases(yaml.SafeLoader):  # type: ignore[misc]
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError("aliases (*name) are not allowed")
            return super().compose_node(parent, index)

    return NoAliases


def front_matter(name: str, text: str) -> dict[str, Any]:
    """``SKILL.md``'s front matter as the fields of :class:`Skill` (name, version, description,
    tools, egress, mcp_tools)."""
    where = f"skill {name}: {SKILL_FILE}"
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    end = next((i for i, line in enumerate(lines[1:], 1) if line.rstrip("\r\n") == "---"), None)
    if not lines or lines[0].rstrip("\r\n") != "---" or end is None:
        raise InvalidArgument(f"{where}: expected YAML front matter between '---' lines at the top")
    block = "".join(lines[1:end])
    if len(block) > MAX_FRONT_MATTER:
        raise InvalidArgument(f"{where}: front matter longer than {MAX_FRONT_MATTER} characters")
    import yaml  # noqa: PLC0415 (loaded by _no_aliases_loader: a dictionary lookup)

    try:
        meta = yaml.load(block, Loader=_no_aliases_loader())  # noqa: S506 - SafeLoader, no aliases
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"{where}: front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise InvalidArgument(f"{where}: front matter must be a mapping (name: ..., ...)")
    extra = sorted(str(k) for k in set(meta) - FRONT_MATTER_KEYS)
    if extra:
        raise InvalidArgument(
            f"{where}: unknown front matter key(s) {', '.join(extra)} "
            f"(expected: {', '.join(sorted(FRONT_MATTER_KEYS))})"
        )
    skill_name = meta.get("name")
    if not isinstance(skill_name, str) or NAME_RE.fullmatch(skill_name) is None:
        raise InvalidArgument(f"{where}: name: expected [a-z0-9][a-z0-9-]{{0,63}}")
    description = meta.get("description")
    if (
        not isinstance(description, str)
        or not description.strip()
        or len(description) > MAX_DESCRIPTION
    ):
        raise InvalidArgument(
            f"{where}: description: expected text of 1 to {MAX_DESCRIPTION} characters"
        )
    version = meta.get("version", DEFAULT_VERSION)
    version = (
        str(version) if isinstance(version, int) and not isinstance(version, bool) else version
    )
    if not isinstance(version, str) or VERSION_RE.fullmatch(version) is None:
        raise InvalidArgument(f"{where}: version: expected text like 1.2.0 (quote it in YAML)")
    return {
        "name": skill_name,
        "description": description.strip(),
        "version": version,
        **_grants(where, meta.get("ironclaw", {})),
    }


def _grants(where: str, raw: object) -> dict[str, Any]:
    where = f"{where}: ironclaw"
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{where}: expected a mapping of tools, egress, mcp_tools")
    extra = sorted(str(k) for k in set(raw) - IRONCLAW_KEYS)
    if extra:
        raise InvalidArgument(
            f"{where}: unknown key(s) {', '.join(extra)} (expected: "
            f"{', '.join(sorted(IRONCLAW_KEYS))})"
        )
    tools = _list(where, raw, "tools")
    if not all(isinstance(t, str) for t in tools):
        raise InvalidArgument(f"{where}.tools: expected a list of tool names")
    mcp = []
    for item in _list(where, raw, "mcp_tools"):
        m = _MCP_TOOL.fullmatch(item) if isinstance(item, str) else None
        if m is None:
            raise InvalidArgument(f"{where}.mcp_tools: {item!r}: expected 'server/tool'")
        mcp.append((m.group(1), m.group(2)))
    egress = []
    for index, rule in enumerate(_list(where, raw, "egress")):
        if not isinstance(rule, dict):
            raise InvalidArgument(f"{where}.egress[{index}]: expected a mapping with 'host'")
        if CREDENTIAL_KEYS & set(rule):
            raise PolicyDenied(
                f"{where}.egress[{index}]: asks for a credential; a skill can "
                "never carry one (an operator grants credentials with an egress "
                "change)"
            )
        extra = sorted(str(k) for k in set(rule) - EGRESS_KEYS)
        if extra:
            raise InvalidArgument(
                f"{where}.egress[{index}]: unknown key(s) {', '.join(extra)} "
                f"(expected: {', '.join(sorted(EGRESS_KEYS))})"
            )
        egress.append(rule)
    return {
        "tools": tuple(dict.fromkeys(tools)),
        "egress": tuple(egress),
        "mcp_tools": tuple(dict.fromkeys(mcp)),
    }


def _list(where: str, raw: Mapping[str, Any], key: str) -> list[Any]:
    value = raw.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_GRANTS:
        raise InvalidArgument(f"{where}.{key}: expected a list of at most {MAX_GRANTS}")
    return value


# -- signatures ----------------------------------------------------------------------------------


def verify(skill: Skill, trusted: Mapping[str, str]) -> str:
    """The signer's key id if ``skill``'s signature verifies under one of the ``trusted`` keys
    (source -> public key file text); see :func:`verify_manifest`."""
    return verify_manifest(skill.name, skill.manifest, skill.signature, trusted)


def verify_manifest(name: str, body: bytes, signature: str, trusted: Mapping[str, str]) -> str:
    """The signer's key id if ``signature`` over the manifest ``body`` verifies under one of the
    ``trusted`` keys; PolicyDenied for a key that is not trusted, SignatureMismatch for a
    signature that does not match the files, InvalidArgument for a malformed or legacy one."""
    sig = minisign.parse_signature(signature)
    wanted = minisign.key_id_hex(sig.key_id)
    unreadable = []
    for source, text in sorted(trusted.items()):
        try:
            key = minisign.parse_public_key(text)
        except MinisignFormatError as exc:
            unreadable.append(f"{source}: {exc}")
            continue
        if key.key_id == sig.key_id:
            try:
                minisign.verify(key, body, sig, allow_legacy=False)
            except SignatureMismatch:
                raise SignatureMismatch(
                    f"skill {name}: the files do not match the signature by key {wanted} (a "
                    "file added, removed or changed after signing, or another manifest signed)"
                ) from None
            return wanted
    skipped = f"; unreadable key files skipped: {'; '.join(unreadable)}" if unreadable else ""
    raise PolicyDenied(
        f"skill {name}: signed by key {wanted}, which is not a trusted skill "
        f"key ({len(trusted)} key files){skipped}"
    )


def sign(
    skill_name: str, files: Mapping[str, bytes], key: minisign.SecretKey, trusted_comment: str
) -> str:
    """``SKILL.minisig``'s text for these files (their form checked first)."""
    texts = check_files(skill_name, files)
    body = manifest((f.path, f.sha256) for f in texts)
    return minisign.sign(key, body, trusted_comment).to_file()
