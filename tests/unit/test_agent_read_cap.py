"""``read_file`` (agent/tools.py) returns at most ``MAX_RESULT_CHARS`` of a file, marked as
``http_fetch`` marks its cut. It returned up to 1 MiB, and the model proxy refuses a message
over 256 Ki characters (ironclawd/domain/model.py MAX_TEXT): reading a text file of 256 KiB to
1 MiB failed the whole turn with "[the model is unavailable (invalid_argument): ...]"."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import tools
from ironclawd.domain.model import MAX_TEXT, Message, check_messages

KIB = 1024


@pytest.mark.parametrize(
    ("body", "size"),
    [("a", 300 * KIB), ("é", 200 * KIB), ("\u20ac", tools.MAX_FILE_BYTES // 3)],
)
def test_a_large_file_is_cut_and_marked_and_the_proxy_takes_it(
    tmp_path: Path, body: str, size: int
) -> None:
    text = body * size  # 300 KiB of ASCII; 400 KiB and 1 MiB of 2- and 3-byte characters
    (tmp_path / "big.txt").write_text(text, encoding="utf-8")
    got = tools.read_file({"path": "big.txt"}, tmp_path, tmp_path)
    check_messages([Message(role="tool", text=got, tool_call_id="c1")])  # no InvalidArgument
    assert len(got) < MAX_TEXT // 2  # room for the rest of the turn's request
    cut = tools.MAX_RESULT_CHARS
    assert got == text[:cut] + f"\n[... {len(text) - cut} more characters]"


def test_a_file_within_the_cap_is_read_whole(tmp_path: Path) -> None:
    text = "b" * tools.MAX_RESULT_CHARS
    (tmp_path / "whole.txt").write_text(text)
    assert tools.read_file({"path": "whole.txt"}, tmp_path, tmp_path) == text
