"""ironctl containment verify: check a red-team run's signed containment report, offline.

Trust comes only from the public key the operator names: the ``.pub`` written beside a report
proves nothing, since whoever changed the report could have replaced it too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ironclawd.ctl import exitcodes
from ironclawd.ctl.common import SMALL_FILE_BYTES, read_file
from ironclawd.ctl.parsers.containment import PUBKEY_ENV
from ironclawd.errors import MalformedReport, MinisignFormatError, SignatureMismatch
from ironclawd.formats import containment, minisign

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub

REPORT_TIME = "%Y-%m-%dT%H:%M:%SZ"  # generated_at, as formats/containment.py checks it
# A red-team run's report is tens of kilobytes (a line of evidence per attack); far more is
# refused before it is read whole.
MAX_REPORT_BYTES = 16 * 1024 * 1024
_OUTCOME_EXIT = {
    containment.Outcome.CONTAINED: exitcodes.OK,
    containment.Outcome.INCONCLUSIVE: exitcodes.INCONCLUSIVE,
    containment.Outcome.ESCAPED: exitcodes.ESCAPED,
}
_ERROR_CODES = {
    exitcodes.USAGE: "USAGE",
    exitcodes.BAD_SIGNATURE: "BAD_SIGNATURE",
    exitcodes.MALFORMED_REPORT: "MALFORMED_REPORT",
}


class VerifyFailed(Exception):
    """Verification stopped; ``exit_code`` says why (exitcodes), the message says what."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def cmd_verify(args: argparse.Namespace, _stub: Stub) -> int:
    try:
        result = verify_files(args)
    except VerifyFailed as exc:
        return _fail(args, exc)
    report: containment.Report = result["report"]
    code = _OUTCOME_EXIT[report.outcome()]
    if args.json:
        doc = {
            "valid": True,
            "outcome": report.outcome().name.lower(),
            "exit": code,
            "key_id": result["key_id"],
            "trusted_comment": result["trusted_comment"],
            # ironctl's one timestamp format (ctl/shapes.py); the report's own text is validated.
            "generated_at": datetime.strptime(report.generated_at, REPORT_TIME)
            .replace(tzinfo=UTC)
            .timestamp(),
            "versions": dict(report.versions),
            "summary": {
                "attacks": containment.summarize(report.attacks),
                "negative_control": containment.summarize(report.negative_control),
            },
            "escaped": [a.id for a in report.attacks if a.verdict == "escaped"],
            "errors": [a.id for a in report.attacks if a.verdict == "error"],
        }
        print(json.dumps(doc, indent=2))
    else:
        # On a terminal wider than the file's table, evidence gets the extra room.
        width = containment.TABLE_WIDTH
        if sys.stdout.isatty():
            width = max(width, shutil.get_terminal_size().columns)
        sys.stdout.write(containment.render(report, width))
        print(
            f"signature: good, by key {result['key_id']} "
            f"({containment.clean(result['trusted_comment'])})"
        )
    return code


def verify_files(args: argparse.Namespace) -> dict[str, Any]:
    """Signature first (with the trusted key), then the format; VerifyFailed names the step."""
    key = _public_key(args.pubkey or os.environ.get(PUBKEY_ENV, ""))
    report_path = Path(args.report)
    sig_path = Path(args.signature or f"{report_path}{minisign.SIG_SUFFIX}")
    try:
        data = read_file(args.report, MAX_REPORT_BYTES)
    except OSError as exc:
        raise VerifyFailed(
            exitcodes.MALFORMED_REPORT, f"reading report {report_path}: {exc.strerror}"
        ) from None
    try:
        text = read_file(str(sig_path), SMALL_FILE_BYTES).decode("utf-8")
        signature = minisign.parse_signature(text)
        trusted = minisign.verify(key, data, signature, allow_legacy=False)
    except OSError as exc:
        raise VerifyFailed(
            exitcodes.BAD_SIGNATURE,
            f"reading signature {sig_path}: {exc.strerror}: a report counts only with the "
            "signature the run wrote beside it",
        ) from None
    except (UnicodeDecodeError, MinisignFormatError) as exc:
        raise VerifyFailed(exitcodes.BAD_SIGNATURE, f"signature {sig_path}: {exc}") from None
    except SignatureMismatch as exc:
        raise VerifyFailed(exitcodes.BAD_SIGNATURE, f"report {report_path}: {exc}") from None
    try:
        report = containment.parse(json.loads(data.decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VerifyFailed(
            exitcodes.MALFORMED_REPORT, f"report {report_path}: not UTF-8 JSON: {exc}"
        ) from None
    except MalformedReport as exc:
        raise VerifyFailed(exitcodes.MALFORMED_REPORT, f"{report_path}: {exc}") from None
    return {"report": report, "key_id": key.id_hex, "trusted_comment": trusted}


def _public_key(path: str) -> minisign.PublicKey:
    if not path:
        raise VerifyFailed(
            exitcodes.USAGE,
            f"no trusted public key: give --pubkey FILE (the key the build signs with, e.g. "
            f"build/containment/minisign.pub) or set {PUBKEY_ENV}; the .pub beside a report "
            "cannot vouch for it",
        )
    try:
        return minisign.parse_public_key(read_file(path, SMALL_FILE_BYTES).decode("utf-8"))
    except OSError as exc:
        raise VerifyFailed(exitcodes.USAGE, f"reading public key {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, MinisignFormatError) as exc:
        raise VerifyFailed(exitcodes.USAGE, f"public key {path}: {exc}") from None


def _fail(args: argparse.Namespace, exc: VerifyFailed) -> int:
    if args.json:
        error = {"code": _ERROR_CODES[exc.exit_code], "message": str(exc), "exit": exc.exit_code}
        print(json.dumps({"valid": False, "error": error}))
    else:
        print(f"ironctl: containment verify: {exc}", file=sys.stderr)
        print(f"INVALID: {_ERROR_CODES[exc.exit_code].lower().replace('_', ' ')}", file=sys.stderr)
    return exc.exit_code
