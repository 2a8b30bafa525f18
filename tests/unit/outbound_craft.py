"""Hostile outbound.db files, built page by page as real SQLCipher 4 files under a session key.

The sandboxed agent writes outbound.db and the daemon reads a private copy of it
(store/outbound.py), so the agent can hand the daemon any bytes at all, including b-trees no
SQLite would ever write. A review showed two that hurt: a schema table whose pages all point at
one another (a 32 KiB file whose scan never ends) and rows whose bodies share one chain of
overflow pages (a file of about a megabyte read as 1 GiB of replies). Tests need the same
files, encrypted exactly as the agent's SQLCipher would encrypt them, or the daemon would refuse
them for the wrong reason (a page that does not decrypt) before the attack is ever tried.

The files follow the SQLite file format (https://www.sqlite.org/fileformat2.html) with
SQLCipher 4's defaults for a raw key (https://www.zetetic.net/sqlcipher/design/): 4096-byte
pages, each ending in 80 reserved bytes (a 16-byte IV and an HMAC-SHA512); AES-256-CBC under
the key itself; the HMAC key derived from it by PBKDF2-HMAC-SHA512 (2 rounds) over the file's
salt XOR 0x3a; the salt in the first 16 bytes of page 1, which are not encrypted.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from ironclawd.store.outbound import OUTBOUND_SCHEMA

PAGE = 4096
RESERVE = 80  # IV (16) + HMAC-SHA512 (64), at the end of every page
USABLE = PAGE - RESERVE  # what SQLite may use of a page
TABLE_LEAF, TABLE_INTERIOR = 0x0D, 0x05
# How much of a row's payload a leaf cell keeps when the rest overflows (fileformat2 §1.6).
MAX_LOCAL = USABLE - 35
MIN_LOCAL = (USABLE - 12) * 32 // 255 - 23
OVERFLOW_CONTENT = USABLE - 4  # an overflow page: the next page's number, then content


def varint(value: int) -> bytes:
    """SQLite's big-endian varint, for values below 2**56 (all these files need)."""
    assert 0 <= value < 1 << 56
    out = [value & 0x7F]
    value >>= 7
    while value:
        out.insert(0, value & 0x7F | 0x80)
        value >>= 7
    return bytes(out)


def record(*values: int | float | str | None) -> bytes:
    """A row's payload: a header of serial types, then the values (small ints only)."""
    types, body = b"", b""
    for value in values:
        if value is None:
            types += varint(0)
        elif isinstance(value, int):
            types, body = types + varint(1), body + struct.pack(">b", value)
        elif isinstance(value, float):
            types, body = types + varint(7), body + struct.pack(">d", value)
        else:
            text = value.encode()
            types, body = types + varint(2 * len(text) + 13), body + text
    assert len(types) < 127  # then the header's own size is one byte
    return varint(len(types) + 1) + types + body


def btree_page(kind: int, cells: list[bytes], right: int = 0, *, page_one: bool = False) -> bytes:
    """A table b-tree page holding ``cells`` (packed from the end of the usable area); an
    interior page's rightmost child is ``right``. Page 1 begins with the file header, which
    ``encrypt`` fills in."""
    start = 100 if page_one else 0
    header_size = 12 if kind == TABLE_INTERIOR else 8
    page = bytearray(PAGE)
    end, pointers = USABLE, b""
    for cell in cells:
        end -= len(cell)
        page[end : end + len(cell)] = cell
        pointers += struct.pack(">H", end)
    assert start + header_size + len(pointers) <= end, "the cells do not fit in one page"
    # kind, first freeblock, cell count, start of the cell area, fragmented bytes
    page[start : start + 8] = struct.pack(">BHHHB", kind, 0, len(cells), end, 0)
    if kind == TABLE_INTERIOR:
        page[start + 8 : start + 12] = struct.pack(">I", right)
    page[start + header_size : start + header_size + len(pointers)] = pointers
    return bytes(page)


def file_header(pages: int) -> bytes:
    """The 100-byte header of a file of ``pages`` pages, as SQLite 3 with SQLCipher writes it
    (user_version 1, as the agent's queue code sets it)."""
    return struct.pack(
        ">16sHBBBBBBIIIIIIIIIIII20sII",
        b"SQLite format 3\0", PAGE, 1, 1, RESERVE, 64, 32, 32,
        1, pages, 0, 0,  # change counter, size in pages, no freelist
        1, 4, 0, 0, 1, 1, 0, 0,  # schema cookie, format 4, no auto-vacuum, UTF-8, user_version
        b"", 1, 3_045_000,  # valid-for = the change counter (so the size holds), SQLite version
    )  # fmt: skip


def encrypt(pages: list[bytes], key: bytes) -> bytes:
    """The file SQLCipher 4 makes of these plaintext pages under ``key``, with a new salt."""
    salt = os.urandom(16)
    mac_key = hashlib.pbkdf2_hmac("sha512", key, bytes(b ^ 0x3A for b in salt), 2, 32)
    out = bytearray()
    for number, page in enumerate(pages, start=1):
        plain = file_header(len(pages)) + page[100:] if number == 1 else page
        skip = 16 if number == 1 else 0  # where page 1 holds the salt instead
        iv = os.urandom(16)
        encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
        sealed = encryptor.update(plain[skip:USABLE]) + encryptor.finalize()
        mac = hmac.new(mac_key, sealed + iv + struct.pack("<I", number), hashlib.sha512)
        out += (salt if number == 1 else b"") + sealed + iv + mac.digest()
    return bytes(out)


def schema_cell() -> bytes:
    """sqlite_master's one row (rowid 1): the messages table, its root on page 2."""
    payload = record("table", "messages", "messages", 2, OUTBOUND_SCHEMA)
    return varint(len(payload)) + varint(1) + payload


def dag_schema(key: bytes, fanout: int, levels: int) -> bytes:
    """A file whose schema table (sqlite_master) is a DAG: page 1 and ``levels`` - 1 interior
    pages under it each point ``fanout`` cells and their right child all at the next one, and
    the last points at one leaf with the genuine schema row. A scan of the schema, which SQLite
    makes before the first statement, visits that leaf (fanout + 1) ** levels times; with
    fanout 0 it is an honest file with an empty messages table. The file is levels + 2 pages:
    1, the messages table's empty leaf on page 2, the other interior pages, the schema leaf."""
    chain = [1, *range(3, levels + 2)]
    leaf = levels + 2
    pages = [b""] * leaf
    for at, number in enumerate(chain):
        child = chain[at + 1] if at + 1 < len(chain) else leaf
        cells = [struct.pack(">I", child) + varint(1)] * fanout
        pages[number - 1] = btree_page(TABLE_INTERIOR, cells, child, page_one=number == 1)
    pages[1] = btree_page(TABLE_LEAF, [])
    pages[leaf - 1] = btree_page(TABLE_LEAF, [schema_cell()])
    return encrypt(pages, key)


def shared_overflow(key: bytes, rows: int, body_bytes: int) -> bytes:
    """A file of ``rows`` rows (seq 1.., in reply to 1) whose bodies are the same text of about
    ``body_bytes`` bytes, all in one chain of overflow pages that every row's cell points at:
    the file holds the body once, a read returns it ``rows`` times. With one row it is an
    honest file. The body is shortened (by under two pages) so that its payload past what a cell
    keeps fills whole overflow pages: each cell then keeps only MIN_LOCAL bytes, and several
    fit on a leaf page."""
    length = body_bytes
    while excess := (len(record(None, 1, 1.0, "A" * length)) - MIN_LOCAL) % OVERFLOW_CONTENT:
        length -= excess  # again if the body's serial type got a byte shorter
    payload = record(None, 1, 1.0, "A" * length)
    assert len(payload) > MAX_LOCAL
    local, rest = payload[:MIN_LOCAL], payload[MIN_LOCAL:]
    chunks = [rest[at : at + OVERFLOW_CONTENT] for at in range(0, len(rest), OVERFLOW_CONTENT)]
    # A cell: the payload's size, the rowid, MIN_LOCAL bytes and the first overflow page's
    # number; and its 2-byte pointer in the page's header.
    per_leaf = (USABLE - 8) // (len(varint(len(payload))) + len(varint(rows)) + MIN_LOCAL + 6)
    leaves = [range(seq, min(seq + per_leaf, rows + 1)) for seq in range(1, rows + 1, per_leaf)]
    # Page 1 the schema, page 2 the messages table's root (the one leaf itself, or an interior
    # page over the leaves: SQLite takes no interior root without cells), then the leaves, then
    # the overflow chain.
    first = 2 if len(leaves) == 1 else 3
    overflow = first + len(leaves)
    pages = [btree_page(TABLE_LEAF, [schema_cell()], page_one=True)]
    if len(leaves) > 1:
        children = [
            struct.pack(">I", first + at) + varint(leaf[-1]) for at, leaf in enumerate(leaves)
        ]
        pages.append(btree_page(TABLE_INTERIOR, children[:-1], overflow - 1))
    for leaf in leaves:
        cells = [
            varint(len(payload)) + varint(seq) + local + struct.pack(">I", overflow) for seq in leaf
        ]
        pages.append(btree_page(TABLE_LEAF, cells))
    for at, chunk in enumerate(chunks):
        after = overflow + at + 1 if at + 1 < len(chunks) else 0
        pages.append((struct.pack(">I", after) + chunk).ljust(PAGE, b"\0"))
    return encrypt(pages, key)


def looping_schema(key: bytes, claimed: int) -> bytes:
    """A 3-page file whose one schema row claims an SQL text of ``claimed`` bytes: the row's
    cell keeps what fits, then names page 3, an overflow page whose next page is itself. SQLite
    builds the text in one step of its VM, page after page (the same one) until ``claimed``
    bytes, unless its string length limit stops it first."""
    sql = (OUTBOUND_SCHEMA + " " * 8000).encode()  # the genuine text, then what page 3 repeats
    serials = [2 * 5 + 13, 2 * 8 + 13, 2 * 8 + 13, 1, 2 * claimed + 13]  # text x3, int8, text
    types = b"".join(varint(serial) for serial in serials)
    head = varint(len(types) + 1) + types + b"table" + b"messages" + b"messages" + b"\x02"
    size = len(head) + claimed
    keep = MIN_LOCAL + (size - MIN_LOCAL) % OVERFLOW_CONTENT
    local = keep if keep <= MAX_LOCAL else MIN_LOCAL
    cell = varint(size) + varint(1) + (head + sql)[:local] + struct.pack(">I", 3)
    loop = (struct.pack(">I", 3) + b" " * OVERFLOW_CONTENT).ljust(PAGE, b"\0")
    pages = [btree_page(TABLE_LEAF, [cell], page_one=True), btree_page(TABLE_LEAF, []), loop]
    return encrypt(pages, key)
