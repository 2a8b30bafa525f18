"""The red-team containment report: Ledger, versions, the JSON format, the text table, the
build's signing key (tests/redteam/report.py over ironclawd/formats/containment.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

import ironclawd
from ironclawd.errors import MalformedReport
from ironclawd.formats import containment, minisign
from ironclawd.formats.containment import AttackResult, Outcome
from tests.redteam import report

VERSIONS = {
    "runsc": "0.0~20221219.0",
    "systemd": "systemd 252",
    "kernel": "6.1",
    "platform": "ptrace",
}


def attack(
    aid: str, verdict: str = "contained", category: str = "network", evidence: str = "ok"
) -> AttackResult:
    return AttackResult(aid, category, "sandbox", f"title of {aid}", verdict, evidence)


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ci.key"
    path.write_text(minisign.generate_key().to_file())
    path.chmod(0o600)
    monkeypatch.setenv(report.KEY_ENV, str(path))
    return path


def test_ledger_replaces_a_retried_attack_and_keeps_first_order() -> None:
    ledger = report.Ledger()
    ledger.record(attack("net.a", "error"))
    ledger.record(attack("net.b"))
    ledger.record(attack("net.a", "contained"))
    assert [(r.id, r.verdict) for r in ledger.results()] == [
        ("net.a", "contained"),
        ("net.b", "contained"),
    ]


def test_ledger_is_thread_safe() -> None:
    ledger = report.Ledger()
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        start.wait()
        for i in range(200):
            ledger.record(attack(f"net.t{n}.a{i}"))
            ledger.record(attack(f"net.shared.a{i}", evidence=str(n)))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ledger.results()) == 8 * 200 + 200


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("id", "NoDots", "dotted"),
        ("category", "weather", "expected one of network"),
        ("stance", "root", "expected one of sandbox, host-user"),
        ("verdict", "passed", "expected one of contained, escaped, error"),
        ("evidence", None, "expected a string"),
    ],
)
def test_attack_result_refuses_what_the_format_cannot_hold(
    field: str, value: object, message: str
) -> None:
    fields: dict[str, object] = {
        "id": "net.x",
        "category": "network",
        "stance": "sandbox",
        "title": "t",
        "verdict": "contained",
        "evidence": "",
    }
    fields[field] = value
    with pytest.raises(MalformedReport, match=message):
        AttackResult(**fields)  # type: ignore[arg-type]


def test_write_report_json_is_the_documented_format_and_signed(
    key_file: Path, tmp_path: Path
) -> None:
    attacks = [
        attack("net.tcp.host-loopback"),
        attack("fs.root.write", category="filesystem"),
        attack("proc.x", "error", "proc"),
    ]
    control = [attack("net.tcp.host-loopback", "escaped", evidence="connected to 127.0.0.1:8088")]
    path = report.write_report(attacks, control, VERSIONS, tmp_path / "out")
    doc = json.loads(path.read_text())
    assert doc["format"] == "ironclaw-containment-report/1"
    datetime.strptime(doc["generated_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert doc["versions"] == VERSIONS
    # Category order, then id: stable between runs.
    assert [a["id"] for a in doc["attacks"]] == ["net.tcp.host-loopback", "fs.root.write", "proc.x"]
    assert doc["attacks"][0] == {
        "id": "net.tcp.host-loopback",
        "category": "network",
        "stance": "sandbox",
        "title": "title of net.tcp.host-loopback",
        "verdict": "contained",
        "evidence": "ok",
    }
    assert doc["summary"]["attacks"] == {
        "total": 3,
        "by_verdict": {"contained": 2, "escaped": 0, "error": 1},
        "by_category": {
            "network": {"contained": 1, "escaped": 0, "error": 0},
            "filesystem": {"contained": 1, "escaped": 0, "error": 0},
            "proc": {"contained": 0, "escaped": 0, "error": 1},
        },
    }
    assert doc["summary"]["negative_control"]["by_verdict"]["escaped"] == 1
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "containment-report.json", "containment-report.json.minisig",
        "containment-report.pub", "containment-report.txt",
    ]  # fmt: skip
    key = minisign.parse_secret_key(key_file.read_text())
    assert (
        minisign.parse_public_key((out / "containment-report.pub").read_text()) == key.public_key()
    )
    sig = minisign.parse_signature((out / "containment-report.json.minisig").read_text())
    comment = minisign.verify(key.public_key(), path.read_bytes(), sig, allow_legacy=False)
    assert "file:containment-report.json" in comment
    assert containment.parse(doc).outcome() is Outcome.INCONCLUSIVE  # one attack errored


def test_text_table_columns_never_split_and_evidence_is_cut(key_file: Path, tmp_path: Path) -> None:
    long_evidence = "\x1b[2J\x1b]0;pwned\x07 " + "word " * 60
    attacks = [
        attack("net.a-very-long-attack-identifier.that-stays-whole", evidence=long_evidence),
        attack("secrets.canary.b64", category="secrets", evidence="no canary\nin\tany form\u202e"),
    ]
    path = report.write_report(attacks, [attack("net.a", "escaped")], VERSIONS, tmp_path)
    text = (tmp_path / "containment-report.txt").read_text(encoding="utf-8")
    assert text == containment.render(containment.parse(json.loads(path.read_text())))
    lines = text.splitlines()
    for name, value in VERSIONS.items():
        assert any(line.split() == [name, *value.split()] for line in lines)
    header = next(i for i, line in enumerate(lines) if line.startswith("ATTACK"))
    rows = lines[header + 1 : header + 3]
    assert all(len(row) <= containment.TABLE_WIDTH for row in lines)
    assert rows[0].split()[:4] == [
        "net.a-very-long-attack-identifier.that-stays-whole",
        "network",
        "sandbox",
        "CONTAINED",
    ]
    assert rows[0].endswith("word…")  # cut at a word boundary
    assert "\ufffd[2J\ufffd]0;pwned\ufffd word" in rows[0]
    assert rows[1].split()[:4] == ["secrets.canary.b64", "secrets", "sandbox", "CONTAINED"]
    assert rows[1].endswith("no canary in any form\ufffd")
    assert not any(ord(c) < 0x20 and c != "\n" for c in text)  # no escape reaches a terminal
    evidence_column = lines[header].index("EVIDENCE")
    assert rows[1][evidence_column - 2 : evidence_column] == "  "
    assert lines[-1].startswith("INCONCLUSIVE") is False
    assert lines[-1].startswith("CONTAINED: 2 attacks")


def test_cut_keeps_short_text_and_cuts_long_words() -> None:
    assert containment.cut("short", 10) == "short"
    assert containment.cut("x" * 30, 10) == "x" * 9 + "…"
    assert containment.cut("aaaa bbbb cccc", 12) == "aaaa bbbb…"


def test_duplicate_ids_in_one_list_are_refused() -> None:
    with pytest.raises(MalformedReport, match="appears twice"):
        containment.build([attack("net.a"), attack("net.a")], [], VERSIONS, datetime.now(UTC))


def test_parse_names_the_field_that_is_wrong() -> None:
    good = containment.build(
        [attack("net.a")], [attack("net.a", "escaped")], VERSIONS, datetime.now(UTC)
    )
    assert containment.parse(good).outcome() is Outcome.CONTAINED
    cases: list[tuple[dict[str, object], str]] = [
        ({"format": "ironclaw-containment-report/2"}, "format"),
        ({"versions": {"runsc": "x"}}, "versions: missing systemd, kernel, platform"),
        ({"generated_at": "yesterday"}, "generated_at"),
        ({"attacks": [{"id": "net.a"}]}, r"attacks\[0\]: expected an object with exactly"),
        (
            {"attacks": [dict(good["attacks"][0], verdict="fine")]},
            r"attacks\[0\]: .*verdict 'fine'",
        ),
        ({"summary": {"attacks": {}, "negative_control": {}}}, "summary does not match"),
    ]
    for change, message in cases:
        with pytest.raises(MalformedReport, match=message):
            containment.parse({**good, **change})
    with pytest.raises(MalformedReport, match="expected a JSON object"):
        containment.parse([])


def test_outcomes() -> None:
    def outcome(attacks: list[AttackResult], control: list[AttackResult]) -> Outcome:
        return containment.parse(
            containment.build(attacks, control, VERSIONS, datetime.now(UTC))
        ).outcome()

    escaped = [attack("net.b", "escaped")]
    assert outcome([attack("net.a")], escaped) is Outcome.CONTAINED
    assert outcome([attack("net.a"), *escaped], escaped) is Outcome.ESCAPED
    assert outcome([attack("net.a", "error")], escaped) is Outcome.INCONCLUSIVE
    assert outcome([attack("net.a")], [attack("net.b")]) is Outcome.INCONCLUSIVE  # blind probes
    assert outcome([attack("net.a")], []) is Outcome.INCONCLUSIVE
    empty = containment.parse(containment.build([], [], VERSIONS, datetime.now(UTC)))
    assert "attacks: 0\n(none)\n" in containment.render(empty)


def test_the_build_key_is_made_once_with_mode_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "DEFAULT_KEY", tmp_path / "containment" / "minisign.key")
    first = report.load_or_create_key(env={})
    assert stat.S_IMODE(os.stat(report.DEFAULT_KEY).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(report.DEFAULT_KEY.parent).st_mode) == 0o700
    assert report.load_or_create_key(env={}) == first
    pub = minisign.parse_public_key((report.DEFAULT_KEY.parent / "minisign.pub").read_text())
    assert pub == first.public_key()
    # A stale trusted half (another run's key lost a race) is put right from the key on disk.
    (report.DEFAULT_KEY.parent / "minisign.pub").write_text(
        minisign.generate_key().public_key().to_file()
    )
    report.load_or_create_key(env={})
    pub = minisign.parse_public_key((report.DEFAULT_KEY.parent / "minisign.pub").read_text())
    assert pub == first.public_key()
    os.chmod(report.DEFAULT_KEY, 0o640)
    with pytest.raises(RuntimeError, match="chmod 600"):
        report.load_or_create_key(env={})


def test_a_configured_key_is_used_and_never_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope.key"
    with pytest.raises(RuntimeError, match=f"reading containment signing key {missing}"):
        report.load_or_create_key(env={report.KEY_ENV: str(missing)})
    assert not missing.exists()


def test_collect_versions_reads_each_fact_and_names_what_it_could_not() -> None:
    answers = {
        "runsc --version": b"runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n",
        "systemctl --version": b"systemd 252 (252.39-1~deb12u1)\n+PAM +AUDIT\n",
        "uname -r": b"6.1.0-test\n",
        "ironctl status --json": json.dumps(
            {"version": "0.1.0", "runsc_platform": "ptrace"}
        ).encode(),
        "cat /etc/os-release": b'NAME="Debian"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n',
    }
    calls: list[list[str]] = []

    def run(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        key = " ".join(argv)
        if key not in answers:
            return subprocess.CompletedProcess(argv, 1, b"", b"no such thing")
        return subprocess.CompletedProcess(argv, 0, answers[key], b"")

    versions = report.collect_versions(run)
    assert versions["runsc"] == "0.0~20221219.0"
    assert versions["systemd"] == "systemd 252 (252.39-1~deb12u1)"
    assert versions["kernel"] == "6.1.0-test"
    assert versions["platform"] == "ptrace"
    assert versions["os"] == "Debian GNU/Linux 12 (bookworm)"
    assert versions["ironclaw"] == "0.1.0"
    assert versions["python"].count(".") == 2
    # Status without a platform: the sessions' platform; no session: doctor's choice.
    answers["ironctl status --json"] = b'{"version": "0.1.0", "runsc_platform": ""}'
    answers["ironctl session list --json"] = json.dumps(
        {"sessions": [{"sid": "a", "platform": "ptrace"}, {"sid": "b", "platform": ""}]}
    ).encode()
    assert report.collect_versions(run)["platform"] == "ptrace"
    answers["ironctl session list --json"] = b'{"sessions": []}'
    answers["ironctl doctor --json --only runsc.platform"] = json.dumps(
        {"checks": [{"name": "runsc.platform", "detail": "will use 'systrap' (working: systrap)"}]}
    ).encode()
    assert report.collect_versions(run)["platform"] == "systrap"
    del answers["ironctl doctor --json --only runsc.platform"], answers["uname -r"]
    answers["ironctl status --json"] = b"not json"
    versions = report.collect_versions(run)
    assert versions["platform"].startswith("unknown (ironctl doctor")
    assert versions["ironclaw"] == ironclawd.__version__
    assert versions["kernel"] == "unknown (uname -r exited 1: no such thing)"
