"""host/mountns.py's reading of mountinfo and what the namespace keeps. The namespace itself
and the wrapper's mount are shown on the real daemon (tests/integration/
test_outbound_namespace.py); the sandbox unit's real command line, with the clone on standard
input, and the wrapper's refusals in tests/integration/test_outbound_exec.py."""

from __future__ import annotations

import os

import pytest

from ironclawd.host import mountns

MOUNTINFO = (
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "23 22 0:21 / /proc rw,nosuid shared:2 - proc proc rw\n"
    "24 22 0:22 / /run rw,nosuid shared:3 - tmpfs tmpfs rw\n"
    "25 24 0:4 net:[4026532] /run/netns/x rw shared:4 - nsfs nsfs rw\n"
    "26 22 0:30 / /var rw shared:5 - ext4 /dev/vdb rw\n"
    "27 26 0:31 / /var/lib/ironclaw/queues/s1/outbound rw - tmpfs ironclaw-outbound rw\n"
    "28 22 0:32 / /mnt/with\\040space rw - tmpfs tmpfs rw\n"
    "29 22 0:33 / /var/lib/ironclaw/queues-other rw - tmpfs tmpfs rw\n"
)


def test_mount_points_are_read_with_their_escapes() -> None:
    points = mountns.mount_points(MOUNTINFO)
    assert points[0] == "/"
    assert "/mnt/with space" in points
    assert len(points) == 8


def test_the_namespace_keeps_only_the_way_to_the_queues_and_proc() -> None:
    drop = mountns.to_drop(mountns.mount_points(MOUNTINFO), "/var/lib/ironclaw/queues")
    # Deepest first: a mount goes before the one it sits on.
    assert drop == ["/var/lib/ironclaw/queues-other", "/run/netns/x", "/mnt/with space", "/run"]
    for kept in ("/", "/proc", "/var", "/var/lib/ironclaw/queues/s1/outbound"):
        assert kept not in drop


@pytest.mark.parametrize(
    ("listing", "cpus"),
    [("0-1\n", [0, 1]), ("0\n", [0]), ("0,2-4,7\n", [0, 2, 3, 4, 7])],
)
def test_online_cpus_reads_the_kernels_list_with_its_gaps(listing: str, cpus: list[int]) -> None:
    assert mountns.online_cpus(listing) == cpus


def test_online_cpus_falls_back_to_the_count_on_a_list_it_cannot_read() -> None:
    assert mountns.online_cpus("garbage") == list(range(os.cpu_count() or 1))
