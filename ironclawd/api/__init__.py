"""api layer (see ARCHITECTURE.md §9)."""
