"""ctl layer (see docs/architecture.md §9)."""
