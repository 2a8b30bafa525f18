"""The one check every upstream answer passes: bodies as sent, other codings refused by name."""

from __future__ import annotations

import pytest

from ironclawd.domain.codings import content_encoding, refused_coding


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], None),
        ([("Content-Encoding", "identity")], None),
        ([("content-encoding", " Identity , ")], None),
        ([("Content-Encoding", "gzip")], "gzip"),
        # Split over two header lines, or after identity: still a coding to refuse.
        ([("Content-Encoding", "identity"), ("Content-Encoding", "GZIP")], "gzip"),
        ([("Content-Encoding", "identity, br")], "br"),
        ([("Content-Encoding", "br, gzip")], "br, gzip"),
        # Text the upstream chose is never echoed.
        ([("Content-Encoding", "\x1b[31mevil")], "an unknown coding"),
        ([("Content-Encoding", "gzip, x-mine")], "an unknown coding"),
    ],
)
def test_refused_coding(headers: list[tuple[str, str]], expected: str | None) -> None:
    assert refused_coding(headers) == expected


def test_content_encoding_keeps_unknown_names() -> None:
    assert content_encoding([("Content-Encoding", "gzip, x-mine")]) == "gzip, x-mine"
