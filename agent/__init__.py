"""The in-box agent: frozen into a standalone executable, runs inside the sandbox."""

# Set before grpc is imported (agent/__main__.py does; so does anything that runs the agent's
# gRPC code elsewhere, e.g. benchmarks/egress.py): its EventEngine client hands each read of a
# call from its own threads to the caller (a futex wake and an eventfd per event), and every such
# call is a trip through gVisor's sentry. The legacy client polls on the calling thread: about
# 20 fewer system calls per model call (docs/development.md). It notices a connection the host
# closed only when it next writes, so the agent drops its channels when the host restarts
# (agent/loop.py RESTARTED).
GRPC_ENVIRONMENT = {"GRPC_EXPERIMENTS": "-event_engine_client"}
