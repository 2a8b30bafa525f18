"""The audit record's own fields: what a caller's fields may not be named (the chain's)."""

from __future__ import annotations

from collections.abc import Mapping

from ironclawd.formats import audit as audit_format

# A caller's field of one of these names would replace the chain's own (a record numbered or
# linked by its payload, or read as of another format), so ``check_fields`` refuses it.
RESERVED = frozenset({"seq", "time", "event", "actor", "prev", "mac", audit_format.FIELD})


def check_fields(event: str, fields: Mapping[str, object]) -> None:
    """ValueError naming any field of ``fields`` that the record itself uses."""
    clash = RESERVED.intersection(fields)
    if clash:
        raise ValueError(
            f"audit record for {event}: field(s) {', '.join(sorted(clash))} are the chain's "
            "own; name them for what they are (e.g. reply_seq)"
        )
