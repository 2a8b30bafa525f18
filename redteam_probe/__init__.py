"""Test-only red-team probe, frozen separately from the agent (never shipped)."""
