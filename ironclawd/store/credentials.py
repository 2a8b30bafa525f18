"""Provider credentials, held host-side only: a systemd credential of that name (the unit's
``LoadCredential=``), else a 0600 root file ``/etc/ironclaw/credentials/<name>``. They are read
by the model proxy, the egress broker and MCP to inject into upstream requests, and each
session's own are masked in what returns to it (services/own_secrets.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ironclawd import lazy_re
from ironclawd.errors import ConfigError, NotFound

NAME_RE = lazy_re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
# The daemon's own keys, never a credential to inject: the master key, and its encrypted form
# (``master.key.cred``) that docs/operations.md has operators keep in this directory.
RESERVED = frozenset({"master.key"})
RESERVED_PREFIX = "master.key"


def reserved(name: str) -> bool:
    return name in RESERVED or name.startswith(RESERVED_PREFIX)


class CredentialStore:
    def __init__(self, directory: Path) -> None:
        self._dirs = [Path(d) for d in [os.environ.get("CREDENTIALS_DIRECTORY")] if d]
        self._dirs.append(directory)

    def get(self, name: str) -> str:
        if not NAME_RE.fullmatch(name) or reserved(name):
            raise ConfigError(
                f"credential name {name!r}: expected [a-z0-9][a-z0-9_.-]{{0,63}}, not "
                "master.key* (the daemon's own key)"
            )
        for directory in self._dirs:
            path = directory / name
            try:
                value = self._read(directory, path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise ConfigError(
                    f"reading credential '{name}' from {path}: {exc.strerror or exc}"
                ) from exc
            except UnicodeDecodeError as exc:
                # Where, never which byte: the value is a secret.
                raise ConfigError(
                    f"reading credential '{name}' from {path}: not UTF-8 text (at byte "
                    f"{exc.start}); write it as UTF-8"
                ) from None
            return value
        raise NotFound(f"credential '{name}' not found (put it in {self._dirs[-1]}/{name}, 0600)")

    def _read(self, directory: Path, path: Path) -> str:
        # O_NONBLOCK: a FIFO put there would block the open (on the event loop) until a writer
        # came; anything but a regular file is refused once open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(
                    f"reading credential '{path.name}' from {path}: not a regular file"
                )
            if directory == self._dirs[-1] and (st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077):
                raise ConfigError(f"refusing credential {path}: must be owned by root, mode 0600")
            return os.read(fd, 64 * 1024).decode("utf-8").strip()
        finally:
            os.close(fd)
