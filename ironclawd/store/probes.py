"""Check that SQLCipher really encrypts here (``ironctl doctor``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import sqlcipher3

from ironclawd.domain.checks import CheckResult, failed, passed


def probe_sqlcipher() -> CheckResult:
    """Write an encrypted database, prove the file is not plaintext and a wrong key fails."""
    name = "sqlcipher"
    marker = "ironclaw-doctor-plaintext-canary"
    with tempfile.TemporaryDirectory(prefix="ironclaw-doctor-") as tmp:
        path = Path(tmp) / "probe.db"
        key = os.urandom(32).hex()
        conn = sqlcipher3.connect(str(path))
        try:
            conn.execute(f"PRAGMA key = \"x'{key}'\"")
            version = conn.execute("PRAGMA cipher_version").fetchone()[0]
            conn.execute("CREATE TABLE t (v TEXT)")
            conn.execute("INSERT INTO t VALUES (?)", (marker,))
            conn.commit()
        finally:
            conn.close()
        raw = path.read_bytes()
        if raw.startswith(b"SQLite format 3") or marker.encode() in raw:
            return failed(name, "database file is plaintext", "reinstall sqlcipher3")
        wrong = sqlcipher3.connect(str(path))
        try:
            wrong.execute(f"PRAGMA key = \"x'{os.urandom(32).hex()}'\"")
            wrong.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlcipher3.DatabaseError:
            pass
        else:
            return failed(name, "a wrong key opened the database", "reinstall sqlcipher3")
        finally:
            wrong.close()
    return passed(name, f"SQLCipher {version}: encrypted at rest, wrong key refused")
