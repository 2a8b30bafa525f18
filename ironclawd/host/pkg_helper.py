"""The package helper's entry point, run in its own unprivileged unit (host/pkg_runner.py).

``python -m ironclawd.host.pkg_helper STEP ...``:

- ``resolve NAME...``: the fake dpkg status (the base image's packages) on stdin; JSON of the
  candidates apt would install on stdout (host/pkg_apt.py).
- ``download NAME=VERSION...``: the ``.deb`` files apt fetched and checked, by one apt run, on
  stdout: a JSON line ``{"sizes": [...]}`` (in the order asked), then the files back to back.
- ``unpack``: a ``.deb`` on stdin; a checked, normalised tar of its data on stdout
  (host/pkg_unpack.py). Maintainer scripts are never read.

Exit 0 on success; 3 when the input is at fault (an unknown package), with the reason on
stderr; 2 on any other failure.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from ironclawd.errors import InvalidArgument, PolicyDenied
from ironclawd.host import pkg_apt, pkg_unpack

MAX_DEB_BYTES = 256 * 1024 * 1024
MAX_STATUS_BYTES = 1024 * 1024
REFUSED_EXIT = 3
FAILED_EXIT = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(
            "usage: pkg_helper resolve NAME... | download NAME=VERSION... | unpack", file=sys.stderr
        )
        return FAILED_EXIT
    step, rest = args[0], args[1:]
    try:
        with tempfile.TemporaryDirectory(prefix="ironclaw-pkg-") as tmp:
            _run(step, rest, Path(tmp))
    except (ValueError, InvalidArgument, PolicyDenied) as exc:  # the input is at fault
        print(f"{exc}", file=sys.stderr)
        return REFUSED_EXIT
    except Exception as exc:
        print(f"{step}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return FAILED_EXIT
    sys.stdout.buffer.flush()
    return 0


def _run(step: str, rest: list[str], tmp: Path) -> None:
    if step == "resolve":
        status = sys.stdin.buffer.read(MAX_STATUS_BYTES + 1)
        if len(status) > MAX_STATUS_BYTES:
            raise RuntimeError(f"status: more than {MAX_STATUS_BYTES} bytes")
        found = pkg_apt.resolve(rest, status.decode("utf-8"), tmp)
        sys.stdout.write(json.dumps(found, sort_keys=True))
        sys.stdout.flush()
    elif step == "download":
        wanted = [arg.partition("=") for arg in rest]
        if not wanted or any(not sep for _, sep, _ in wanted):
            raise RuntimeError("download: expected NAME=VERSION...")
        debs = pkg_apt.download_all([(name, version) for name, _, version in wanted], tmp)
        # One header line (each file's size, in the order asked), then the files back to back.
        sizes = [deb.stat().st_size for deb in debs]
        sys.stdout.buffer.write(json.dumps({"sizes": sizes}).encode() + b"\n")
        for deb in debs:
            with open(deb, "rb") as reader:
                shutil.copyfileobj(reader, sys.stdout.buffer, 1 << 20)
    elif step == "unpack":
        deb = tmp / "package.deb"
        with open(deb, "wb") as writer:
            copied = _copy_bounded(sys.stdin.buffer, writer, MAX_DEB_BYTES)
        if copied == 0:
            raise RuntimeError("unpack: no .deb on stdin")
        pkg_unpack.unpack(deb, sys.stdout.buffer)
    else:
        raise RuntimeError(f"unknown step {step!r} (expected resolve, download or unpack)")


def _copy_bounded(reader: BinaryIO, writer: BinaryIO, limit: int) -> int:
    total = 0
    while True:
        chunk = reader.read(1 << 20)
        if not chunk:
            return total
        total += len(chunk)
        if total > limit:
            raise RuntimeError(f"unpack: the .deb is larger than {limit} bytes")
        writer.write(chunk)


if __name__ == "__main__":
    sys.exit(main())
