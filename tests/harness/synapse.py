"""A real Matrix homeserver for the channel tests: Synapse (scripts/synapse-test-venv, pinned) as
a plain subprocess of the test, on 127.0.0.1 and a free port, SQLite, users registered through
the registration shared secret (Synapse's admin API, what ``register_new_matrix_user`` calls).

It writes only under the directory it is given (config, signing key, database, media, log; HOME
and TMPDIR point there too) and binds only its one client listener on loopback: no federation
listener, no outbound federation (an empty whitelist), no key servers, no stats. Readiness is
Synapse's own ``READY=1`` on a notify socket (it speaks sd_notify), not polling.

    with synapse_homeserver(tmp) as hs:
        alice = hs.register("alice")
        hs.url, alice.user_id, alice.token
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import secrets
import select
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVER_NAME = "ironclaw.test"
READY_TIMEOUT = 60.0  # cold start on a loaded 2-core machine; ~3 s idle
_MANY = {"per_second": 1000, "burst_count": 1000}  # the tests' own pace is the only limit


@cache
def synapse_venv() -> Path:
    """The venv's directory, built on first use (about a minute with the registry, then cached)."""
    proc = subprocess.run(
        [str(ROOT / "scripts" / "synapse-test-venv")], capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/synapse-test-venv failed: {proc.stderr[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Account:
    user_id: str
    token: str
    device_id: str
    password: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _signing_key() -> str:
    """A Synapse signing key file's line: ``ed25519 <version> <unpadded base64 seed>``."""
    seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    return f"ed25519 a_{secrets.token_hex(2)} {seed}\n"


class Homeserver:
    """One running Synapse; ``stop()`` (or the context manager) ends it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server_name = SERVER_NAME
        self.shared_secret = secrets.token_urlsafe(32)
        self.log = root / "homeserver.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in = 0.0  # seconds from spawn to READY=1

    def _listener(self) -> dict[str, Any]:
        """The one listener: client API only (no federation), plain HTTP on loopback."""
        return {
            "port": self.port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
            "x_forwarded": False, "resources": [{"names": ["client"], "compress": False}],
        }  # fmt: skip

    def _write_config(self) -> Path:
        (self.root / "signing.key").write_text(_signing_key())
        (self.root / "media").mkdir()
        config: dict[str, Any] = {
            "server_name": self.server_name,
            "pid_file": str(self.root / "homeserver.pid"),
            "listeners": [self._listener()],
            "database": {"name": "sqlite3", "args": {"database": str(self.root / "homeserver.db")}},
            "media_store_path": str(self.root / "media"),
            "signing_key_path": str(self.root / "signing.key"),
            "registration_shared_secret": self.shared_secret,
            "macaroon_secret_key": secrets.token_urlsafe(32),
            "form_secret": secrets.token_urlsafe(32),
            "report_stats": False,
            "bcrypt_rounds": 4,  # the tests' throwaway passwords: fast registration and login
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "federation_domain_whitelist": [],
            "use_presence": False,
            "enable_metrics": False,
            "url_preview_enabled": False,
            "rc_message": _MANY,
            "rc_registration": _MANY,
            "rc_login": {"address": _MANY, "account": _MANY, "failed_attempts": _MANY},
            "rc_joins": {"local": _MANY, "remote": _MANY},
            "rc_invites": {"per_room": _MANY, "per_user": _MANY, "per_issuer": _MANY},
            "rc_room_creation": _MANY,  # 10 rooms, then one a minute by default
        }
        path = self.root / "homeserver.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self) -> None:
        config = self._write_config()
        notify = self.root / "notify.sock"
        env = {
            "PATH": "/usr/bin:/bin", "HOME": str(self.root), "TMPDIR": str(self.root),
            "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "NOTIFY_SOCKET": str(notify),
        }  # fmt: skip
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(str(notify))
            t0 = time.monotonic()
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    # --pdeathsig: a killed test run leaves no homeserver behind.
                    ["setpriv", "--pdeathsig=KILL", "--", str(synapse_venv() / "bin" / "python"),
                     "-m", "synapse.app.homeserver", "-c", str(config)],
                    cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    start_new_session=True,
                )  # fmt: skip
            self._await_ready(sock, t0)
            self.started_in = time.monotonic() - t0

    def _await_ready(self, sock: socket.socket, t0: float) -> None:
        assert self.proc is not None
        while (left := READY_TIMEOUT - (time.monotonic() - t0)) > 0:
            # Wake on a notification, or each second to notice that Synapse died.
            readable, _, _ = select.select([sock], [], [], min(left, 1.0))
            if readable and b"READY=1" in sock.recv(4096):
                return
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"synapse did not start; its log ends:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    # -- users ---------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        # No proxy: the homeserver is on loopback, whatever the environment says.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=30) as response:
            return json.loads(response.read())

    def register(self, localpart: str, password: str = "", admin: bool = False) -> Account:
        """A new user through the shared secret (its first device's token)."""
        password = password or secrets.token_urlsafe(16)
        nonce = self._call("GET", "/_synapse/admin/v1/register")["nonce"]
        parts = (nonce, localpart, password, "admin" if admin else "notadmin")
        mac = hmac.new(self.shared_secret.encode(), b"\x00".join(p.encode() for p in parts), "sha1")
        got = self._call("POST", "/_synapse/admin/v1/register", {
            "nonce": nonce, "username": localpart, "password": password, "admin": admin,
            "mac": mac.hexdigest(),
        })  # fmt: skip
        return Account(got["user_id"], got["access_token"], got["device_id"], password)

    def login(self, account: Account, device_id: str) -> Account:
        """A new token for ``account`` on ``device_id`` (what an operator puts in a credential)."""
        got = self._call("POST", "/_matrix/client/v3/login", {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": account.user_id},
            "password": account.password, "device_id": device_id,
        })  # fmt: skip
        return Account(got["user_id"], got["access_token"], got["device_id"], account.password)

    def listening(self) -> list[str]:
        """The local addresses Synapse's process listens on (TCP and UDP), from ss."""
        assert self.proc is not None
        out = subprocess.run(
            ["ss", "-Hlntup"], capture_output=True, text=True, check=True
        ).stdout  # fmt: skip
        return [line.split()[4] for line in out.splitlines() if f"pid={self.proc.pid}," in line]


@contextlib.contextmanager
def synapse_homeserver(root: Path) -> Iterator[Homeserver]:
    hs = Homeserver(root)
    hs.start()
    try:
        yield hs
    finally:
        hs.stop()
