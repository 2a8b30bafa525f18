"""Where the store's driver errors (sqlcipher3, sqlite3, the file system's OSError) become the
error tree: every StateStore and queue operation runs inside ``translated``, so no driver
exception leaves ``ironclawd.store`` and every message names the operation and the file."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import sqlcipher3

from ironclawd.errors import DiskFull, HostError
from ironclawd.store.diskspace import is_disk_full

DRIVER_ERRORS = (sqlcipher3.Error, sqlite3.Error, OSError)


@contextlib.contextmanager
def translated(doing: str, db: Any = None) -> Iterator[None]:
    """Run a store operation: a driver error becomes DiskFull (SQLITE_FULL, ENOSPC, EDQUOT) or
    HostError, as "``doing``: what the driver said". With ``db`` (a connection), a transaction
    the failed statement left open is rolled back first, so the next operation can begin.
    Errors of the tree raised inside pass unchanged."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        if db is not None:
            # SQLite may have rolled it back itself, or the connection is closed: best effort.
            with contextlib.suppress(*DRIVER_ERRORS):
                if db.in_transaction:
                    db.execute("ROLLBACK")
        if is_disk_full(exc):
            raise DiskFull(f"{doing}: {exc}; nothing was written") from exc
        raise HostError(f"{doing}: {exc}") from exc
