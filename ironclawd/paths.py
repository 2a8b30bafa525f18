"""Well-known paths (docs/architecture.md §8): what the daemon touches on the host is named here."""

from __future__ import annotations

from pathlib import Path

CONFIG_PATH = Path("/etc/ironclaw/ironclawd.toml")
STATE_DIR = Path("/var/lib/ironclaw")
RUN_DIR = Path("/run/ironclaw")
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
ADMIN_GROUP = "ironclaw-admin"
SLICE = "ironclaw.slice"
