"""``ironctl containment verify``: each way a report can be wrong has its own exit code and says
what was wrong and what was expected. Offline: no daemon is asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ironclawd.ctl import exitcodes
from ironclawd.ctl.main import main
from ironclawd.formats import containment, minisign
from ironclawd.formats.containment import AttackResult
from tests.redteam import report

VERSIONS = {
    "runsc": "0.0~20221219.0",
    "systemd": "systemd 252",
    "kernel": "6.1",
    "platform": "ptrace",
}
CONTAINED = AttackResult("net.tcp.host-loopback", "network", "sandbox", "t", "contained", "refused")
ESCAPED = AttackResult("net.tcp.host-loopback", "network", "sandbox", "t", "escaped", "connected")


class Signed:
    """A report written and signed by the red-team module with a key of this test."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.key = minisign.generate_key()
        key_path = tmp_path / "build.key"
        key_path.write_text(self.key.to_file())
        key_path.chmod(0o600)
        monkeypatch.setenv(report.KEY_ENV, str(key_path))
        monkeypatch.delenv("IRONCLAW_CONTAINMENT_PUBKEY", raising=False)
        self.pubkey = tmp_path / "trusted.pub"
        self.pubkey.write_text(self.key.public_key().to_file())
        self.dir = tmp_path / "run"
        self.path = self.write([CONTAINED], [ESCAPED])

    def write(self, attacks: list[AttackResult], control: list[AttackResult]) -> Path:
        return report.write_report(attacks, control, VERSIONS, self.dir)

    def sign_bytes(self, data: bytes) -> None:
        self.path.write_bytes(data)
        sig = minisign.sign(self.key, data, "timestamp:1\tfile:containment-report.json\thashed")
        Path(f"{self.path}.minisig").write_text(sig.to_file())

    def verify(self, *extra: str) -> int:
        return main(["containment", "verify", str(self.path), "--pubkey", str(self.pubkey), *extra])


@pytest.fixture
def signed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Signed:
    return Signed(tmp_path, monkeypatch)


def test_good_report_prints_the_table_and_exits_0(
    signed: Signed, capsys: pytest.CaptureFixture[str]
) -> None:
    assert signed.verify() == exitcodes.OK
    out = capsys.readouterr().out
    assert out.startswith(
        containment.render(containment.parse(json.loads(signed.path.read_text())))
    )
    assert (
        "CONTAINED: 1 attacks: 1 contained, 0 escaped, 0 error; negative control: 1 of 1 escaped"
        in out
    )
    assert f"signature: good, by key {signed.key.public_key().id_hex}" in out
    assert signed.verify("--json") == exitcodes.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is True
    assert doc["outcome"] == "contained"
    assert doc["exit"] == 0
    assert doc["versions"] == VERSIONS
    assert doc["escaped"] == []
    assert doc["errors"] == []


def test_pubkey_from_the_environment(signed: Signed, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IRONCLAW_CONTAINMENT_PUBKEY", str(signed.pubkey))
    assert main(["containment", "verify", str(signed.path)]) == exitcodes.OK


def error_of(
    signed: Signed, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, dict[str, object]]:
    capsys.readouterr()
    code = signed.verify(*extra)
    text = capsys.readouterr().err
    assert signed.verify(*extra, "--json") == code
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False
    assert doc["error"]["exit"] == code
    return code, text, doc["error"]


def test_tampered_report_is_a_bad_signature(
    signed: Signed, capsys: pytest.CaptureFixture[str]
) -> None:
    signed.path.write_text(signed.path.read_text().replace('"escaped"', '"contained"', 1))
    code, text, error = error_of(signed, capsys)
    assert code == exitcodes.BAD_SIGNATURE == 10
    assert "does not match its signature" in text
    assert "changed after signing?" in text
    assert error["code"] == "BAD_SIGNATURE"


def test_tampered_signature(signed: Signed, capsys: pytest.CaptureFixture[str]) -> None:
    sig_path = Path(f"{signed.path}.minisig")
    lines = sig_path.read_text().splitlines()
    sig_path.write_text("\n".join([lines[0], lines[1], "trusted comment: forged", lines[3]]) + "\n")
    code, text, _ = error_of(signed, capsys)
    assert code == exitcodes.BAD_SIGNATURE
    assert "trusted comment does not match its signature" in text
    sig_path.write_text("garbage\n")
    code, text, _ = error_of(signed, capsys)
    assert code == exitcodes.BAD_SIGNATURE
    assert "expected 4 lines" in text
    sig_path.unlink()
    code, text, _ = error_of(signed, capsys)
    assert code == exitcodes.BAD_SIGNATURE
    assert "No such file" in text


def test_wrong_key(signed: Signed, capsys: pytest.CaptureFixture[str]) -> None:
    other = minisign.generate_key().public_key()
    signed.pubkey.write_text(other.to_file())
    code, text, _ = error_of(signed, capsys)
    assert code == exitcodes.BAD_SIGNATURE
    assert (
        f"made by key {signed.key.public_key().id_hex}, expected the trusted key {other.id_hex}"
        in text
    )


def test_escaped_attack_exits_12_after_a_good_signature(
    signed: Signed, capsys: pytest.CaptureFixture[str]
) -> None:
    signed.write([ESCAPED], [ESCAPED])
    assert signed.verify() == exitcodes.ESCAPED == 12
    out = capsys.readouterr().out
    assert "ESCAPED: 1 attacks: 0 contained, 1 escaped, 0 error" in out
    assert signed.verify("--json") == exitcodes.ESCAPED
    doc = json.loads(capsys.readouterr().out)
    assert doc["outcome"] == "escaped"
    assert doc["escaped"] == ["net.tcp.host-loopback"]


def test_inconclusive_when_the_probes_are_blind_or_an_attack_errored(
    signed: Signed, capsys: pytest.CaptureFixture[str]
) -> None:
    signed.write([CONTAINED], [CONTAINED])
    assert signed.verify() == exitcodes.INCONCLUSIVE == 13
    assert "(the probes did not show they can see one)" in capsys.readouterr().out
    signed.write([AttackResult("net.x", "network", "sandbox", "t", "error", "boom")], [ESCAPED])
    assert signed.verify() == exitcodes.INCONCLUSIVE


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not UTF-8 JSON"),
        (b"\xff\xfe", "not UTF-8 JSON"),
        (
            b'{"format": "something-else/1"}',
            "format 'something-else/1': expected 'ironclaw-containment-report/1'",
        ),
        (b"[]", "expected a JSON object"),
    ],
)
def test_malformed_report_that_is_validly_signed(
    signed: Signed, capsys: pytest.CaptureFixture[str], data: bytes, message: str
) -> None:
    signed.sign_bytes(data)
    code, text, error = error_of(signed, capsys)
    assert code == exitcodes.MALFORMED_REPORT == 11
    assert message in text
    assert error["code"] == "MALFORMED_REPORT"


def test_missing_report_and_missing_or_bad_pubkey(
    signed: Signed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert (
        main(["containment", "verify", str(tmp_path / "none.json"), "--pubkey", str(signed.pubkey)])
        == 11
    )
    assert "reading report" in capsys.readouterr().err
    assert main(["containment", "verify", str(signed.path)]) == exitcodes.USAGE
    assert "no trusted public key: give --pubkey FILE" in capsys.readouterr().err
    signed.pubkey.write_text("not a key\n")
    assert signed.verify() == exitcodes.USAGE
    assert f"public key {signed.pubkey}: reading minisign public key" in capsys.readouterr().err


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["containment", "verify", "--help"]) == exitcodes.OK
    out = capsys.readouterr().out
    for line in (
        "10 bad or missing signature",
        "11 malformed report",
        "12 an attack escaped",
        "13 inconclusive",
    ):
        assert line in out
    doc = (Path(__file__).resolve().parents[2] / "docs" / "ironctl.md").read_text()
    for code in ("| 10 |", "| 11 |", "| 12 |", "| 13 |"):
        assert code in doc
