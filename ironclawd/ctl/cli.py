"""The ``ironctl`` program. ``ironctl --version`` is answered here, before grpc and the command
modules are imported (they take ~0.15 s; ``python -X importtime`` shows it); everything else
goes to ``ironclawd.ctl.main``, whose parser also knows ``--version``."""

from __future__ import annotations

import os
import sys

from ironclawd import __version__


def main(argv: list[str] | None = None) -> int:
    """The console script's entry (``argv`` None: the program itself, which ends here), or a
    caller's in-process run (tests), which gets the exit code back."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        sys.stdout.write(f"ironctl {__version__}\n")
        return 0
    from ironclawd.ctl.main import main as run  # noqa: PLC0415 (lazy: see the docstring)

    code = run(args)
    if argv is None:
        exit_now(code)
    return code


def exit_now(code: int) -> None:
    """End the process without the interpreter's finalization: unloading grpc and protobuf
    took ~12 ms of a ~70 ms ``ironctl status`` (issue 17), and there is nothing left to do.
    The command has returned, every call on the channel is over and the channel closed; ironctl
    keeps no file open for writing and registers no atexit work. Output is flushed first (a
    closed pipe was already handled by main: standard output then goes to /dev/null). Never
    returns. (Neither typing nor contextlib here: ``--version`` imports only this module.)"""
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 (contextlib.suppress: an import more on --version's path)
            stream.flush()
        except (OSError, ValueError):
            pass  # the reader is gone: nothing reaches it
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
