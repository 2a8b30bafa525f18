"""Host checks of a parsed configuration that start and ``--check-config`` share: what start
would refuse later (a symlinked or unsafe directory, a missing group) is refused before anything
is bound, as a ConfigError that names the key."""

from __future__ import annotations

import grp
import os
import stat

from ironclawd.api.sockets import check_existing_dirs
from ironclawd.config import Config
from ironclawd.errors import ConfigError, HostError


def check_host(config: Config) -> None:
    """Raise ConfigError naming the first key whose path or group start would refuse."""
    dirs = (
        ("daemon.state_dir", config.daemon.state_dir),
        ("admin.socket", config.admin.socket.parent),
    )
    for key, path in dirs:
        try:
            check_existing_dirs(path)
        except HostError as exc:
            raise ConfigError(f"{key}: {exc}") from None
    key_file = config.daemon.master_key_file
    try:
        st: os.stat_result | None = os.lstat(key_file)
    except FileNotFoundError:
        st = None  # made on first start
    except OSError as exc:
        raise ConfigError(f"daemon.master_key_file: {key_file}: {exc.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise ConfigError(f"daemon.master_key_file: refusing {key_file}: it is {what}")
    try:
        grp.getgrnam(config.admin.group)
    except KeyError:
        raise ConfigError(
            f"admin.group: group '{config.admin.group}' does not exist (install "
            "sysusers.d/ironclaw.conf and run systemd-sysusers)"
        ) from None
