"""Entry point of the in-box agent; also the script PyInstaller freezes (packaging/build-agent).

Absolute import on purpose: when frozen, this file runs as ``__main__`` with no parent package.
"""

import os

# Before grpc is imported: its EventEngine client hands each read of a call from its own threads
# to the caller (a futex wake and an eventfd per event), and every such call is a trip through
# gVisor's sentry. The legacy client polls on the calling thread: about 20 fewer system calls per
# model call (docs/development.md). It notices a connection the host closed only when it next
# writes, so the agent drops its channels when the host restarts (agent/loop.py RESTARTED).
os.environ["GRPC_EXPERIMENTS"] = "-event_engine_client"

from agent.main import main  # after the environment above

raise SystemExit(main())
