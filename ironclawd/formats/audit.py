"""The audit record's format version, shared by the daemon and ironctl. No I/O.

A record's ``format`` field says what its MAC and its link cover; a record without one is of
version 1, which is every record written so far (this version writes none). A later format
that changes what the MAC, the hash or the link covers writes its number there, inside what
its MAC covers, so the number cannot be changed without breaking the chain. An ironclawd that
finds a version it does not know at the end of the log refuses to append after it, and its
``audit verify`` stops there with a problem beginning with ``UNKNOWN``, not a tampering.
"""

from __future__ import annotations

from collections.abc import Mapping

FIELD = "format"
ABSENT = 1  # the version of a record without the field
KNOWN = (1,)
UNKNOWN = "unknown format version"  # how verify's problem begins for such a record


def version(record: Mapping[str, object]) -> object:
    """The record's format version as written (ABSENT if it has none): not always a number."""
    return record.get(FIELD, ABSENT)


def known(record: Mapping[str, object]) -> bool:
    found = version(record)
    return type(found) is int and found in KNOWN  # JSON true is not version 1


def known_text() -> str:
    return ", ".join(map(str, KNOWN))
