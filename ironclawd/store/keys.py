"""Key custody: the master key, and per-session keys wrapped under it (docs/architecture.md §4).

The master key (256 bits) comes from a systemd credential when the unit passes one
(``LoadCredential=``/``LoadCredentialEncrypted=master.key:...`` puts it in
``$CREDENTIALS_DIRECTORY/master.key``), else from ``/etc/ironclaw/credentials/master.key``
(0600 root, created on first start) — never from the state directory that holds the data it
protects. Session keys are 256 random bits, stored only wrapped (AES-256-GCM, the session id as
associated data, so a wrapped key cannot be moved to another session). The unwrapped key is
written only to a tmpfs file that is mounted read-only into that session's sandbox.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ironclawd.atomic import atomic_write
from ironclawd.errors import HostError

KEY_BYTES = 32
NONCE_BYTES = 12
CREDENTIAL_NAME = "master.key"
WRAP_VERSION = b"\x01"


class MasterKey:
    """The daemon's master key; derives purpose keys and wraps session keys."""

    def __init__(self, key: bytes, source: str) -> None:
        if len(key) != KEY_BYTES:
            raise HostError(f"master key from {source}: expected {KEY_BYTES} bytes, got {len(key)}")
        self._key = bytearray(key)
        self._zeroed = False
        self.source = source

    def derive(self, purpose: str) -> bytes:
        """A key for one purpose (e.g. the state DB), independent of every other purpose."""
        hkdf = HKDF(algorithm=SHA256(), length=KEY_BYTES, salt=None, info=purpose.encode())
        return hkdf.derive(self._material())

    def wrap(self, sid: str, session_key: bytes) -> bytes:
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = AESGCM(self._wrapping_key()).encrypt(nonce, session_key, _aad(sid))
        return WRAP_VERSION + nonce + sealed

    def unwrap(self, sid: str, wrapped: bytes) -> bytes:
        if not wrapped.startswith(WRAP_VERSION):
            found = f"version {wrapped[0]}" if wrapped else "an empty value"
            raise HostError(
                f"session {sid}: wrapped key of format {found}, this ironclawd knows version "
                f"{WRAP_VERSION[0]} (wrapped by another ironclawd version)"
            )
        if len(wrapped) != 1 + NONCE_BYTES + 48:
            raise HostError(f"session {sid}: wrapped key of {len(wrapped)} bytes, expected "
                            f"{1 + NONCE_BYTES + 48}")  # fmt: skip
        nonce, sealed = wrapped[1 : 1 + NONCE_BYTES], wrapped[1 + NONCE_BYTES :]
        try:
            return AESGCM(self._wrapping_key()).decrypt(nonce, sealed, _aad(sid))
        except InvalidTag:
            raise HostError(
                f"session {sid}: wrapped key does not open with this master key"
            ) from None

    def fingerprint(self) -> str:
        """A short non-secret id of the key (for logs and doctor)."""
        return hmac.new(self._material(), b"ironclaw fingerprint", hashlib.sha256).hexdigest()[:16]

    def _wrapping_key(self) -> bytes:
        return self.derive("ironclaw session-key wrapping v1")

    def _material(self) -> bytearray:
        """The key itself, never an immutable copy of it (``bytes()`` made one per derive, which
        ``zero`` cannot reach); refused once zeroed: what is left then is 32 zero bytes, and a
        session key wrapped under those would open with a key anyone knows."""
        if self._zeroed:
            raise HostError(f"master key was zeroed (from {self.source}): the daemon is stopping")
        return self._key

    def zero(self) -> None:
        self._zeroed = True
        _zero(self._key)


def _aad(sid: str) -> bytes:
    return b"ironclaw session key\0" + sid.encode()


def _zero(buf: bytearray) -> None:
    """Overwrite a key in place (Python may still hold copies: best effort, documented)."""
    if buf:
        ctypes.memset((ctypes.c_char * len(buf)).from_buffer(buf), 0, len(buf))


def load_master_key(fallback: Path, protects: Sequence[Path] = ()) -> MasterKey:
    """From the systemd credential if the unit passed one, else the fallback file, made if
    missing, but only while none of ``protects`` (the files encrypted or keyed under it: the
    state DB, the audit log) exists: a new key would open none of them."""
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if creds:
        path = Path(creds) / CREDENTIAL_NAME
        if path.exists():
            return MasterKey(_read_key(path, check_owner=False), f"credential {CREDENTIAL_NAME}")
    if not os.path.lexists(fallback):
        made = next((p for p in protects if os.path.lexists(p)), None)
        if made is not None:
            passed = f"no credential {CREDENTIAL_NAME} is passed" + (
                f" (none in {creds})" if creds else "")  # fmt: skip
            raise HostError(
                f"master key {fallback} is missing, but {made} was made with it and {passed}: "
                "refusing to make a new key, which would open none of it. Put the key back "
                f"there or pass it as the systemd credential {CREDENTIAL_NAME} "
                "(docs/operations.md, Keys); to start afresh, move the state directory's "
                "files away first"
            )
    return MasterKey(_read_or_create(fallback), str(fallback))


def _read_key(path: Path, *, check_owner: bool) -> bytes:
    """The key file's bytes. Only a regular file, not through a symlink: O_NONBLOCK so that a
    FIFO put there is refused, not read (nor waited on: its open blocked the start)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise HostError(f"reading master key {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HostError(f"refusing master key {path}: not a regular file")
        if check_owner and (st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077):
            raise HostError(
                f"refusing master key {path}: must be owned by root with mode 0600 "
                f"(is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
            )
        data = os.read(fd, KEY_BYTES + 1)
    except OSError as exc:
        raise HostError(f"reading master key {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    return data


def _read_or_create(path: Path) -> bytes:
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # replace=False: if another process created it meanwhile, theirs is the key.
        atomic_write(path, secrets.token_bytes(KEY_BYTES), mode=0o600, replace=False)
    return _read_key(path, check_owner=True)


def new_session_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def write_tmpfs_key(path: Path, key: bytes, uid: int, gid: int) -> None:
    """Put an unwrapped session key where only that session's sandbox will see it: a 0400 file
    on a tmpfs (never a disk), owned by the sandbox's uid (gVisor checks host files against the
    agent's uid, ironclawd/bundle/spec.py)."""
    directory = path.parent
    _key_dir(directory)
    if not _on_tmpfs(directory):
        raise HostError(f"refusing to write a session key to {directory}: not a tmpfs")
    atomic_write(path, key.hex().encode(), mode=0o400, owner=(uid, gid), durable=False)


def write_tmpfs_key_in_place(path: Path, key: bytes, uid: int, gid: int) -> None:
    """Write a session key into the empty placeholder a pooled sandbox was started with
    (services/pool.py). Not a rename: the box has the file bind-mounted, and a bind mount of a
    file keeps the inode it was made with. Refuses anything but an empty regular file on a
    tmpfs owned by ``uid``."""
    if not _on_tmpfs(path.parent):
        raise HostError(f"refusing to write a session key to {path.parent}: not a tmpfs")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise HostError(f"writing session key {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != 0 or (st.st_uid, st.st_gid) != (uid, gid):
            raise HostError(f"refusing to write session key {path}: not the empty placeholder")
        data = key.hex().encode()
        if os.write(fd, data) != len(data):
            raise HostError(f"writing session key {path}: short write")
    except OSError as exc:
        raise HostError(f"writing session key {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def write_tmpfs_placeholder(path: Path, uid: int, gid: int) -> None:
    """An empty key file, the mount source of a pooled sandbox before any session owns it."""
    directory = path.parent
    _key_dir(directory)
    if not _on_tmpfs(directory):
        raise HostError(f"refusing to make a key file in {directory}: not a tmpfs")
    atomic_write(path, b"", mode=0o400, owner=(uid, gid), durable=False)


def _key_dir(directory: Path) -> None:
    """The keys directory as the daemon's own, 0700: made so, or an existing one narrowed to it.
    Each key file is the agent's uid's (0400), so this directory alone keeps a host account
    that has that uid from every session's key; tmpfiles.d makes it 0700 at boot only, and
    the daemon made it 0711 itself. A symlink or a directory of another owner is refused."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise HostError(f"refusing to keep session keys in {directory}: not a directory of "
                        f"its own ({exc.strerror})") from exc  # fmt: skip
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise HostError(f"refusing to keep session keys in {directory}: owned by uid "
                            f"{st.st_uid}, not this daemon's ({os.geteuid()})")  # fmt: skip
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def remove_tmpfs_key(path: Path) -> None:
    try:
        size = path.stat().st_size
        with open(path, "r+b", buffering=0) as f:  # overwrite before unlinking (tmpfs pages)
            f.write(b"\0" * size)
    except FileNotFoundError:
        return
    except OSError:
        pass
    path.unlink(missing_ok=True)


def _on_tmpfs(directory: Path) -> bool:
    """Whether ``directory`` lives on a tmpfs/ramfs (the longest mount prefix in mountinfo)."""
    best, fstype = "", ""
    target = str(directory.resolve())
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4]
            if (target == point or target.startswith(point.rstrip("/") + "/")) and len(
                point
            ) >= len(best):
                best, fstype = point, fields[fields.index("-") + 1]
    return fstype in ("tmpfs", "ramfs")
