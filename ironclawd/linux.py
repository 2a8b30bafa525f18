"""The Linux system interface the host and store adapters share: one libc handle and the
flag values of linux/mount.h, linux/sched.h and linux/fs.h that they pass to it.

Kept here, below both adapters (which may not import each other), so that a flag has one value
in the tree. ``host/outbound_exec.py`` keeps its own few: it runs as ``python3 -I -S`` outside
the package, before runsc, and imports nothing of ironclawd.
"""

from __future__ import annotations

import ctypes
from typing import Final

# sched.h: unshare(2) and setns(2)
CLONE_FS: Final = 0x200
CLONE_NEWNS: Final = 0x20000
CLONE_NEWNET: Final = 0x40000000

# mount.h: mount(2) flags
MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
MS_NOEXEC: Final = 0x8
MS_BIND: Final = 0x1000
MS_REC: Final = 0x4000
MS_PRIVATE: Final = 1 << 18
MS_SHARED: Final = 1 << 20

# fs.h: umount2(2) flags
MNT_DETACH: Final = 0x2
UMOUNT_NOFOLLOW: Final = 0x8

libc: Final = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
