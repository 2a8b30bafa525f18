"""Entry point of the in-box agent; also the script PyInstaller freezes (packaging/build-agent).

Absolute import on purpose: when frozen, this file runs as ``__main__`` with no parent package.
"""

import os

from agent import GRPC_ENVIRONMENT

os.environ.update(GRPC_ENVIRONMENT)  # before grpc is imported: see agent/__init__.py

from agent.main import main  # after the environment above

raise SystemExit(main())
