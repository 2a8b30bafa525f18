"""Argument checks for ironctl: numbers in range, finite timeouts, command lines that are text.

Each check fails as a usage error whose message names the argument, the accepted range and
what was given (made visible), so a script's mistake reads as one line, never a traceback.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

from ironclawd.ctl.text import visible

MAX_TIMEOUT = 86_400.0  # one day; a longer wait is a mistake, and gRPC deadlines must fit
MAX_SEQ = 2**63 - 1  # sequence numbers are int64 in the daemon's store
_SHOWN = 80  # characters of a rejected value echoed back
_MESSAGE = 1000  # characters of an error message printed


def shown(value: str) -> str:
    """A rejected value as the operator should read it: escapes visible, long values cut."""
    text = visible(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(value)} characters)"


def shown_message(message: str) -> str:
    """An error message to print: escapes visible, cut to a screenful (a 10 kB id echoed back
    by the daemon or by argparse must not flood the terminal)."""
    text = visible(message)
    return text if len(text) <= _MESSAGE else f"{text[:_MESSAGE]}... (cut)"


def names(value: str | None) -> list[str]:
    """A comma-separated list as a person types it (``--tools "read_file, write_file"``): each
    name stripped of spaces, empty ones dropped. Sent as typed, " write_file" was refused as an
    unknown tool whose leading space the error did not show (found by a review)."""
    return [name.strip() for name in (value or "").split(",") if name.strip()]


_CLIENT_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def client_id(value: str) -> str:
    """``send --client-id``: what the daemon takes (domain/messages.py CLIENT_ID_RE), checked
    before anything is sent."""
    if not 1 <= len(value) <= 64 or not set(value) <= _CLIENT_ID_CHARS:
        raise argparse.ArgumentTypeError(
            f"expected 1-64 characters of A-Z a-z 0-9 . _ : -, got {shown(value)!r}"
        )
    return value


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer from lo to hi inclusive."""

    def parse(value: str) -> int:
        try:
            number = int(value.strip(), 10)
        except ValueError:
            number = None
        if number is None or not lo <= number <= hi:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {lo} to {hi}, got '{shown(value)}'"
            )
        return number

    parse.__name__ = "integer"
    return parse


def timeout(value: str) -> float:
    """An argparse type: seconds to wait, finite, above zero and at most a day."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
        raise argparse.ArgumentTypeError(
            f"expected seconds, a number above 0 and at most {MAX_TIMEOUT:.0f}, "
            f"got '{shown(value)}'"
        )
    return seconds


def undecodable(argv: Sequence[str]) -> str | None:
    """Why argv is not text, or None. Bytes that are not UTF-8 reach Python as lone surrogates
    (surrogateescape); they can be neither sent to the daemon nor printed, so they are refused
    here, naming the argument, before anything else looks at them."""
    for position, arg in enumerate(argv, start=1):
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in arg):
            return f"argument {position} ('{shown(arg)}') is not valid UTF-8 text"
    return None
