"""The byte relay in front of the internal gRPC servers (ironclawd/api/splice.py), over real Unix
sockets: bytes the client sent before the splice took its connection arrive first and in order,
the server may speak first, large transfers both ways survive flow control, either side's EOF
ends both, and the internal server sees the abstract address the splice bound."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import SupportsIndex

from ironclawd.api.splice import splice_to

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Watched(asyncio.StreamReader):
    """A stream that says how much it was fed and whether its EOF came."""

    def __init__(self) -> None:
        super().__init__()
        self.fed = 0
        self.changed = asyncio.Event()
        self.eof = False

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        data = bytes(data)
        super().feed_data(data)
        self.fed += len(data)
        self.changed.set()

    def feed_eof(self) -> None:
        super().feed_eof()
        self.eof = True
        self.changed.set()

    async def until(self, fed: int, eof: bool) -> None:
        while self.fed < fed or (eof and not self.eof):
            self.changed.clear()
            await self.changed.wait()


async def _with_splice(
    tmp_path: Path,
    internal: Handler,
    body: Callable[..., Awaitable[None]],
    *,
    first: bytes = b"",
    held: bytes = b"",
    eof: bool = False,
) -> None:
    """``internal`` serves at a path; a front server splices each connection to it after
    reading ``first`` and letting ``held`` (and the client's EOF, with ``eof``) arrive in its
    stream; ``body(reader, writer)`` is the client."""
    path = tmp_path / "internal.sock"
    server = await asyncio.start_unix_server(internal, path=str(path))
    name = f"ironclaw-test-splice/{secrets.token_hex(8)}"
    spliced: list[asyncio.Task[None]] = []

    async def front(reader: _Watched, writer: asyncio.StreamWriter) -> None:
        got = await reader.readexactly(len(first)) if first else b""
        assert got == first
        # What follows reaches the stream's buffer before the splice takes the connection over.
        await reader.until(len(first) + len(held), eof)
        task = asyncio.current_task()
        assert task is not None
        spliced.append(task)
        await splice_to(path, name, reader, writer, first=got)

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    loop = asyncio.get_running_loop()
    front_reader = _Watched()
    transport, protocol = await loop.connect_accepted_socket(
        lambda: asyncio.StreamReaderProtocol(front_reader), sock=ours
    )
    front_writer = asyncio.StreamWriter(transport, protocol, front_reader, loop)
    front_task = asyncio.create_task(front(front_reader, front_writer))
    reader, writer = await asyncio.open_unix_connection(sock=theirs)
    try:
        await asyncio.wait_for(body(reader, writer), 30)
        await asyncio.wait_for(front_task, 30)  # the splice ends once both sides closed
    finally:
        writer.close()
        front_task.cancel()
        server.close()
        await server.wait_closed()
    assert spliced


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    writer.write(f"peer {sock.getpeername()!r}\n".encode())
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


def test_bytes_before_the_splice_arrive_first_and_the_server_sees_the_bound_address(
    tmp_path: Path,
) -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"PREFACE" + b"held bytes|")
        hello = await reader.readline()
        assert hello.startswith(b"peer "), hello
        assert b"ironclaw-test-splice/" in hello, hello
        writer.write(b"after")
        echoed = await reader.readexactly(len(b"PREFACEheld bytes|after"))
        assert echoed == b"PREFACEheld bytes|after"
        writer.write_eof()
        assert await reader.read() == b""

    asyncio.run(_with_splice(tmp_path, _echo, client, first=b"PREFACE", held=b"held bytes|"))


def test_large_transfers_both_ways_survive_flow_control(tmp_path: Path) -> None:
    payload = os.urandom(24 * 1024 * 1024)

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()

        async def send() -> None:
            view = memoryview(payload)
            for offset in range(0, len(payload), 1 << 20):
                writer.write(view[offset : offset + (1 << 20)])
                await writer.drain()

        sender = asyncio.create_task(send())
        digest, total = hashlib.sha256(), 0
        while total < len(payload):
            chunk = await reader.read(1 << 20)
            assert chunk, f"EOF after {total} bytes"
            digest.update(chunk)
            total += len(chunk)
            await asyncio.sleep(0)  # a slow reader: the relay must pause, not buffer it all
        await sender
        assert total == len(payload)
        assert digest.hexdigest() == hashlib.sha256(payload).hexdigest()
        writer.write_eof()
        assert await reader.read() == b""

    asyncio.run(_with_splice(tmp_path, _echo, client))


def test_the_server_closing_ends_the_client_connection(tmp_path: Path) -> None:
    async def goodbye(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"bye\n")
        writer.close()

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await reader.read() == b"bye\n"  # then EOF, without the client closing first

    asyncio.run(_with_splice(tmp_path, goodbye, client))


def test_an_eof_that_came_before_the_splice_still_reaches_the_server(tmp_path: Path) -> None:
    seen: list[bytes] = []

    async def collect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.read())  # returns only at EOF
        writer.close()

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"PREFACEall of it")
        writer.write_eof()
        assert await reader.read() == b""

    asyncio.run(
        _with_splice(tmp_path, collect, client, first=b"PREFACE", held=b"all of it", eof=True)
    )
    assert seen == [b"PREFACEall of it"]
