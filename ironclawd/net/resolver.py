"""Name resolution with the host's resolver (getaddrinfo(3): /etc/hosts, then DNS per
nsswitch.conf). Called once per request; the broker validates every answer it returns."""

from __future__ import annotations

import asyncio
import socket

from ironclawd.errors import UpstreamFailed

MAX_ADDRESSES = 32


class SystemResolver:
    async def resolve(self, host: str, port: int) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except (socket.gaierror, UnicodeError) as exc:
            raise UpstreamFailed(f"resolving {host}: {exc}") from exc
        addresses: list[str] = []
        for _family, _type, _proto, _canon, sockaddr in infos:
            address = str(sockaddr[0])
            if address not in addresses:
                addresses.append(address)
        return addresses[:MAX_ADDRESSES]
