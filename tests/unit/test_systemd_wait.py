"""host/systemd.py waits on its D-Bus connection with poll(2): past ~250 sessions the daemon
holds over 1024 descriptors, and select(2) refused a connection numbered above FD_SETSIZE
("filedescriptor out of range in select()"), so every session create failed there. The wait is
run here on a descriptor numbered above 1024 (a pipe's, moved up with dup2)."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator

import pytest

from ironclawd.host.systemd import _Bus

HIGH_FD = 1500


class _Empty:
    def is_empty(self) -> bool:
        return True


class FakeBus:
    """Only what ``_Bus.wait`` uses: the connection's descriptor and message processing."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.processed = 0

    def get_fd(self) -> int:
        return self.fd

    def process(self) -> _Empty:
        self.processed += 1
        return _Empty()


@pytest.fixture
def high_fd() -> Iterator[tuple[int, int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < HIGH_FD + 1:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard}: this test needs {HIGH_FD + 1}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH_FD + 1), hard))
    read, write = os.pipe()
    os.dup2(read, HIGH_FD)
    os.close(read)
    try:
        yield HIGH_FD, write
    finally:
        os.close(HIGH_FD)
        os.close(write)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_wait_on_a_descriptor_above_fd_setsize_times_out_cleanly(
    high_fd: tuple[int, int],
) -> None:
    fd, _write = high_fd
    bus = _Bus(FakeBus(fd))
    started = time.monotonic()
    assert bus.wait(lambda: False, started + 0.3) is False
    assert time.monotonic() - started >= 0.3


def test_a_wait_wakes_when_the_bus_has_data(high_fd: tuple[int, int]) -> None:
    fd, write = high_fd
    fake = FakeBus(fd)
    bus = _Bus(fake)
    os.write(write, b"x")  # readable at once: the wait processes again instead of sleeping
    assert bus.wait(lambda: fake.processed >= 3, time.monotonic() + 5) is True
