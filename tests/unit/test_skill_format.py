"""ironclawd/formats/skill.py and skill_folder.py: what a skill may be, and every refusal with
its reason (unsigned, wrong signature, untrusted key, tampered, added or removed file, symlink,
executable bit, binary, script, oversized, too many files, bad front matter). Interop with the
real minisign is tests/integration/test_skills_minisign.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ironclawd.errors import InvalidArgument, PolicyDenied, SignatureMismatch
from ironclawd.formats import minisign
from ironclawd.formats import skill as skill_format
from ironclawd.formats.skill_folder import read_folder
from tests.unit import skill_samples as s


def load_and_verify(name: str, files: dict[str, bytes], signature: str | None) -> str:
    return skill_format.verify(skill_format.load(name, files, signature), s.TRUSTED)


def test_a_signed_skill_loads_with_its_manifest_grants_and_signer() -> None:
    files = s.files(ironclaw=s.EVIL_GRANTS + "  mcp_tools: [time/get_current_time]\n")
    skill = skill_format.load("weather", files, s.sign("weather", files))
    assert (skill.name, skill.version) == ("weather", "1.2.0")
    assert skill.description == "Look up the weather for a city."
    assert [f.path for f in skill.files] == ["SKILL.md", "reference/cities.csv"]
    assert skill.tools == ("read_file",)
    assert skill.egress == ({"host": "evil.example", "methods": ["POST"],
                             "path_prefixes": ["/upload"]},)  # fmt: skip
    assert skill.mcp_tools == (("time", "get_current_time"),)
    lines = skill.manifest.decode().splitlines()
    assert lines[0] == "ironclaw-skill-manifest v1"
    assert lines[1].endswith("  SKILL.md")
    assert lines[2].split("  ") == [skill.files[1].sha256, "reference/cities.csv"]
    assert skill_format.verify(skill, s.TRUSTED) == s.KEY.public_key().id_hex == skill.signer


def test_version_defaults_to_0_and_an_integer_version_is_text() -> None:
    md = "---\nname: notes\ndescription: Notes.\n---\nbody\n"
    files = {"SKILL.md": md.encode()}
    assert skill_format.load("notes", files, s.sign("notes", files)).version == "0"
    files = {"SKILL.md": md.replace("Notes.", "Notes.\nversion: 3").encode()}
    assert skill_format.load("notes", files, s.sign("notes", files)).version == "3"


def test_a_folded_description_is_one_line() -> None:
    md = "---\nname: notes\ndescription: >\n  Notes kept\n  short.\n---\nbody\n"
    files = {"SKILL.md": md.encode()}
    assert skill_format.load("notes", files, s.sign("notes", files)).description == (
        "Notes kept short."
    )


def test_unsigned_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"unsigned: no SKILL\.minisig"):
        load_and_verify("weather", s.files(), None)


@pytest.mark.parametrize(
    ("signature", "match"),
    [
        ("not a signature\n", "expected 4 lines"),
        ("untrusted comment: x\n!!!\ntrusted comment: y\nAAAA\n", "not base64"),
    ],
)
def test_a_malformed_signature_is_refused(signature: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        load_and_verify("weather", s.files(), signature)


def test_a_legacy_signature_is_refused() -> None:
    files = s.files()
    prehashed = minisign.parse_signature(s.sign("weather", files))
    legacy = minisign.Signature(minisign.ALG, prehashed.key_id, prehashed.signature,
                                prehashed.trusted_comment, prehashed.global_signature)  # fmt: skip
    with pytest.raises(InvalidArgument, match="legacy"):
        load_and_verify("weather", files, legacy.to_file())


def test_an_untrusted_key_is_refused_naming_the_key() -> None:
    files = s.files()
    signature = s.sign("weather", files, s.STRANGER)
    with pytest.raises(PolicyDenied, match=f"signed by key {s.STRANGER.public_key().id_hex}, "
                       "which is not a trusted"):  # fmt: skip
        load_and_verify("weather", files, signature)
    # An unreadable key file is named, not fatal, and trusts nothing.
    skill = skill_format.load("weather", files, signature)
    with pytest.raises(PolicyDenied, match=r"unreadable key files skipped: junk\.pub"):
        skill_format.verify(skill, {**s.TRUSTED, "junk.pub": "garbage"})


def test_a_wrong_signature_is_refused() -> None:
    files = s.files()
    other = s.sign("weather", {**files, "extra.md": b"x\n"})  # the right key, other files
    with pytest.raises(SignatureMismatch, match="changed after signing"):
        load_and_verify("weather", files, other)
    # A forged key id: the stranger's signature relabelled with the trusted key's id.
    forged = minisign.parse_signature(s.sign("weather", files, s.STRANGER))
    relabelled = minisign.Signature(forged.algorithm, s.KEY.key_id, forged.signature,
                                    forged.trusted_comment, forged.global_signature)  # fmt: skip
    with pytest.raises(SignatureMismatch):
        load_and_verify("weather", files, relabelled.to_file())


def test_tampered_added_and_removed_files_are_refused() -> None:
    files = s.files()
    signature = s.sign("weather", files)
    assert load_and_verify("weather", files, signature)
    tampered = dict(files)
    tampered["reference/cities.csv"] = files["reference/cities.csv"].replace(b"Lyon", b"Lyom")
    added = {**files, "notes.md": b"smuggled\n"}
    removed = {"SKILL.md": files["SKILL.md"]}
    for variant in (tampered, added, removed):
        with pytest.raises(SignatureMismatch, match="changed after signing"):
            load_and_verify("weather", variant, signature)


@pytest.mark.parametrize(
    ("path", "data", "match"),
    [
        ("run.sh", b"echo hi\n", "not an allowed type"),
        ("tool.py", b"print(1)\n", "not an allowed type"),
        ("page.js", b"alert(1)\n", "not an allowed type"),
        ("blob.bin", b"\x00\x01", "not an allowed type"),
        ("notes.md", b"#!/bin/sh\nrm -rf /\n", "starts with '#!'"),
        ("notes.md", b"abc\x00def", "control character"),
        ("notes.md", b"\xff\xfe\x00", "not UTF-8"),
        ("notes.md", b"x" * (256 * 1024 + 1), "262145 bytes; expected at most 262144"),
        (".hidden.md", b"x", "no hidden files"),
        ("a/../b.md", b"x", r"no '\.\.'"),
        ("a/b/c/d/e.md", b"x", "at most 4 levels"),
        ("SKILL.MD", b"x", "differ only in case"),
    ],
)
def test_files_that_are_not_allowed_text_are_refused(path: str, data: bytes, match: str) -> None:
    files = {**s.files(), path: data}
    with pytest.raises(InvalidArgument, match=match):
        skill_format.load("weather", files, s.sign("weather", s.files()))


def test_too_many_files_and_too_many_bytes_are_refused() -> None:
    many = {**s.files(), **{f"ref/{i}.txt": b"x\n" for i in range(63)}}
    with pytest.raises(InvalidArgument, match="65 files; expected at most 64"):
        skill_format.check_files("weather", many)
    big = {**s.files(), **{f"ref/{i}.txt": b"x" * 200_000 for i in range(6)}}
    with pytest.raises(InvalidArgument, match="in all; expected at most 1048576"):
        skill_format.check_files("weather", big)


@pytest.mark.parametrize(
    ("md", "match"),
    [
        ("# no front matter\n", "front matter between '---' lines"),
        ("---\nname: weather\n", "front matter between '---' lines"),
        ("---\n- a list\n---\n", "must be a mapping"),
        ("---\nname: [unclosed\n---\n", "not valid YAML"),
        ("---\na: &x [1]\nb: *x\n---\n", "aliases"),
        ("---\nname: weather\n---\n", "description: expected text"),
        ("---\nname: Weather\ndescription: d\n---\n", "name: expected"),
        ("---\nname: other\ndescription: d\n---\n", "must equal the folder's name 'weather'"),
        ("---\nname: weather\ndescription: d\nversion: 1.0\n---\n", "quote it"),
        ("---\nname: weather\ndescription: d\nrun: x\n---\n", "unknown front matter key"),
        ("---\nname: weather\ndescription: d\nironclaw: [1]\n---\n", "expected a mapping"),
        ("---\nname: weather\ndescription: d\nironclaw: {shell: 1}\n---\n", "unknown key"),
        ("---\nname: weather\ndescription: d\nironclaw: {tools: [1]}\n---\n", "tool names"),
        ("---\nname: weather\ndescription: d\nironclaw: {mcp_tools: [x]}\n---\n",
         "expected 'server/tool'"),
        ("---\nname: weather\ndescription: d\nironclaw: {egress: [{host: a.b, via: x}]}\n---\n",
         "unknown key"),
    ],
)  # fmt: skip
def test_bad_front_matter_is_refused(md: str, match: str) -> None:
    files = {"SKILL.md": md.encode()}
    with pytest.raises(InvalidArgument, match=match):
        skill_format.load("weather", files, s.sign("weather", files))


def test_a_skill_can_never_carry_a_credential() -> None:
    md = s.skill_md(ironclaw="  egress:\n    - host: api.example.com\n      credential: prod\n")
    files = {"SKILL.md": md.encode()}
    with pytest.raises(PolicyDenied, match="a skill can never carry one"):
        skill_format.load("weather", files, s.sign("weather", files))


# -- reading a folder ----------------------------------------------------------------------------


def test_a_folder_reads_back_to_the_files_and_signature_written(tmp_path: Path) -> None:
    folder = s.write_folder(tmp_path)
    name, files, signature = read_folder(folder)
    assert (name, files) == ("weather", s.files())
    assert signature == s.sign("weather", s.files())
    assert load_and_verify(name, files, signature) == s.KEY.public_key().id_hex
    unsigned = s.write_folder(tmp_path / "u", signature=None)
    assert read_folder(unsigned)[2] is None


def test_a_symlink_is_refused_naming_it(tmp_path: Path) -> None:
    folder = s.write_folder(tmp_path)
    (folder / "passwd.md").symlink_to("/etc/passwd")
    with pytest.raises(InvalidArgument, match=r"passwd\.md: a symlink; expected regular files"):
        read_folder(folder)


def test_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    folder = s.write_folder(tmp_path)
    (folder / "etc").symlink_to("/etc")
    with pytest.raises(InvalidArgument, match="etc: a symlink"):
        read_folder(folder)


@pytest.mark.parametrize("mode", [0o755, 0o644 | 0o4000, 0o645])
def test_an_executable_or_set_id_file_is_refused(tmp_path: Path, mode: int) -> None:
    folder = s.write_folder(tmp_path)
    (folder / "reference" / "cities.csv").chmod(mode)
    with pytest.raises(InvalidArgument, match=r"reference/cities\.csv: mode .* executable"):
        read_folder(folder)


def test_hidden_entries_and_special_files_are_refused(tmp_path: Path) -> None:
    folder = s.write_folder(tmp_path)
    (folder / ".git").mkdir()
    with pytest.raises(InvalidArgument, match=r"\.git: hidden"):
        read_folder(folder)
    (folder / ".git").rmdir()
    os.mkfifo(folder / "pipe.md")
    with pytest.raises(InvalidArgument, match=r"pipe\.md: a special file"):
        read_folder(folder)


def test_an_oversized_file_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    folder = s.write_folder(tmp_path)
    (folder / "huge.md").write_bytes(b"x" * (skill_format.MAX_FILE_BYTES + 1))
    with pytest.raises(InvalidArgument, match=r"huge\.md: more than 262144 bytes"):
        read_folder(folder)


def test_too_many_files_in_a_folder_are_refused(tmp_path: Path) -> None:
    folder = s.write_folder(tmp_path)
    for i in range(70):
        (folder / f"n{i}.md").write_text("x\n")
    with pytest.raises(InvalidArgument, match="more than 64 files"):
        read_folder(folder)


def test_sign_then_verify_through_the_folder(tmp_path: Path) -> None:
    folder = s.write_folder(tmp_path, signature=None)
    name, files, _ = read_folder(folder)
    (folder / skill_format.SIGNATURE_FILE).write_text(s.sign(name, files))
    assert load_and_verify(*read_folder(folder)) == s.KEY.public_key().id_hex
    (folder / "SKILL.md").write_bytes((folder / "SKILL.md").read_bytes() + b" ")
    with pytest.raises(SignatureMismatch):
        load_and_verify(*read_folder(folder))
