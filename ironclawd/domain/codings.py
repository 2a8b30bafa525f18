"""HTTP content codings: every upstream the daemon reads (egress, remote MCP servers, model
providers) is asked for bodies as sent, and an answer in another coding is refused, so that the
caps count what is read, never what it unpacks to."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["IDENTITY", "content_encoding", "refused_coding"]

# The request header every upstream call sends.
IDENTITY = {"Accept-Encoding": "identity"}

# Codings named in a refusal; anything else an upstream puts there is not echoed (it is text the
# upstream chose, and a refusal may reach the agent or the journal).
_KNOWN_CODINGS = frozenset({"gzip", "x-gzip", "deflate", "br", "compress", "x-compress", "zstd"})


def content_encoding(headers: Iterable[tuple[str, str]]) -> str | None:
    """The response's content codings other than identity (comma-joined), or None."""
    codings = [
        c.strip().lower()
        for name, value in headers
        if name.lower() == "content-encoding"
        for c in value.split(",")
        if c.strip()
    ]
    other = [c for c in codings if c != "identity"]
    return ", ".join(other) if other else None


def refused_coding(headers: Iterable[tuple[str, str]]) -> str | None:
    """None for a body as sent; else its codings as a refusal names them ("gzip", "br, gzip",
    or "an unknown coding" when any is not a registered one)."""
    coding = content_encoding(headers)
    if coding is None:
        return None
    return coding if set(coding.split(", ")) <= _KNOWN_CODINGS else "an unknown coding"
