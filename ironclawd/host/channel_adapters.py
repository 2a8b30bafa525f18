"""The channel adapters by type, each imported when a ``[[channels]]`` table of its type is
configured: matrix-nio and aiohttp cost ~0.2 s of the daemon's start-up (issue 17), and most
hosts configure neither."""

from __future__ import annotations

from collections.abc import Callable

from ironclawd.domain.channels import ChannelConfig
from ironclawd.ports import Clock
from ironclawd.ports.channels import ChannelAdapter, WebhookSender


def matrix_channel(
    config: ChannelConfig, secret: Callable[[str], str], clock: Clock
) -> ChannelAdapter:
    from ironclawd.host.matrix import MatrixChannel  # noqa: PLC0415 (see the module's doc)

    return MatrixChannel(config, secret, clock)


def webhook_channel(
    config: ChannelConfig, secret: Callable[[str], str], clock: Clock, deliver: WebhookSender
) -> ChannelAdapter:
    from ironclawd.host.webhook import WebhookChannel  # noqa: PLC0415 (see the module's doc)

    return WebhookChannel(config, secret, clock, deliver)
