"""ctl layer (see ARCHITECTURE.md §9)."""
