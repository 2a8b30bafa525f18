"""services layer (see ARCHITECTURE.md §9)."""
