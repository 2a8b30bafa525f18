"""The ``ironctl`` program. ``ironctl --version`` is answered here, before grpc and the command
modules are imported (they take ~0.15 s; ``python -X importtime`` shows it); everything else
goes to ``ironclawd.ctl.main``, whose parser also knows ``--version``."""

from __future__ import annotations

import sys

from ironclawd import __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        sys.stdout.write(f"ironctl {__version__}\n")
        return 0
    from ironclawd.ctl.main import main as run  # noqa: PLC0415 (lazy: see the docstring)

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
