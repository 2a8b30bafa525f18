"""bundle layer (see ARCHITECTURE.md §9)."""
