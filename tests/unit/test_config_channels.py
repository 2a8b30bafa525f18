"""``[[channels]]``: each table checked against the keys of its type; every refusal names the
key and what was expected (ironclawd/config_channels.py)."""

from __future__ import annotations

import pytest

from ironclawd.config import parse_config
from ironclawd.domain.channels import WebhookEndpoint
from ironclawd.errors import ConfigError

WEBHOOK = """
[[channels]]
name = "hooks"
type = "webhook"
listen = "127.0.0.1:8787"
endpoints = [{name = "github", secret_credential = "hook-github"}]
"""
MATRIX = """
[[channels]]
name = "chat"
type = "matrix"
homeserver = "https://matrix.example.org"
user_id = "@bot:example.org"
token_credential = "matrix-bot"
"""


def test_both_kinds_parse() -> None:
    config = parse_config(WEBHOOK + MATRIX, "t")
    hooks, chat = config.channels
    assert (hooks.name, hooks.type, hooks.listen) == ("hooks", "webhook", "127.0.0.1:8787")
    assert hooks.endpoints == (WebhookEndpoint("github", "hook-github"),)
    assert (chat.type, chat.homeserver, chat.user_id) == (
        "matrix", "https://matrix.example.org", "@bot:example.org",
    )  # fmt: skip
    assert chat.device_id == "IRONCLAW"
    assert parse_config("", "t").channels == ()


@pytest.mark.parametrize(
    "listen", ["[::1]:8787", "unix:/run/ironclaw/hooks.sock", "0.0.0.0:443", "10.1.2.3:1"]
)
def test_listen_forms(listen: str) -> None:
    text = WEBHOOK.replace("127.0.0.1:8787", listen)
    assert parse_config(text, "t").channels[0].listen == listen


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (WEBHOOK.replace("127.0.0.1:8787", "localhost:8787"), ["channels.hooks.listen", "IP"]),
        (WEBHOOK.replace("127.0.0.1:8787", "127.0.0.1:99999"), ["channels.hooks.listen", "port"]),
        (WEBHOOK.replace("127.0.0.1:8787", "unix:run/x.sock"), ["channels.hooks.listen"]),
        (WEBHOOK.replace('"hooks"', '"Hooks"'), ["channels[0].name", "[a-z]"]),
        (WEBHOOK.replace('"webhook"', '"irc"'), ["channels[0].type", "'matrix', 'webhook'"]),
        (WEBHOOK.replace('"hooks"', '"user"'), ["channels[0].name", "other than 'user'"]),
        (WEBHOOK.replace('"hooks"', '"group"'), ["channels[0].name", "host identities"]),
        (WEBHOOK + WEBHOOK, ["'hooks' is used twice"]),
        (WEBHOOK.replace('name = "github"', 'name = "../x"'), ["channels.hooks.endpoints"]),
        (WEBHOOK.replace("}]", '}, {name = "github", secret_credential = "b"}]'),
         ["channels.hooks.endpoints", "'github' twice"]),
        # A signature does not cover the endpoint: one key each (stop 47's review).
        (WEBHOOK.replace("}]", '}, {name = "gitlab", secret_credential = "hook-github"}]'),
         ["channels.hooks.endpoints", "'hook-github' twice", "a key of its own"]),
        (WEBHOOK + WEBHOOK.replace('"hooks"', '"more"').replace("8787", "8788"),
         ["channels.more.endpoints", "'hook-github' is also an endpoint's key on channel "
          "'hooks'"]),
        (WEBHOOK.replace("hook-github", "../etc/shadow"), ["channels.hooks.endpoints",
                                                           "credential"]),
        (WEBHOOK.replace("endpoints = [", "x = 1\nendpoints = ["), ["'channels.hooks.x'"]),
        (WEBHOOK + 'homeserver = "https://a.b"\n', ["channels.hooks.homeserver",
                                                     "a key of matrix channels"]),
        (MATRIX.replace("https://matrix.example.org", "http://matrix.example.org"),
         ["channels.chat.homeserver", "loopback"]),
        (MATRIX.replace("https://matrix.example.org", "https://u:p@matrix.example.org"),
         ["channels.chat.homeserver"]),
        (MATRIX.replace("@bot:example.org", "bot"), ["channels.chat.user_id"]),
        (MATRIX.replace('token_credential = "matrix-bot"\n', ""), ["needs token_credential"]),
        (MATRIX + "max_message_bytes = 0\n", ["channels.chat.max_message_bytes"]),
        (MATRIX + 'listen = "127.0.0.1:1"\n', ["channels.chat.listen", "webhook"]),
        ("[channels]\nname = 'x'\n", ["array of tables"]),
    ],
)  # fmt: skip
def test_refusals_name_the_key(text: str, names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "/etc/ironclaw/ironclawd.toml")
    for name in names:
        assert name in str(info.value)


def test_http_homeserver_only_on_loopback() -> None:
    text = MATRIX.replace("https://matrix.example.org", "http://127.0.0.1:8008")
    assert parse_config(text, "t").channels[0].homeserver == "http://127.0.0.1:8008"
