"""Entry point of the in-box agent; also the script PyInstaller freezes (packaging/build-agent).

Absolute import on purpose: when frozen, this file runs as ``__main__`` with no parent package.
"""

from agent.main import main

raise SystemExit(main())
