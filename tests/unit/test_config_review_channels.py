"""``[[channels]]`` values that passed --check-config and could only fail once the channel ran,
and a missing key reported as a bad value of ``None`` (found by a review)."""

from __future__ import annotations

import json

import pytest

from ironclawd.config import parse_config
from ironclawd.errors import ConfigError


def _matrix(homeserver: str) -> str:
    return (
        f'[[channels]]\nname = "chat"\ntype = "matrix"\nhomeserver = {json.dumps(homeserver)}\n'
        'user_id = "@bot:example.org"\ntoken_credential = "matrix-bot"\n'
    )


@pytest.mark.parametrize(
    "homeserver",
    [
        "https://matrix.example.org:99999",
        "https://matrix.example.org:0",
        "https://matrix.example.org#room",
        "https://matrix.example.org?",
        "https://matrix example.org",
        "https://matrix.example.org\t",
    ],
)
def test_a_homeserver_the_client_cannot_reach_is_refused(homeserver: str) -> None:
    with pytest.raises(ConfigError, match=r"'channels\.chat\.homeserver': expected "):
        parse_config(_matrix(homeserver), "t.toml")


def test_a_homeserver_with_a_port_is_taken() -> None:
    (chat,) = parse_config(_matrix("https://matrix.example.org:8448/"), "t.toml").channels
    assert chat.homeserver == "https://matrix.example.org:8448"


@pytest.mark.parametrize(
    ("table", "key"),
    [('name = "chat"\n', "channels[0].type"), ('type = "matrix"\n', "channels[0].name")],
)
def test_a_missing_name_or_type_is_called_missing(table: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("[[channels]]\n" + table, "t.toml")
    message = str(caught.value)
    assert f"'{key}'" in message
    assert "missing" in message
    assert "None" not in message
