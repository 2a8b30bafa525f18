"""Well-known paths (docs/architecture.md §8): what the daemon touches on the host is named here."""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path("/etc/ironclaw")
CONFIG_PATH = CONFIG_DIR / "ironclawd.toml"
# 0600 root files, one per credential; systemd's $CREDENTIALS_DIRECTORY is preferred when set.
CREDENTIALS_DIR = CONFIG_DIR / "credentials"
MASTER_KEY_FILE = CREDENTIALS_DIR / "master.key"
# minisign public keys (*.pub) whose signatures a skill may carry (docs/skills.md).
SKILLS_TRUSTED_DIR = CONFIG_DIR / "skills.d" / "trusted"
STATE_DIR = Path("/var/lib/ironclaw")
RUN_DIR = Path("/run/ironclaw")
# CacheDirectory= of ironclawd.service (root, 0700): compiled dataclass methods
# (ironclawd/dataclass_cache.py); the unit names the file.
CACHE_DIR = Path("/var/cache/ironclaw")
# The daemon's own directories: hidden from the helper and MCP server units (InaccessiblePaths=)
# even where a permission slips.
PRIVATE_DIRS = (str(STATE_DIR), str(RUN_DIR), str(CACHE_DIR), str(CONFIG_DIR))
ADMIN_SOCKET = RUN_DIR / "admin.sock"
# Only root may enter this directory: the real gRPC server listens here, behind the
# peer-credential front on ADMIN_SOCKET (docs/admin-identity.md).
INTERNAL_DIR = RUN_DIR / "internal"
INTERNAL_ADMIN_SOCKET = INTERNAL_DIR / "admin-grpc.sock"
SESSIONS_RUN_DIR = RUN_DIR / "sessions"
KEYS_RUN_DIR = RUN_DIR / "keys"
# Root-only (0700): private copies of agents' outbound.db files, made from a checked descriptor.
INGEST_DIR = RUN_DIR / "ingest"
NETNS_DIR = Path("/run/netns")
# A small private tmpfs (root, 0700) holding the pin of the daemon's mount namespace for the
# sessions' outbound tmpfs (host/mountns.py).
MOUNTNS_DIR = RUN_DIR / "mntns"
# Where the Debian package puts what the daemon runs (each overridable in [sandbox]).
RUNSC = Path("/usr/bin/runsc")
AGENT_DIR = Path("/usr/lib/ironclaw/agent")
ROOTFS_TEMPLATE = Path("/usr/share/ironclaw/agent-rootfs")
# Home directories: a unit that may write below one gets ProtectHome=read-only, else yes.
HOME_DIRS = ("/home", "/root", "/run/user")
ADMIN_GROUP = "ironclaw-admin"
SLICE = "ironclaw.slice"
