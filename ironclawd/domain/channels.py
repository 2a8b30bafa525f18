"""Channels, wiring and permissions: pure values (docs/channels.md).

A channel is host infrastructure the operator configures (``[[channels]]`` in ironclawd.toml):
a Matrix homeserver login or a signed-webhook listener. Its credentials are named here, never
held.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHANNEL_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,31}")


@dataclass(frozen=True)
class WebhookEndpoint:
    name: str  # [a-z0-9][a-z0-9_-]{0,63}; URL path /hooks/<name>
    secret_credential: str  # credential holding the HMAC key (>= 32 bytes of text)


@dataclass(frozen=True)
class ChannelConfig:
    name: str  # CHANNEL_NAME_RE
    type: str  # "matrix" | "webhook"
    # matrix
    homeserver: str = ""  # https://… (http:// only for loopback)
    user_id: str = ""  # @bot:server
    token_credential: str = ""  # credential holding the bot's access token
    device_id: str = "IRONCLAW"
    # webhook
    listen: str = ""  # "127.0.0.1:8787" | "[::1]:8787" | "unix:/run/ironclaw/hooks.sock"
    endpoints: tuple[WebhookEndpoint, ...] = ()
    replay_window_seconds: float = 300.0
    # both
    max_message_bytes: int = 16384
    sender_messages_per_minute: int = 20
    channel_messages_per_minute: int = 600
