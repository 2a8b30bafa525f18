"""Provider credentials, held host-side only: a systemd credential of that name (the unit's
``LoadCredential=``), else a 0600 root file ``/etc/ironclaw/credentials/<name>``. They are read
by the model proxy to inject into upstream requests and to redact from anything returned."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from ironclawd.errors import ConfigError, NotFound

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
RESERVED = frozenset({"master.key"})


class CredentialStore:
    def __init__(self, directory: Path) -> None:
        self._dirs = [Path(d) for d in [os.environ.get("CREDENTIALS_DIRECTORY")] if d]
        self._dirs.append(directory)

    def get(self, name: str) -> str:
        if not NAME_RE.fullmatch(name) or name in RESERVED:
            raise ConfigError(f"credential name {name!r}: expected [a-z0-9][a-z0-9_.-]{{0,63}}")
        for directory in self._dirs:
            path = directory / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                st = os.fstat(fd)
                if directory == self._dirs[-1] and (
                    st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077
                ):
                    raise ConfigError(
                        f"refusing credential {path}: must be owned by root, mode 0600"
                    )
                return os.read(fd, 64 * 1024).decode("utf-8").strip()
            finally:
                os.close(fd)
        raise NotFound(f"credential '{name}' not found (put it in {self._dirs[-1]}/{name}, 0600)")

    def all_values(self) -> list[str]:
        """Every readable credential value (for redaction)."""
        values = []
        for directory in self._dirs:
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                if NAME_RE.fullmatch(name) and name not in RESERVED:
                    try:
                        values.append(self.get(name))
                    except (ConfigError, NotFound, OSError, UnicodeDecodeError):
                        continue
        return values
